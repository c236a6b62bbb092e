"""The end of a step after the ranks agreed: wait for each bucket's exchange, commit its memory, write ``p.grad``.

Kept apart from the synchronizer's scheduling because it is the one place where persistent state changes: a finite
step commits every bucket's error-feedback memory (and the compressor's aggregate-dependent state) in plan order;
a step with a non-finite gradient on any rank commits nothing and falls back to DeepSpeed's plain average.
"""
from __future__ import annotations

import time

from ..telemetry.stats import AgreedStats
from .memory import write_grads
from .nonfinite import nonfinite_step
from .parts import SyncParts


def complete_step(sync: SyncParts, agreed: AgreedStats) -> dict[str, float]:
    """Wait for every bucket; commit and write back (finite step) or fall back to DeepSpeed's average.
    Returns the step's wait, decode and write-back times."""
    run = sync.running
    if agreed.nonfinite > 0:
        return nonfinite_step(agreed, run, sync.members, sync.plan.buckets, sync.config.nonfinite,
                              sync.rule, sync.world_size, sync.channels.data_channels)
    comm_wait = decompress = writeback = 0.0
    scale = sync.rule.output_scale
    collect = sync.controller.collect if sync.controller.collects_gradients(run.plan.step) else None
    for bucket in sync.plan.buckets:
        b = bucket.index
        ex = run.exchanges[b]
        comm_wait += ex.wait(ex.rounds - 1)
        t1 = time.perf_counter()
        out = None
        compressed = run.plan.actions[b].compressed
        if bucket.compressible:
            mem, ctxs = sync.memory.bucket(b), sync.planner.ctxs[b]
            if collect is not None:
                for m in bucket.members:
                    collect(m.name, mem.grad(m))
            if compressed:
                mem.commit_compressed(sync.comp, None if sync.partitioned else run.layouts[b].payloads, ctxs)
                sync.server.commit(b)
                out = mem.scratch
            else:
                mem.commit_dense(sync.comp, ctxs)
        t_r = time.perf_counter()
        flat = ex.result(out, scale)
        run.decode_s[b] = time.perf_counter() - t_r
        if bucket.compressible and sync.comp.owns_state:     # state that depends on the aggregate
            sync.codecs[b].commit_aggregate(run.layouts.get(b) if compressed else None, flat)
        if sync.sampled is not None:
            sync.sampled.bucket_done(bucket, flat, compressed)
        t2 = time.perf_counter()
        if bucket.compressible:
            sync.update_space.to_gradient(bucket.members, sync.planner.ctxs[b], flat, run.plan.step)
            if run.loss_scale != 1.0:
                flat.mul_(run.loss_scale)          # back into the scaled space the optimizer unscales
            write_grads(bucket.members, flat, alias=flat is sync.memory.bucket(b).scratch)
        else:
            ex.write_back([m.param.grad for m in bucket.members])
        decompress, writeback = decompress + t2 - t1, writeback + time.perf_counter() - t2
    sync.comp.step_committed(any(a.compressed for a in run.plan.actions))
    return {"comm_wait_s": comm_wait + run.round_wait_s, "decompress_s": decompress, "writeback_s": writeback}
