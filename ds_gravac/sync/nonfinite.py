"""The fallback of a step in which some rank produced a NaN/Inf gradient: DeepSpeed's own averaging of the raw
gradients, and the message that names the step and the first non-finite tensor of every rank that had one.

Nothing here touches ds_gravac's state: the scheduler simply does not commit such a step."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import GravacError
from ..telemetry.stats import AgreedStats, StepStats
from .buckets import Bucket, Member
from .exchange import DenseAllReduce, Exchange
from .reduce_rule import ReduceRule

if TYPE_CHECKING:
    from .running_step import RunningStep

logger = logging.getLogger("ds_gravac")


def nonfinite_step(agreed: AgreedStats, run: "RunningStep", members: Sequence[Member], buckets: Sequence[Bucket],
                   policy: str, rule: ReduceRule, world_size: int, channels: Sequence[Any]) -> dict[str, float]:
    """Some rank produced a NaN/Inf: nothing commits; every gradient is averaged exactly as DeepSpeed would, so
    the user's own safeguards see what they would see without ds_gravac (or, ``policy`` "raise", the error)."""
    t1 = time.perf_counter()
    for ex in run.exchanges.values():                 # issued on every rank: let them finish
        ex.wait_all()
    comm_wait = time.perf_counter() - t1
    message = nonfinite_message(agreed, members, policy)
    if policy == "raise":
        raise GravacError(message)
    logger.warning("%s; sent dense, ds_gravac state unchanged", message)
    timings = resend_raw(buckets, run.exchanges, rule, world_size, channels, run.stats)
    timings["comm_wait_s"] += comm_wait
    return timings


def nonfinite_message(agreed: AgreedStats, members: Sequence[Member], policy: str) -> str:
    firsts = [int(v) for v in agreed.nonfinite_first]
    where = ", ".join(f"rank {r}: '{members[i].name}'" for r, i in enumerate(firsts) if i >= 0)
    return (f"ds_gravac: non-finite gradient (NaN/Inf) at step {agreed.step} ({where}; nonfinite is "
            f"'{policy}')")


def resend_raw(buckets: Sequence[Bucket], exchanges: dict[int, Exchange], rule: ReduceRule, world_size: int,
               channels: Sequence[Any], stats: StepStats) -> dict[str, float]:
    """All-reduce every compressible bucket's raw gradients with DeepSpeed's rule (dense-classified buckets
    already carried theirs) and write every ``p.grad``. The step's own exchanges must have completed."""
    resend: dict[int, Exchange] = {}
    for bucket in buckets:
        if bucket.compressible:
            ex = DenseAllReduce(rule, world_size, f"bucket {bucket.index} (dense, non-finite step)",
                                tensors=[m.param.grad for m in bucket.members])
            ex.launch(channels)
            stats.bytes_sent += ex.bytes_sent
            stats.values_sent += bucket.numel
            resend[bucket.index] = ex
    comm_wait, t0 = 0.0, time.perf_counter()
    for bucket in buckets:
        ex = resend.get(bucket.index, exchanges[bucket.index])
        comm_wait += ex.wait(ex.rounds - 1)
        ex.result(None, 1.0)
        ex.write_back([m.param.grad for m in bucket.members])
    return {"comm_wait_s": comm_wait, "decompress_s": 0.0, "writeback_s": time.perf_counter() - t0}
