"""Cost-model choice for one bucket at one level tuple: dense, or compressed with the cheapest exchange.

A bucket is compressed only if its cheapest predicted compressed time is at most ``margin`` times its predicted
dense time (``cost_model.margin``: a margin below 1 asks compression to win clearly, since the prediction
ignores overlap). Candidates are the compressor's own pattern, plus the all-gather for quantizers with
``quantized_exchange: "auto"`` whose owners merge by averaging (the parameter server and the all-gather then
compute the same average; signSGD's owners vote, so it keeps its pattern). Single-round exchanges are also
priced in 2, 4, … ``cost_model.max_chunks`` pipeline chunks (``sync/exchange/chunked.py``) and the cheapest count
is planned. Ties go to the compressor's own pattern, then to fewer chunks. Until agreed fits exist, the threshold
rules answer.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional

from ...compress.base import Compressor, Kind, TensorPlan
from ...config import GravacConfig
from ...errors import GravacUnsupportedError
from ..exchange import chunk_counts, chunk_spans, exchange_name, owners_average
from ..reduce_rule import ReduceRule
from ..selection import Choice, ThresholdSelector
from .fits import FitTable
from .predict import CHUNKED, PRICED, compressed_time, dense_time

if TYPE_CHECKING:
    from ..exchange.base import Codec


def exchange_candidates(quantized_exchange: str, compressor: Compressor) -> tuple[str, ...]:
    """Patterns the cost model may choose between for this compressor (the first is its own)."""
    own = exchange_name(compressor, quantized_exchange)
    if (compressor.kind == Kind.QUANTIZED and quantized_exchange == "auto" and own == "casync_ps"
            and owners_average(compressor)):
        return (own, "allgather")
    return (own,)


def check_priceable(compressor: Compressor, candidates: tuple[str, ...]) -> None:
    """Refuse, at attach, compressors whose time the model cannot predict."""
    shaped = type(compressor).tensor_plan is not Compressor.tensor_plan
    if shaped or any(c not in PRICED for c in candidates):
        why = ("its payloads depend on matrix shapes" if shaped else f"its exchange pattern '{candidates[0]}' "
            f"is not priced (priced: {', '.join(PRICED)})")
        raise GravacUnsupportedError(
            f"ds_gravac: selection 'cost_model' is not available in this version for the compressor "
            f"'{compressor.name}': {why}; use \"selection\": \"threshold\" (key \"selection\")")


def chunk_limit(config: GravacConfig, compressor: Compressor) -> int:
    """The most pipeline chunks a bucket may be planned with: ``cost_model.max_chunks``, except 1 for quantizers
    (their unit of compression is a bucket partition, whose scales chunking would change, and the parameter
    server has two rounds) and for strict decisions (every bucket is encoded before the agreement, so no encode
    is left to overlap a collective)."""
    if compressor.kind == Kind.QUANTIZED or config.gravac.decision == "strict":
        return 1
    return config.cost_model.max_chunks


class CostModelSelector:
    """Chooses from agreed fits; ``version`` changes whenever the fits do (the planner's cache key)."""

    def __init__(self, margin: float, candidates: tuple[str, ...], rule: ReduceRule, world_size: int,
                 fallback: ThresholdSelector, max_chunks: int = 1) -> None:
        self.margin, self.candidates, self.rule, self.world_size = margin, candidates, rule, world_size
        self.fallback, self.max_chunks = fallback, max_chunks
        self.fits: Optional[FitTable] = None
        self.version = 0

    def set_fits(self, fits: FitTable) -> None:
        """Adopt an agreed table (identical on every rank): every cached choice is stale from now on."""
        self.fits = fits
        self.version += 1

    def choose(self, codec: "Codec", levels: tuple[float, ...]) -> Choice:
        if self.fits is None:
            return self.fallback.choose(codec, levels)
        numel = codec.bucket.numel
        plans = codec.plans(levels)
        dense = dense_time(self.fits, numel, self.rule.comm_bytes_per_element)
        best_t, best, chunks = min(self._options(codec, plans))
        return Choice(dense=not best_t <= self.margin * dense, exchange=self.candidates[best],
                      pred_dense_s=dense, pred_compressed_s=best_t, chunks=chunks)

    def _options(self, codec: "Codec", plans: list[TensorPlan]) -> Iterator[tuple[float, int, int]]:
        """``(predicted seconds, candidate, chunks)`` of every candidate exchange at every chunk count it may use
        (ties: the compressor's own exchange, then fewer chunks)."""
        numel, sizes = codec.bucket.numel, [m.numel for m in codec.bucket.members]
        for i, ex in enumerate(self.candidates):
            for k in chunk_counts(numel, len(sizes), self.max_chunks if ex in CHUNKED else 1):
                spans = chunk_spans(sizes, k) if k > 1 else None
                yield compressed_time(self.fits, ex, numel, self.world_size, plans, spans), i, k
