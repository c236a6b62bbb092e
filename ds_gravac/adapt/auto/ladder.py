"""Layer groups and their ladders of levels for the goodput controller (``"mode": "auto"``).

**A group is a shape class**: the compressible tensors whose matrix view (``compress.lowrank.matrix_shape``)
is the same ``n × m``, plus one group for every 1-D tensor and a group of its own for the classifier. Not a
bucket, because

* which levels a tensor can take depends on its shape (a rank compresses a matrix only if ``(n + m)·r·rate <
  n·m``), so one ladder fits every member of a shape class, while a bucket mixes shapes for which "rank 16" means
  CFs from 1 to 460;
* error and time add over the members of a class, so a group is priced once per class and the solver sees few
  groups (ResNet101: 21 matrix classes, the vectors and the classifier), which keeps one plan far below 10 ms;
* classes do not move when ``reduce_bucket_size`` changes, and PowerSGD already orthogonalizes same-shape
  factors in one batched call.

The price: layers of one shape at different depths share a level, and a quantizer encodes a bucket at one level,
so the synchronizer will have to bucket by group (one fused collective per group and round: what
``timing`` prices).

**A ladder** is an ordered tuple of levels, dense first, then each family from least to most compression: low
rank {64, 32, 16, 8, 4, 2} (matrices, only ranks that compress the matrix by PyTorch's rule), QSGD {8, 4, 2} bits,
sparsifier CFs {4, 10, 30, 100} (only where the sparse payload is smaller than the dense one). A level's index in
its group's ladder is the code the controller broadcasts; ties in the solver go to the lower index, i.e. to less
compression. **Pinned** groups (the classifier and groups below ``min_numel`` elements) keep only dense and, per
family, the levels at or above that family's reference (rank ≥ 16, QSGD ≥ 8 bits, CF ≤ 30): a small group saves
little time and the classifier decides what is learned from everything else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ...compress.base import k_for
from ...compress.lowrank import matrix_shape

DENSE, LOWRANK, QSGD, SPARSE = "dense", "lowrank", "qsgd", "sparse"
FAMILIES = (DENSE, LOWRANK, QSGD, SPARSE)
RANKS = (64, 32, 16, 8, 4, 2)
QSGD_BITS = (8, 4, 2)
SPARSE_CFS = (4.0, 10.0, 30.0, 100.0)
# The families' validated levels (docs/algorithms.md §7): PowerSGD rank 16, QSGD 8-bit (the default section),
# DGC 30x without masking (the LSTM's recommended setting).
REFERENCE = {LOWRANK: 16.0, QSGD: 8.0, SPARSE: 30.0}
MIN_NUMEL = 1 << 14          # groups smaller than this are pinned: they save little time whatever they send


@dataclass(frozen=True, order=True)
class Level:
    """One rung: a family and its knob (rank, bits or CF; 0 for dense)."""

    family: str
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"ds_gravac: unknown level family {self.family!r} (known: {', '.join(FAMILIES)})")

    def at_or_above(self, reference: float) -> bool:
        """At least as accurate as ``reference`` of the same family (dense always is)."""
        if self.family == DENSE:
            return True
        if self.family == SPARSE:
            return self.value <= reference
        return self.value >= reference

    def __str__(self) -> str:
        if self.family == DENSE:
            return "dense"
        unit = {LOWRANK: "r", QSGD: "b", SPARSE: "x"}[self.family]
        return f"{self.family}:{self.value:g}{unit}"


DENSE_LEVEL = Level(DENSE)


@dataclass(frozen=True)
class Group:
    """Tensors priced and switched together. ``shape`` is the members' matrix view ``(n, m)`` (``(numel, 1)``
    per member for the vectors group, whose members differ in size)."""

    index: int
    name: str
    shape: tuple[int, int]
    members: tuple[str, ...]
    sizes: tuple[int, ...]
    matrix: bool
    pinned: bool
    ladder: tuple[Level, ...] = field(default=())
    linear: bool = False          # every member is a 2-D weight (a fully connected layer's, an embedding's)

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def count(self) -> int:
        return len(self.members)

    def code(self, level: Level) -> int:
        return self.ladder.index(level)


def pays_lowrank(n: int, m: int, r: int, rate: float) -> bool:
    """PyTorch's rule, as the low-rank compressors apply it: rank r compresses ``n × m`` iff ``(n + m)·r·rate <
    n·m`` (and ``r ≤ min(n, m)``)."""
    return 0 < r <= min(n, m) and (n + m) * r * rate < n * m


def pays_sparse(numel: int, cf: float) -> bool:
    """A sparse payload (int32 index + fp32 value per kept entry) is smaller than the dense values."""
    return 2 * k_for(cf, numel) < numel


def ladder_for(shape: tuple[int, int], sizes: Sequence[int], matrix: bool, pinned: bool,
               families: Sequence[str] = (LOWRANK, QSGD, SPARSE), min_compression_rate: float = 2.0,
               reference: Optional[Mapping[str, float]] = None) -> tuple[Level, ...]:
    """Dense, then every level of ``families`` this shape allows, least compression first (see the module
    docstring); a pinned group keeps the levels at or above ``reference``."""
    ref = dict(REFERENCE if reference is None else reference)
    n, m = shape
    rungs = [DENSE_LEVEL]
    if LOWRANK in families and matrix:
        rungs += [Level(LOWRANK, float(r)) for r in RANKS if pays_lowrank(n, m, r, min_compression_rate)]
    if QSGD in families:
        rungs += [Level(QSGD, float(b)) for b in QSGD_BITS]
    if SPARSE in families:
        smallest = min(sizes)
        rungs += [Level(SPARSE, cf) for cf in SPARSE_CFS if pays_sparse(smallest, cf)]
    if pinned:
        rungs = [lv for lv in rungs if lv.family == DENSE or lv.at_or_above(ref.get(lv.family, math.inf))]
    return tuple(rungs)


def classifier_name(named_shapes: Sequence[tuple[str, Sequence[int]]]) -> Optional[str]:
    """The output layer: the last tensor with ≥ 2 dimensions in registration order (torchvision's ``fc``,
    ``classifier.6``; a transformer's untied head)."""
    for name, shape in reversed(list(named_shapes)):
        if len(shape) >= 2:
            return name
    return None


def build_groups(named_shapes: Sequence[tuple[str, Sequence[int]]], families: Sequence[str] = (LOWRANK, QSGD, SPARSE),
                 classifier: Optional[str] = "auto", min_numel: int = MIN_NUMEL, min_compression_rate: float = 2.0,
                 reference: Optional[Mapping[str, float]] = None) -> list[Group]:
    """Groups of the given ``(name, shape)`` pairs (registration order), in order of first appearance, each with
    its ladder. ``classifier``: a tensor name, ``"auto"`` (:func:`classifier_name`) or None (no such group)."""
    named = [(str(n), tuple(int(s) for s in shape)) for n, shape in named_shapes]
    head = classifier_name(named) if classifier == "auto" else classifier
    if head is not None and head not in {n for n, _ in named}:
        raise ValueError(f"ds_gravac: classifier {head!r} is not one of the model's tensors")
    keys: dict[tuple, list[tuple[str, int]]] = {}
    shapes: dict[tuple, tuple[int, int]] = {}
    flat = {name for name, shape in named if len(shape) == 2}
    for name, shape in named:
        numel = math.prod(shape) if shape else 1
        if name == head:
            key: tuple = ("classifier",)
        elif len(shape) >= 2:
            key = ("matrix",) + matrix_shape(shape)
        else:
            key = ("vectors",)
        keys.setdefault(key, []).append((name, numel))
        shapes.setdefault(key, matrix_shape(shape) if len(shape) >= 2 else (numel, 1))
    groups = []
    for i, (key, members) in enumerate(keys.items()):
        sizes = tuple(s for _, s in members)
        matrix = key[0] == "matrix" or (key[0] == "classifier" and shapes[key][1] > 1)
        pinned = key[0] == "classifier" or sum(sizes) < min_numel
        name = {"classifier": "classifier", "vectors": "vectors"}.get(key[0]) or f"{key[1]}x{key[2]}"
        groups.append(Group(index=i, name=name, shape=shapes[key], members=tuple(n for n, _ in members),
                            sizes=sizes, matrix=matrix, pinned=pinned,
                            ladder=ladder_for(shapes[key], sizes, matrix, pinned, families, min_compression_rate,
                                              reference),
                            linear=all(n in flat for n, _ in members)))
    return groups


def uniform_codes(groups: Sequence[Group], level: Level) -> list[int]:
    """The codes of one level for the whole model: each group takes ``level`` if its ladder has it, otherwise
    the nearest rung at or above it of the same family, otherwise dense — what a static run of that level sends
    (a matrix whose rank does not pay travels plain, i.e. dense)."""
    codes = []
    for g in groups:
        same = [i for i, lv in enumerate(g.ladder) if lv.family == level.family and lv.at_or_above(level.value)]
        codes.append(g.code(level) if level in g.ladder else (same[-1] if same else 0))
    return codes


def member_levels(groups: Sequence[Group], codes: Sequence[int], plain: float) -> dict[str, float]:
    """Every member tensor's compressor level under ``codes``: a rank, QSGD's b bits as CF 32/b, Top-k's CF, or
    ``plain`` (a level no tensor can pay for: sent dense) for the dense rung."""
    out = {}
    for g, c in zip(groups, codes):
        level = g.ladder[c]
        if level.family == DENSE:
            value = plain
        else:
            value = 32.0 / level.value if level.family == QSGD else level.value
        out.update({m: float(value) for m in g.members})
    return out


def family_view(groups: Sequence[Group], families: Sequence[str]) -> list[list[int]]:
    """Per group, the ladder indices of dense and of ``families``: the solver budgets one kind of error at a
    time (variance for QSGD, unsent energy for the error-feedback families), so it sees one view per kind."""
    allowed = {DENSE, *families}
    return [[i for i, lv in enumerate(g.ladder) if lv.family in allowed] for g in groups]


__all__ = ["DENSE", "LOWRANK", "QSGD", "SPARSE", "FAMILIES", "RANKS", "QSGD_BITS", "SPARSE_CFS", "REFERENCE",
           "MIN_NUMEL", "Level", "DENSE_LEVEL", "Group", "pays_lowrank", "pays_sparse", "ladder_for",
           "classifier_name", "build_groups", "uniform_codes", "member_levels", "family_view"]
