"""Calibration at attach: time every primitive the plan prices, fit it per rank, then agree on the fits.

* Collectives run on the first data channel, each at every ``cost_model.probe_bytes`` size of per-rank input:
  one untimed call (it also lines the ranks up), then ``probe_repeats`` timed calls whose median is kept.
* The compressor encodes and decodes seeded random data at the initial level, at up to three sizes (2^14, 2^18
  and 2^21 elements, capped by the largest compressible bucket), on a private copy of the compressor so that no
  cache or generator of the real one changes; staging (``g + r``) and write-back (a copy) at the same sizes.
* Each rank fits ``T = A + B·x`` per primitive; ``A`` and ``B`` are then all-reduced with MAX on the control
  channel. Every rank plans from that agreed, pessimistic table — never from its own timings.

The sequence of collectives depends only on the config, the compressor and the bucket plan, so it is the same on
every rank.
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import Any, Callable, Sequence

import torch

from ...compress.base import CompressCtx, Compressor, Kind, Payload, stable_hash
from ...config import GravacConfig
from ..collectives import (Channels, agree_min_max, all_gather_async, all_reduce_async, all_to_all_async,
                           check_agreement)
from .fits import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, STAGE, WRITEBACK, FitTable, decode_key, encode_key,
                   Sample, least_squares)

CODEC_SIZES = (2**14, 2**18, 2**21)


def initial_level(config: GravacConfig, compressor: Compressor) -> float:
    """The level calibration encodes at: the one the run starts compressing with (static: ``cf`` or a quantizer's
    own CF; gravac: ``theta_min``; accordion: ``high_compression``, else ``cf``)."""
    if compressor.kind == Kind.QUANTIZED and config.cf is None:
        level = compressor.default_cf()
    elif config.mode == "gravac":
        level = config.gravac.theta_min
    elif config.mode == "accordion" and config.accordion.high_compression is not None:
        level = config.accordion.high_compression
    else:
        level = config.static_cf()
    return float(compressor.realize_cf(level))


def codec_sizes(largest: int) -> list[int]:
    """Sizes the codec is timed at: the defaults capped by the largest bucket (at least two when possible)."""
    largest = max(1, int(largest))
    sizes = sorted({min(s, largest) for s in CODEC_SIZES})
    if len(sizes) < 2 and largest > 1:
        sizes = [max(1, largest // 16), largest]
    return sorted(set(sizes))


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def collective_samples(kinds: Sequence[str], probe_bytes: Sequence[int], repeats: int, channels: Channels
                       ) -> dict[str, list[Sample]]:
    """Blocking timings of each collective at each per-rank input size, on the first data channel."""
    n, group = channels.world_size, channels.data
    out: dict[str, list[Sample]] = {k: [] for k in kinds}
    for kind in kinds:
        for nbytes in sorted(set(int(b) for b in probe_bytes)):
            words = max(1, nbytes // 4)
            if kind == ALL_TO_ALL:
                words = -(-words // n) * n
            send = torch.zeros(words, dtype=torch.float32)
            recv = torch.zeros(words * (n if kind == ALL_GATHER else 1), dtype=torch.float32)

            def run(kind: str = kind, send: torch.Tensor = send, recv: torch.Tensor = recv) -> None:
                what = f"cost-model probe ({kind}, {4 * send.numel()} bytes)"
                if kind == ALL_REDUCE:
                    all_reduce_async(send, group, what).wait()
                elif kind == ALL_GATHER:
                    all_gather_async(recv, send, group, what).wait()
                else:
                    all_to_all_async(recv, send, group, what).wait()
            out[kind].append((1.0, 4.0 * words, median_time(run, repeats)))
    return out


def codec_samples(compressor: Compressor, level: float, sizes: Sequence[int], repeats: int, seed: int,
                  world_size: int, rank: int) -> dict[str, list[Sample]]:
    """Encode/decode at ``level`` and staging/write-back, on seeded random data, one sample per size."""
    comp = copy.deepcopy(compressor)            # the real compressor's caches and streams stay untouched
    word_dtype = torch.float32 if comp.kind == Kind.SUMMABLE else torch.int32
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, list[Sample]] = {encode_key(level): [], decode_key(level): [], STAGE: [], WRITEBACK: []}
    for n in sizes:
        g = torch.randn(n, generator=gen)
        r = torch.randn(n, generator=gen) * 0.1
        x = torch.empty(n)
        dst = torch.empty(n)
        plan = comp.plan(n, level)
        payload = Payload.allocate(plan, word_dtype)
        ctx = CompressCtx(key=f"cost-model/{n}", rank=rank, world_size=world_size, seed=seed, shape=(n,),
                          memory={slot: torch.zeros(n) for slot in comp.Memory.slots})
        torch.add(g, r, out=x)
        out[STAGE].append((1.0, float(n), median_time(lambda: torch.add(g, r, out=x), repeats)))
        out[WRITEBACK].append((1.0, float(n), median_time(lambda: dst.copy_(x), repeats)))
        out[encode_key(level)].append((1.0, float(n), median_time(
            lambda: comp.compress(x, plan, payload, ctx, update_state=False), repeats)))
        out[decode_key(level)].append((1.0, float(n), median_time(
            lambda: comp.decompress(payload, dst, accumulate=True, scale=1.0, ctx=ctx), repeats)))
    return out


def agree(local: dict[str, list[Sample]] | FitTable, channels: Channels) -> FitTable:
    """Fit (if given samples) and all-reduce every ``A`` and ``B`` with MAX on the control channel.

    MAX per coefficient, not the slowest rank's whole line: ``max A + max B·x`` bounds every rank's line at every
    size ``x ≥ 0``, whereas one rank's line can be the slowest at one size and not at another."""
    table = local if isinstance(local, FitTable) else FitTable({k: least_squares(v) for k, v in local.items()})
    names = table.names()
    check_agreement(stable_hash("|".join(names)), channels.control,
                    "ranks priced different cost-model primitives (the compressor or its levels differ)")
    _, hi = agree_min_max(torch.tensor(table.flat(), dtype=torch.float64), channels.control,
                          "all_reduce (MAX) of the cost-model fits")
    return FitTable.from_flat(names, hi.tolist())


def calibrate(config: GravacConfig, compressor: Compressor, collectives: Sequence[str], largest_bucket: int,
              channels: Channels) -> tuple[FitTable, dict[str, list[Sample]]]:
    """Measure, fit and agree (collective: every rank calls it at attach); also returns this rank's samples
    (a later refit borrows them)."""
    cm = config.cost_model
    samples = collective_samples(collectives, cm.probe_bytes, cm.probe_repeats, channels)
    samples.update(codec_samples(compressor, initial_level(config, compressor), codec_sizes(largest_bucket),
                                 cm.probe_repeats, config.seed, channels.world_size, channels.rank))
    return agree(samples, channels), samples
