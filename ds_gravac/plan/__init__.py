"""``python -m ds_gravac.plan CONFIG.json --model NAME``: what attach would do with a config, without training —
every bucket's compressor, level and bytes against dense, the cost model's predicted exchange on a nominal link,
and every refusal attach would raise (exit status 2)."""
