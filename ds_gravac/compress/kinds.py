"""The enumerations of the compressor contract: how payloads combine, how levels read, what a gain means.

``LevelKind``, ``GainKind`` and ``Multilevel`` are ``str`` enums: a member equals its string (``LevelKind.RANK ==
"rank"``) and formats as it, so a plug-in compressor that sets ``level_kind = "rank"`` as a plain string keeps
working; :func:`ds_gravac.compress.base.check_contract` validates every value through these enums.
"""
from __future__ import annotations

import enum


class Kind(str, enum.Enum):
    """How payloads combine across ranks; selects the exchange pattern (collective)."""

    SUMMABLE = "summable"   # payloads add elementwise: all-reduce
    SPARSE = "sparse"       # fixed-size (idx, val) payloads: all-gather
    QUANTIZED = "quantized"  # re-encodable quantized payloads: CaSync-PS or all-gather


class LevelKind(enum.StrEnum):
    """What a level means to the compressor."""

    CF = "cf"        # a compression factor θ ≥ 1 (every controller can drive it)
    RANK = "rank"    # a matrix rank (low-rank compressors outside GraVAC)


class GainKind(enum.StrEnum):
    """What the compression gain ``‖D(p)‖² / ‖x‖²`` means for this compressor (GraVAC needs ``PROJECTION``)."""

    PROJECTION = "projection"   # gain ≤ 1, the share of the energy kept (sparsifiers, low-rank)
    UNBIASED = "unbiased"       # E[gain] ≥ 1: an unbiased estimator's variance, not a kept share (QSGD, TernGrad)
    NONE = "none"               # meaningless (casts, sign quantizers)


class Multilevel(enum.StrEnum):
    """How the payloads of several levels of one step relate (``compress_from``)."""

    EXACT = "exact"                # a higher level's payload is exactly derived from a lower one (Top-k prefixes)
    DISTRIBUTION = "distribution"  # derived with the same distribution as a direct encode (Random-k)
    APPROX = "approx"              # derived approximately (threshold sparsifiers)
    NONE = "none"                  # every level is encoded directly


# Rank levels no matrix can pay for: a rank-levelled compressor sends the matrix plain (its values). At REPROJECT
# its warm start also takes one power iteration on the exact average it received, as on a dense step — mode auto
# sends a group so for one step before raising its rank, so the new rank starts from the current subspace.
PLAIN = float(1 << 30)
REPROJECT = float(1 << 31)


def describe_level(kind: Kind, level_kind: LevelKind, level: float) -> str:
    """A level as its compressor reads it: a rank (or plain), a quantizer's code width, or a CF."""
    if level_kind == LevelKind.RANK:
        return "plain" if level >= PLAIN else f"rank {level:g}"
    if kind == Kind.QUANTIZED:
        return f"{32.0 / level:g}-bit (CF {level:g})"
    return f"CF {level:g}"
