"""The fallback of a step in which some rank produced a NaN/Inf gradient: DeepSpeed's own averaging of the raw
gradients, and the message that names the step and the first non-finite tensor of every rank that had one.

Nothing here touches ds_gravac's state: the scheduler simply does not commit such a step."""
from __future__ import annotations

import time
from typing import Any, Sequence

from ..telemetry.stats import AgreedStats, StepStats
from .buckets import Bucket, Member
from .exchange import DenseAllReduce, Exchange
from .reduce_rule import ReduceRule


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
