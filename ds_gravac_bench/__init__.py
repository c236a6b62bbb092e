"""ds_gravac_bench: the benchmark tools of the ds_gravac repository, not part of the ds_gravac library. ``micro``
times every compressor against one memory pass (``python -m ds_gravac_bench.micro``); ``e2e`` runs DeepSpeed,
ds_gravac, DDP and PowerSGD on the same model, data and network and writes the comparison (``python -m
ds_gravac_bench.e2e``, with ``report``/``systems`` behind it); ``cluster`` and ``netns`` emulate a multi-node
cluster on one machine with network namespaces and rate-limited links (``python -m ds_gravac_bench.cluster``, root
needed); ``convergence_sim`` replays training with the update rules written out, without ds_gravac, as an
independent check; ``fidelity`` and ``fidelity_seeds`` compare learning per step and time to dense's accuracy; ``keep``
writes the compact result files ``docs/bench`` holds. Raw runs go to ``runs/`` (git-ignored). The training itself
is done by the scripts in ``runners/``.
"""
