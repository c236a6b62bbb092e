"""The fidelity benchmark's accuracy bounds: a compressed configuration passes when it loses little against dense
on loss and held-out metric, sends well under dense's bytes and never climbs above where it started and where dense
climbed; a dense control or a baseline (what compression competes with) is judged on accuracy alone."""
from __future__ import annotations

from typing import Optional

LOSS_BOUND = 1.05               # a configuration passes when its final smoothed loss is ≤ dense's + 5% ...
TOP1_POINTS = 0.02              # ... top-1 within 2 points, perplexity within 5% ...
RISE_TOLERANCE = 0.01           # ... its smoothed peak no more than 1% above its start and dense's peak (a
#                                   language model starts at ln V, and its first steps under warm-up wander by about
#                                   1e-4 of that; ResNet-18's first loss is one noisy sample, and dense itself climbs
#                                   up to 9% above it under warm-up) ...
BYTES_BOUND = 0.5               # ... and it sends less than half of dense's bytes


def rises(curve: list[float], dense_curve: list[float]) -> bool:
    """:func:`peak_rises` on whole smoothed curves."""
    return peak_rises(max(curve), curve[0], max(dense_curve))


def peak_rises(peak: float, start: float, dense_peak: float) -> bool:
    """Whether a smoothed loss's peak lies more than ``RISE_TOLERANCE`` above both its start and dense's own peak on
    the same seed: a climb that compression causes, not the one dense makes under warm-up from a low first sample.
    Takes the peak, not the curve, so kept rows (which keep only their peak) are re-judged by the same rule."""
    return peak > max(start, dense_peak) * (1 + RISE_TOLERANCE)


def judged(family: str, loss: float, dense_loss: float, top1: Optional[float], dense_top1: Optional[float],
           ppl: Optional[float], dense_ppl: Optional[float], bytes_ratio: Optional[float], rises: bool,
           prefix: str = "") -> str:
    """:func:`bound_misses` for a non-reference row; a dense one is a control and a baseline (16-bit all-reduce,
    PyTorch's PowerSGD, post-local SGD) is what compression competes with: both are judged on accuracy alone."""
    control = family in ("dense", "baseline")
    verdict = bound_misses(loss, dense_loss, top1, dense_top1, ppl, dense_ppl, None if control else bytes_ratio,
                           rises, prefix)
    return f"{'control' if family == 'dense' else family}: {verdict}" if control else verdict


def bound_misses(loss: float, dense_loss: float, top1: Optional[float], dense_top1: Optional[float],
                 ppl: Optional[float], dense_ppl: Optional[float], bytes_ratio: Optional[float], rises: bool,
                 prefix: str = "") -> str:
    """The accuracy bounds a configuration misses against dense ("ok" when none); ``prefix`` names the
    statistic (e.g. "mean ")."""
    misses = []
    if loss > LOSS_BOUND * dense_loss:
        misses.append(f"{prefix}loss +{100 * (loss / dense_loss - 1):.0f}%")
    if top1 is not None and dense_top1 is not None and top1 < dense_top1 - TOP1_POINTS:
        misses.append(f"{prefix}top-1")
    if ppl is not None and dense_ppl is not None and ppl > LOSS_BOUND * dense_ppl:
        misses.append(f"{prefix}perplexity")
    if bytes_ratio is not None and bytes_ratio >= BYTES_BOUND:
        misses.append("bytes")
    if rises:
        misses.append("loss rises")
    return "ok" if not misses else ", ".join(misses)
