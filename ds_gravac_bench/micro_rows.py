"""The timed rows of the micro-benchmark: one compressor at one level on the production codec path (stage, norm,
encode, residual, second round, decode at every N of ``DECODE_NS``), the naive Top-k and sampled-threshold
reference lines, and multi-level against direct probe encodes."""
from __future__ import annotations

import math
import time
from typing import Any

import torch

from ds_gravac.compress.base import k_for
from ds_gravac.sync.codec import BucketCodec

from .micro_grads import GradSet
from .micro_rank import Rank, fill_received, real_entries, reduce_rule
from .micro_settings import DECODE_NS, PHASES, STEP_KEYS
from .micro_timing import stats, timed


def run_level(gs: GradSet, own: Rank, others: list[Rank], level: float) -> dict[str, Any]:
    """Timings, payload sizes and passes of every compressible bucket of ``own`` at ``level``; ``others``
    supply the decode rows of the other ranks."""
    comp, repeats = own.comp, gs.repeats
    own.memory.reset()
    send = {b: own.levels(b, level, 0) for b in own.compressible}
    fresh, out = gs.pass_now()
    members = [m for b in own.compressible for m in own.plan.buckets[b].members]
    res: dict[str, Any] = {"level": send[own.compressible[0]][0], "tensors": len(members),
                           "buckets": len(own.compressible), "t_pass_local": fresh, "t_pass_out_local": out}
    samples: dict[str, list[float]] = {k: [] for k in STEP_KEYS}
    for step in range(repeats + 1):
        t = own.step(send, step)
        if step > 0:
            for k in STEP_KEYS:
                samples[k].append(t[k])
    res.update({k: stats(v) for k, v in samples.items()})

    lays = {b: own.planner.codecs[b].layout(send[b]) for b in own.compressible}
    rows = {b: [lay.send.clone()] for b, lay in lays.items()}
    for other in others[:max(DECODE_NS) - 1]:
        for b, p in other.payloads(send, repeats).items():
            rows[b].append(p)
    for n in DECODE_NS:
        exchanges = []
        for b in own.compressible:
            codec = BucketCodec(own.plan.buckets[b], comp, own.planner.ctxs[b])
            lay = codec.layout(send[b])
            ex = own.exchange(b, codec, lay, n)
            fill_received(ex, codec, lay, rows[b][:n])
            exchanges.append((own.memory.bucket(b), ex))
        scale = reduce_rule(n).output_scale
        res[f"t_decompress_n{n}"] = timed(lambda _: [ex.result(mem.scratch, scale) for mem, ex in exchanges],
                                          repeats)

    plans = [p for lay in lays.values() for p in lay.plans]
    compressed = sum(m.numel for m in members)
    res["payload_bytes"] = sum(comp.wire_bytes(p) for p in plans)
    res["values_sent"] = sum(comp.values_sent(p) for p in plans)
    res["real_entries"] = sum(real_entries(lay) for lay in lays.values())
    res["compressed_numel"] = compressed
    res["wire_cf"] = 4 * compressed / max(1, res["payload_bytes"])
    res["gbps_compress"] = 4 * compressed / res["t_compress"]["median"] / 1e9
    res["passes"] = {k: gs.passes(res[k], res["t_pass_local"]) for k in PHASES}
    res["passes_out"] = {k: gs.passes(res[k], res["t_pass_out_local"]) for k in PHASES}
    res["passes_vs_set_t_pass"] = {k: gs.passes(res[k]) for k in PHASES}
    return res


def naive_topk(gs: GradSet, level: float) -> dict[str, Any]:
    """Reference line: ``torch.topk(|x|, k)`` and a gather per tensor, no codec."""
    def run(_: int) -> None:
        for x in gs.grads:
            idx = torch.topk(x.abs(), k_for(level, x.numel()), sorted=False).indices
            x.index_select(0, idx)
    ref, ref_out = gs.pass_now()
    t = timed(run, gs.repeats)
    return {"level": level, "t": t, "t_pass_local": ref, "t_pass_out_local": ref_out, "passes": gs.passes(t, ref),
            "passes_out": gs.passes(t, ref_out)}


def sampled_threshold(gs: GradSet, level: float, ratio: float = 0.01) -> dict[str, Any]:
    """Reference line: the threshold estimated from a ``ratio`` sample of every tensor."""
    def run(step: int) -> None:
        gen = torch.Generator().manual_seed(step)
        for x in gs.grads:
            s = max(1, math.ceil(ratio * x.numel()))
            sample = x.index_select(0, torch.randint(x.numel(), (s,), generator=gen)).abs_()
            torch.topk(sample, max(1, math.ceil(s / level)), sorted=False).values.min()
    ref, ref_out = gs.pass_now()
    t = timed(run, gs.repeats)
    return {"level": level, "sample_ratio": ratio, "t": t, "t_pass_local": ref, "t_pass_out_local": ref_out,
            "passes": gs.passes(t, ref), "passes_out": gs.passes(t, ref_out)}


def multilevel(gs: GradSet, own: Rank, levels: list[float], direct_send: dict[float, float]) -> dict[str, Any]:
    """Probe encodes of every compressible bucket on the staged inputs: all levels in one encode (levels[0]
    compressed, the others derived from it) against each level in an encode of its own; ``t_stage`` of a derived
    level = (encode of levels[0] and it) − (encode of levels[0] alone), per sample."""
    xs = {b: own.stage(b, 2_000_000) for b in own.compressible}
    codecs = own.planner.codecs

    def encode(probes: tuple[float, ...]) -> float:
        t0 = time.perf_counter()
        for b in own.compressible:
            codecs[b].encode(xs[b], None, probes, [True] * len(probes))
        return time.perf_counter() - t0

    base, rest = levels[0], levels[1:]
    t_direct: dict[float, list[float]] = {lv: [] for lv in levels}
    t_pair: dict[float, list[float]] = {lv: [] for lv in rest}
    t_stage2: dict[float, list[float]] = {lv: [] for lv in rest}
    t_all: list[float] = []
    for i in range(gs.repeats + 1):
        d = {lv: encode((lv,)) for lv in levels}
        pair = {lv: encode((base, lv)) for lv in rest}
        every = encode(tuple(levels))
        if i > 0:
            for lv in levels:
                t_direct[lv].append(d[lv])
            for lv in rest:
                t_pair[lv].append(pair[lv])
                t_stage2[lv].append(pair[lv] - d[base])
            t_all.append(every)
    for codec in codecs.values():
        codec.end_step()
    direct = {lv: stats(v)["median"] for lv, v in t_direct.items()}
    t_stage = {str(base): stats(t_direct[base]), **{str(lv): stats(v) for lv, v in t_stage2.items()}}
    multi, direct_total = stats(t_all)["median"], sum(direct.values())
    pairs = {f"{base:g}+{lv:g}": {"direct": direct[base] + direct[lv], "multi": stats(t_pair[lv])["median"]}
             for lv in rest}
    for p in pairs.values():
        p["ratio"] = p["multi"] / p["direct"]
    return {"levels": levels, "t_stage": t_stage, "t_multi": multi, "t_direct": direct_total,
            "ratio": multi / direct_total, "pairs": pairs,
            "t_direct_send": sum(direct_send[lv] for lv in levels)}

