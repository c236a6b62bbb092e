"""Extra memory per rank of the micro-benchmark (``memory`` rows).

As a multiple of the model's fp32 gradient bytes (all parameters), at N = 2 and 8, for a step at each sent level
and for a 5-level GraVAC search (send θ_min = 10, probes 10, 20, 40, 160, 1000): the memory object's slots +
scratch (``ErrorFeedbackMemory.nbytes()``) + the codec's send and probe buffers (``BucketCodec.nbytes()`` after the
step's encode, on fresh codecs) + the exchange's receive buffer (the growth of ``BucketCodec.nbytes()`` when the
exchange is constructed; grows with N for all-gather, none for all-reduce, which reduces in the send buffer).
Buckets that the sparse fallback would send dense at that N get no payload, as in a real step. Reported beside it
and not in the total: the layout's bulk-decode index tensors, which ``BucketCodec.nbytes()`` does not count,
tensors the compressor object itself holds (Random-k's index cache), and an estimate of the bulk decode's
transient peak (12·N·k bytes for the largest bucket: the gathered int32 indices, their offset copy and the gathered
values). Dense-classified tensors keep no buffer of ds_gravac: their bucket is flattened by ``DenseAllReduce``
exactly as DeepSpeed flattens it, a transient copy held until the step's end, reported
(``flatten_transient_bytes``) and not counted as extra. Target printed next to the numbers: Top-k with error
feedback ≤ 2 extra copies.
"""
from __future__ import annotations

from typing import Any

import torch

from ds_gravac.sync.codec import BucketCodec
from ds_gravac.sync.exchange import PayloadAllGather

from .micro_grads import GradSet
from .micro_rank import Rank
from .micro_settings import MEMORY_NS, SEARCH_PROBES, SEARCH_SEND, TARGET_EXTRA_X
from .micro_timing import held_tensor_bytes, nbytes


def dense_classified(own: Rank) -> dict[str, Any]:
    """Dense-classified tensors: no ds_gravac buffer; ``DenseAllReduce`` flattens each of their buckets as DeepSpeed
    does (a transient copy, plus a cast copy when the communication dtype differs), held until the step's end."""
    dense = [b for b in own.plan.buckets if not b.compressible]
    flat = sum(b.numel * torch.empty((), dtype=b.dtype).element_size() for b in dense)
    return {"tensors": sum(len(b.members) for b in dense), "buckets": len(dense),
            "numel": sum(b.numel for b in dense), "flatten_transient_bytes": flat, "extra_bytes": 0}


def memory_row(gs: GradSet, own: Rank, send_level: float, probes: tuple[float, ...], n: int,
               step: int) -> dict[str, Any]:
    """Extra bytes of one rank for one step at world size ``n`` (see the module docstring)."""
    comp = own.comp
    slots: dict[str, int] = {}
    for bm in own.memory.buckets.values():
        for name, buf in bm.slots.items():
            slots[name] = slots.get(name, 0) + nbytes(buf)
    scratch = sum(nbytes(bm.scratch) for bm in own.memory.buckets.values())
    send_b = probe_b = recv_b = bulk_b = decode_peak = fallback = 0
    for b in own.compressible:
        bucket = own.plan.buckets[b]
        codec = BucketCodec(bucket, comp, own.planner.ctxs[b])
        levels = own.levels(b, send_level, step)
        dense = own.falls_back(codec, levels, n)
        live = [not own.falls_back(codec, (p,) * len(bucket.members), n) for p in probes]
        fallback += int(dense)
        if dense and not probes:
            continue
        lay, _ = codec.encode(own.stage(b, step), None if dense else levels, probes, live)
        before = codec.nbytes()
        if lay is not None:
            own.exchange(b, codec, lay, n)
            send_b += nbytes(lay.send)
            bulk_b += sum(nbytes(t) for t in (lay.bulk_idx_pos, lay.bulk_val_pos, lay.bulk_offsets))
            if own.cfg.bulk and lay.bulk_idx_pos is not None and issubclass(own.pattern, PayloadAllGather):
                decode_peak = max(decode_peak, 12 * n * lay.bulk_idx_pos.numel())
        probe_b += before - (nbytes(lay.send) if lay is not None else 0)
        recv_b += codec.nbytes() - before
    memory_b = own.memory.nbytes()
    assert memory_b == sum(slots.values()) + scratch
    extra = memory_b + send_b + probe_b + recv_b
    cache_b = held_tensor_bytes(comp)
    g = gs.grad_bytes
    x = {"memory": memory_b / g, "codec": (send_b + probe_b) / g, "recv": recv_b / g, "total": extra / g}
    return {"world_size": n, "send_level": send_level, "probes": list(probes), "grad_bytes": g,
            "memory_bytes": memory_b, "memory_slot_bytes": slots, "memory_scratch_bytes": scratch,
            "codec_send_bytes": send_b, "codec_probe_bytes": probe_b, "recv_bytes": recv_b, "extra_bytes": extra,
            "x": x, "target_x": TARGET_EXTRA_X, "within_target": x["total"] <= TARGET_EXTRA_X,
            "fallback_buckets": fallback,
            "uncounted": {"bulk_index_bytes": bulk_b, "compressor_tensor_bytes": cache_b,
                          "decode_transient_peak_bytes_est": decode_peak},
            "x_incl_uncounted": (extra + bulk_b + cache_b) / g, "dense_classified": dense_classified(own)}


def memory_rows(gs: GradSet, own: Rank, levels: list[float]) -> list[dict[str, Any]]:
    """Send-only rows per level, and (CF compressors) the 5-level search row, at every N of ``MEMORY_NS``."""
    comp = own.comp
    cases: list[tuple[float, tuple[float, ...]]] = [(lv, ()) for lv in levels]
    if comp.level_kind == "cf":
        cases.append((SEARCH_SEND, tuple(float(comp.realize_cf(p)) for p in SEARCH_PROBES)))
    out = []
    step = 1_000_000          # a step number of its own per row: caches keyed by step start empty
    for n in MEMORY_NS:
        for send_level, probes in cases:
            step += 1
            out.append(memory_row(gs, own, send_level, probes, n, step))
    return out
