"""What one step of a system sends at N ranks, from the synchronizer's own planner (no process group).

For every bucket of the bucket plan the synchronizer would build for the model (25 MiB buckets, reverse
registration order, as before the first step froze it): when it is ready (``ready``: the fraction of backward
done when its last gradient is, ``scale_overlap``; DeepSpeed's dense path all-reduces after backward, 1.0), its
exchange at N (``exchange_name``: the quantizers'
``"auto"`` all-gather at two ranks, CaSync-PS above; ``"dense"`` where the planner's own selector sends it dense,
e.g. an all-gather that would move more bytes than the ring), its elements, its first-round payload words per rank
(all N partitions of a quantizer's bucket) and its second-round words (two-round low rank). DeepSpeed's own dense
path is one all-reduce of every gradient (its 500M-element buffer).
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, Optional

import torch

from .scale_overlap import BackwardProfile, backward_profile

Bucket = dict[str, Any]          # {"exchange", "numel", "words1", "words2", "calls", "ready"}
IMAGE = (2, 3, 32, 32)           # the runners' CIFAR-shaped input (FLOP fractions do not depend on the batch)


def model_params(model: str) -> list[tuple[str, torch.nn.Parameter]]:
    """The runner model's named parameters, on the meta device (shapes only)."""
    from runners.models import build_model

    with torch.device("meta"):
        net = build_model(model, num_classes=10)
    return [(n, p) for n, p in net.named_parameters() if p.requires_grad and p.numel() > 0]


@functools.lru_cache(maxsize=4)
def profile(model: str) -> BackwardProfile:
    """The model's backward readiness (``scale_overlap``), on the meta device."""
    from runners.models import build_model

    if model == "lstm":              # not an image model: no profile, every bucket counts as ready at the end
        return BackwardProfile(ready={}, share=0.0)
    with torch.device("meta"):
        return backward_profile(build_model(model, num_classes=10), torch.empty(IMAGE))


def deepspeed_dense(params: list[tuple[str, torch.nn.Parameter]]) -> list[Bucket]:
    numel = sum(p.numel() for _, p in params)
    return [{"exchange": "dense", "numel": numel, "words1": numel, "words2": 0, "calls": 1, "ready": 1.0}]


def gravac_buckets(params: list[tuple[str, torch.nn.Parameter]], section: dict[str, Any], n: int,
                   ready: Optional[dict[str, float]] = None) -> list[Bucket]:
    """The buckets of a ``"gravac"`` section at N ranks, at the level a static run sends
    (``static_default_level``, else ``cf``)."""
    from ds_gravac.config import parse_config
    from ds_gravac.integration.build import build_compressor, static_default_level
    from ds_gravac.sync.buckets import BucketPlan, classify
    from ds_gravac.sync.exchange import PATTERNS, exchange_name
    from ds_gravac.sync.memory import ErrorFeedbackMemory
    from ds_gravac.sync.planner import Planner

    from .micro_rank import reduce_rule

    cfg = parse_config(section)
    if cfg.mode != "static":
        raise ValueError(f"scale: only static sections have one payload per step (mode '{cfg.mode}')")
    comp = build_compressor(cfg)
    members = classify(params, comp.accepts, cfg.min_compress_numel, comp.name != "none")
    name = exchange_name(comp, cfg.quantized_exchange, n)
    engine = SimpleNamespace(optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    planner = Planner(engine, cfg, comp, members, ErrorFeedbackMemory(comp, False), PATTERNS[name],
                      reduce_rule(n), 0, n)
    planner.build(BucketPlan.provisional_order(len(members)), frozen=True)
    default = static_default_level(cfg, comp)
    level = planner.level(cfg.static_cf() if default is None else default, 10**6)
    out = []
    for bucket in planner.plan.buckets:
        when = max((ready or {}).get(m.name, 1.0) for m in bucket.members)
        codec: Optional[Any] = planner.codecs.get(bucket.index)
        levels = tuple(comp.member_level(c, level) for c in planner.ctxs.get(bucket.index, []))
        if codec is None or planner.dense_at(bucket.index, levels):
            out.append({"exchange": "dense", "numel": bucket.numel, "words1": bucket.numel, "words2": 0,
                        "calls": 1, "ready": when})
            continue
        plans = codec.plans(levels)
        second = [p.get("round2") for p in plans]
        out.append({"exchange": name, "numel": bucket.numel, "words1": sum(p.words for p in plans),
                    "words2": sum(q.words for q in second if q is not None), "calls": len(plans),
                    "ready": when})
    return out


def workloads(model: str, sections: dict[str, Optional[dict[str, Any]]], ns: list[int]) -> dict[str, Any]:
    """``{system: {N: [bucket, ...]}}``; a ``None`` section is DeepSpeed's own dense path."""
    params, ready = model_params(model), profile(model).ready
    return {sid: {str(n): deepspeed_dense(params) if sec is None else gravac_buckets(params, sec, n, ready)
                  for n in ns}
            for sid, sec in sections.items()}
