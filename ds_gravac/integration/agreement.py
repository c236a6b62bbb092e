"""Attach-time agreement: everything that will select a collective is compared across ranks before the first
one is issued, and a mismatch is a clear error on every rank (naming what differs), never a hang or a raw gloo
size error.

* the parameter list (names, shapes, dtypes, ``requires_grad``): it fixes the bucket plan, hence every payload
  size. ``ds_gravac.initialize`` checks it even before DeepSpeed's own parameter broadcast, which would otherwise
  abort with a gloo size mismatch or hang on an extra parameter, and let a parameter frozen on one rank only
  through;
* the ``"gravac"`` section key by key, with the compressor class, the package version and the world size;
* per-rank facts that must hold everywhere, e.g. that the telemetry file could be created.

The checks are one MIN/MAX all-reduce of hashes; only on a mismatch are the details gathered to write the
message.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Optional, Sequence

import torch

from ..compress.base import stable_hash
from ..errors import GravacConfigError, GravacError


def _min_max(values: Sequence[int], group: Any) -> tuple[list[int], list[int]]:
    from ..sync.collectives import agree_min_max
    lo, hi = agree_min_max(torch.tensor(list(values), dtype=torch.int64), group)
    return [int(v) for v in lo.tolist()], [int(v) for v in hi.tolist()]


def _gather(obj: Any, group: Any) -> list[Any]:
    import deepspeed.comm as dist
    out: list[Any] = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(out, obj, group=group)
    return out


def parameter_descriptors(named_params: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, str, str, bool]]:
    return [(name, str(tuple(p.shape)), str(p.dtype).replace("torch.", ""), bool(p.requires_grad))
            for name, p in named_params]


def agree_parameters(named_params: Iterable[tuple[str, torch.Tensor]], group: Any = None) -> None:
    """Raise :class:`GravacError` on every rank when the ranks' models differ (extra, missing, reshaped, recast
    or differently frozen parameters)."""
    desc = parameter_descriptors(named_params)
    lo, hi = _min_max([stable_hash(json.dumps(desc))], group)
    if lo == hi:
        return
    everyone = _gather(desc, group)
    raise GravacError("ds_gravac: the model's parameters differ across ranks, so the gradients cannot be "
                      "exchanged: " + describe_parameter_difference(everyone))


def describe_parameter_difference(per_rank: Sequence[Sequence[Sequence[Any]]]) -> str:
    """The first differences between rank 0's parameter list and the others', in words."""
    ref = {d[0]: tuple(d[1:]) for d in per_rank[0]}
    notes: list[str] = []
    for rank, desc in enumerate(per_rank[1:], start=1):
        mine = {d[0]: tuple(d[1:]) for d in desc}
        for name in mine.keys() - ref.keys():
            notes.append(f"rank {rank} has '{name}', rank 0 does not")
        for name in ref.keys() - mine.keys():
            notes.append(f"rank 0 has '{name}', rank {rank} does not")
        for name in ref.keys() & mine.keys():
            if ref[name] != mine[name]:
                (s0, d0, g0), (s1, d1, g1) = ref[name], mine[name]
                what = [f"shape {s0} vs {s1}" if s0 != s1 else "", f"dtype {d0} vs {d1}" if d0 != d1 else "",
                        f"requires_grad {g0} vs {g1}" if g0 != g1 else ""]
                notes.append(f"'{name}' on rank 0 vs rank {rank}: " + ", ".join(w for w in what if w))
        if not notes and [d[0] for d in desc] != [d[0] for d in per_rank[0]]:
            notes.append(f"rank {rank} registers the same parameters in a different order")
    return "; ".join(sorted(notes)[:6]) + (" (and more)" if len(notes) > 6 else "")


def agree_config(normalized: dict[str, Any], extras: dict[str, Any], group: Any) -> None:
    """Raise :class:`GravacConfigError` naming every top-level key of the ``"gravac"`` section (or extra fact:
    compressor class, package version, world size) whose value differs across ranks."""
    items = sorted(normalized.items()) + sorted(extras.items())
    lo, hi = _min_max([stable_hash(json.dumps(v, sort_keys=True, default=str)) for _, v in items], group)
    differing = [key for (key, _), a, b in zip(items, lo, hi) if a != b]
    if differing:
        raise GravacConfigError("ds_gravac: the 'gravac' config differs across ranks in: " + ", ".join(differing)
                                + " (every rank must attach with the same section and package version)")


def agree_ok(problem: Optional[str], group: Any) -> None:
    """Every rank reports a local problem (or None); if any rank has one, every rank raises it."""
    flag = 1 if problem else 0
    lo, hi = _min_max([flag], group)
    if hi[0] == 0:
        return
    problems = _gather(problem, group)
    raise GravacConfigError("; ".join(f"rank {r}: {p}" for r, p in enumerate(problems) if p))
