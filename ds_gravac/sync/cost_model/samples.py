"""Timings a finished step leaves behind, as samples for the online refit (rank-local until agreed).

* Encode: the sent level's encode time of each compressed bucket (one call per member or partition).
* Decode: the time of the bucket's final decode (``Exchange.result``); an all-gather decodes every rank's row.
* Collectives (every pipeline chunk's collective is a sample of its own size): ``completion − max(launch,
  completion of the previous collective on the same channel)``, taken only from collectives that were still
  running when waited for — only then is their completion time known
  (one that finished during backward is seen complete at some later moment, which says nothing).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from .fits import Sample, decode_key, encode_key

if TYPE_CHECKING:
    from ..collectives import Work
    from ..exchange.base import Codec, Exchange
    from ..running_step import RunningStep


def codec_samples(run: "RunningStep", codecs: "dict[int, Codec]", own_exchange: str, world_size: int
                  ) -> Iterator[tuple[str, Sample]]:
    """``(name, sample)`` for the encode and decode of every compressed bucket sent at a single level."""
    for b, action in enumerate(run.plan.actions):
        if not action.compressed or b not in codecs:
            continue
        plans = codecs[b].plans(action.levels)
        levels = {p.level for p in plans}
        if len(levels) != 1:
            continue                              # per-tensor levels: no single fit to attribute it to
        level = levels.pop()
        calls, numel = float(len(plans)), float(sum(p.numel for p in plans))
        if b in run.encode_s:
            yield encode_key(level), (calls, numel, run.encode_s[b])
        if b in run.decode_s:
            rows = world_size if (action.exchange or own_exchange) == "allgather" else 1
            yield decode_key(level), (rows * calls, rows * numel, run.decode_s[b])


def collective_samples(exchanges: "dict[int, Exchange]") -> Iterator[tuple[str, Sample]]:
    """``(kind, sample)`` of every data collective whose end was observed (see the module docstring)."""
    per_channel: dict[int, list["Work"]] = {}
    for ex in exchanges.values():
        for r, work in ex.channel_works():
            if work.kind:
                per_channel.setdefault(r, []).append(work)
    for works in per_channel.values():
        prev_end = float("-inf")
        for w in sorted(works, key=lambda w: w.launch_t):
            if w.finish_t is None:
                continue
            if w.blocked:
                yield w.kind, (1.0, float(w.nbytes), w.finish_t - max(w.launch_t, prev_end))
            prev_end = w.finish_t
