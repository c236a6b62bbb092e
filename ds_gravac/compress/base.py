"""The compressor contract.

A compressor encodes one flat fp32 tensor at a time into *sections* (typed views of a word buffer) whose sizes
depend only on (numel, level, parameters): it plans, encodes, decodes and says which levels it realizes.
Compressors never communicate: the synchronizer owns every collective (through the exchange patterns of
``ds_gravac.sync.exchange``), so all rank-agreement reasoning lives in one place. What a tensor remembers between
steps — the error-feedback residual, or a compressor's own memory such as DGC's momentum and velocity — follows
the compressor's memory rule (``Memory``, a :class:`~ds_gravac.compress.memory.CompressorMemory`; the instance is
``compressor.memory``), applied to buffers the synchronizer owns, and only after the ranks agreed that the step's
gradients were finite (the life of a tensor in a step: ``ds_gravac/compress/memory.py``). After every bucket
committed, ``step_committed`` advances per-step replicated state (ACP-SGD's parity); a step whose gradients were
not finite on some rank changes neither the memory nor the compressor's state.

Plans are per tensor *shape* and level (:meth:`Compressor.tensor_plan`; element-wise compressors only need the
count). ``phase`` is replicated state that selects payload layouts (ACP-SGD's P/Q parity); it changes only in
``step_committed``, so it is fixed for the whole of a step and part of every layout cache key.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, ClassVar, Optional, Sequence

import torch
from pydantic import BaseModel, ConfigDict

from .kinds import GainKind, Kind, LevelKind, Multilevel  # noqa: F401  (the contract's enums, importable here)
from .memory import CompressorMemory, legacy_memory
from .payload import CompressCtx, Payload, Section, TensorPlan  # noqa: F401  (the data types, importable here)

MASK64 = (1 << 64) - 1


class CompressorParams(BaseModel):
    """Base of every compressor's parameter model: unknown keys are errors, as in DeepSpeed's sections, and types
    are strict like the rest of the ``"gravac"`` section (``"momentum": "0.9"`` or ``Infinity`` are refused)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_assignment=True, strict=True,
                              allow_inf_nan=False)


def stable_hash(text: str) -> int:
    """Process-independent 63-bit hash (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mix_seed(*parts: int) -> int:
    """Combine seed components into one 63-bit generator seed (rule 4: dedicated, reproducible streams)."""
    h = 0
    for p in parts:
        h = splitmix64(h ^ (int(p) & MASK64))
    return h >> 1


def generator(device: torch.device | str, *parts: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(mix_seed(*parts))
    return gen


def k_for(theta: float, n: int) -> int:
    """Sparsifier size ``k(θ, n) = min(n, max(1, ceil(n/θ)))``; θ = 1 keeps everything."""
    return min(n, max(1, math.ceil(n / float(theta) - 1e-9)))


class Compressor:
    """Base class; subclasses set the class attributes and implement ``plan``/``compress``/``decompress``."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[CompressorParams]] = CompressorParams
    kind: ClassVar[Kind] = Kind.SUMMABLE
    rounds: ClassVar[int] = 1
    owns_state: ClassVar[bool] = False
    level_kind: ClassVar[LevelKind] = LevelKind.CF
    multilevel: ClassVar[Multilevel] = Multilevel.NONE
    gain_kind: ClassVar[GainKind] = GainKind.NONE
    server_reencode: ClassVar[bool] = False
    owns_optimizer: ClassVar[bool] = False   # DGC: momentum and weight decay move into the compressor
    # Capabilities the attach-time checks read (never the module a class lives in): ``static_only`` — the level
    # only bounds the payload and does not steer what is sent (threshold), so GraVAC cannot search it;
    # ``update_space`` — payloads are parameter updates ``γ·g`` (EF-signSGD), so the synchronizer divides each
    # tensor's decoded aggregate by its group's current learning rate γ before writing the gradient.
    static_only: ClassVar[bool] = False
    update_space: ClassVar[bool] = False
    # indices drawn from a stream every rank shares (Random-k): the ranks compare digests of :meth:`indices` at
    # the first compressed step, so a seed or library mismatch fails at once instead of summing garbage
    shared_indices: ClassVar[bool] = False
    # owns_optimizer only: the compressor clips each rank's gradient itself (DGC's clip_norm), so it can take the
    # engine's gradient_clipping over (:meth:`take_clipping`); attach refuses a non-zero clipping otherwise
    clips_locally: ClassVar[bool] = False
    # projections that report each component's energy of the applied aggregate (component_energies): GraVAC's
    # gain_denominator "aggregate" needs them (low-rank compressors)
    aggregate_gain: ClassVar[bool] = False
    # set by the synchronizer when something reads component_energies: measuring them costs a pass over every
    # compressed gradient per step (ACP-SGD), wasted in every other mode
    wants_energies: bool = False
    # set by the synchronizer every step: whether the controller reads this step's measurements. A low-rank
    # compressor's power iteration on a dense step's exact average (its warm start and every rank's energy) costs
    # 3·n·m·r multiply-adds per matrix, a third of a ResNet-18 step on one core; auto samples a few steps
    measuring: bool = True
    # the per-tensor memory rule (compress/memory.py): plain error feedback, or the compressor's own memory with
    # its slots (owns_state: DGC's u and v); ``self.memory`` is its instance bound to this compressor
    Memory: ClassVar[type[CompressorMemory]] = CompressorMemory
    # How payloads cross the ranks: None = by kind (SUMMABLE: "allreduce", otherwise "allgather"); a name
    # registered in ds_gravac.sync.exchange otherwise.
    exchange: ClassVar[Optional[str]] = None
    phase: int = 0           # replicated per-step state that selects payload layouts (see the module docstring)
    # rank-levelled compressors: "uniform" once bind_levels("uniform") made GraVAC's levels the rungs of a uniform
    # rank ladder; "cf" otherwise
    ladder: str = "cf"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        legacy = legacy_memory(cls)      # a plug-in that still carries the memory hooks of the 0.4 contract itself
        if legacy is not None:
            cls.Memory = legacy

    def __init__(self, params: Optional[CompressorParams] = None) -> None:
        self.params = params if params is not None else self.Params()
        self.memory = self.Memory(self)
        self._plans: dict[tuple[int, float], TensorPlan] = {}

    # ---- static properties -------------------------------------------------------------------------
    def accepts(self, shape: Sequence[int]) -> bool:
        """Whether a tensor of this shape is compressed at all (rejected ones travel dense)."""
        return True

    def bind_levels(self, kind: str, bound: float) -> None:
        """Rank-levelled compressors only, at attach: read levels as ranks (``kind`` "rank", ``bound`` the
        largest rank used) or as CFs (``"cf"`` under GraVAC, ``bound`` = theta_min). Others ignore it."""

    def pin(self, shapes: Sequence[Sequence[int]]) -> None:
        """At attach, before any plan: the classifier's shapes (the last compressed matrix), which a compressor may
        treat apart — the low-rank uniform ladder keeps them at least at its rank, ``classifier_rank`` sends them
        at that rank. Others ignore it."""

    def default_level(self) -> Optional[float]:
        """The level static mode uses when the config names none: a rank-levelled compressor's rank, a
        quantizer's own CF; ``None``: the config's ``cf``."""
        return None

    def check_engine(self, engine: Any) -> None:
        """Optional attach-time check of the engine (e.g. an optimizer constraint)."""

    # ---- what an owns_optimizer compressor takes from the engine (DGC) ---------------------------------
    @property
    def applies_weight_decay(self) -> bool:
        """``owns_optimizer`` only: whether weight decay moves into the compressor with the momentum (else the
        optimizer keeps applying it)."""
        return True

    @property
    def clip_norm(self) -> float:
        """The per-rank clipping threshold the compressor applies itself (0: it clips nothing)."""
        return 0.0

    def take_clipping(self, clip: float) -> None:
        """``clips_locally`` only, at attach: apply the engine's clipping threshold ``clip`` to each rank's
        gradient instead of DeepSpeed (unless the compressor's own threshold is set)."""
        raise NotImplementedError(f"ds_gravac: compressor '{self.name}' does not clip gradients itself")

    @property
    def server_error_feedback(self) -> bool:
        """Two-round quantized exchanges: whether the owner of a partition keeps an error-feedback residual of
        its re-encoding (the synchronizer ANDs it with the section's ``error_feedback``)."""
        return False

    def cf_grid(self) -> Optional[list[float]]:
        """``None`` if every θ ≥ 1 is realizable, else the sorted realizable CFs."""
        return None

    def realize_cf(self, theta: float) -> float:
        grid = self.cf_grid()
        if grid is None:
            return float(theta)
        for g in grid:
            if g >= theta:
                return float(g)
        return float(grid[-1])

    def plan(self, numel: int, level: float) -> TensorPlan:
        """Cached wrapper around :meth:`make_plan`."""
        key = (int(numel), float(level))
        plan = self._plans.get(key)
        if plan is None:
            plan = self.make_plan(int(numel), float(level))
            self._plans[key] = plan
        return plan

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        raise NotImplementedError

    def tensor_plan(self, shape: Sequence[int], level: float) -> TensorPlan:
        """The plan of one tensor of this shape (low-rank compressors need the matrix shape, not just numel)."""
        return self.plan(math.prod(int(s) for s in shape), level)

    def member_level(self, ctx: "CompressCtx", level: float) -> float:
        """The level a tensor actually uses this step, from the step's level and replicated state only (ACP-SGD
        keeps a Q-step at its P-step's rank)."""
        return level

    def sent_payload_words(self, plan: TensorPlan) -> int:
        """32-bit words this tensor puts on the wire per step, over all rounds."""
        return plan.words

    def wire_layout(self, plan: TensorPlan) -> list[tuple[str, torch.dtype, int]]:
        return [(s.name, s.dtype, s.count) for s in plan.sections]

    def values_sent(self, plan: TensorPlan) -> int:
        return plan.values_sent

    def wire_bytes(self, plan: TensorPlan) -> int:
        return 4 * self.sent_payload_words(plan)

    # ---- encode / decode ---------------------------------------------------------------------------
    def compress(self, x: torch.Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[torch.Tensor]:
        """Encode ``x`` into ``out``. Returns the number of real entries (0-d tensor) for sparsifiers.

        With ``update_state`` the memory rule's update for this payload is applied in the same pass
        (``self.memory.commit``; external EF: ``ctx.residual ← x − D(p)``, ``ctx.residual`` may alias ``x``).
        """
        raise NotImplementedError

    def compress_from(self, p1: Payload, x: torch.Tensor, plan2: TensorPlan, out: Payload,
                      ctx: CompressCtx) -> Optional[torch.Tensor]:
        """Multi-level second stage: derive the payload at ``plan2`` from stage one. Never mutates."""
        raise NotImplementedError(f"ds_gravac: compressor '{self.name}' has no multi-level compression")

    def decompress(self, p: Payload, out: torch.Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        """``out (+)= scale · D(p)``. ``ctx`` identifies the tensor and step (Random-k regenerates indices)."""
        raise NotImplementedError

    def indices(self, numel: int, plan: TensorPlan, ctx: CompressCtx) -> torch.Tensor:
        """``shared_indices`` only: the shared index set this tensor sends at ``plan`` (int64)."""
        raise NotImplementedError(f"ds_gravac: compressor '{self.name}' draws no shared indices")

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> torch.Tensor:
        """``‖D(p)‖²`` as a 0-d float64 tensor, without a dense decode where possible."""
        out = torch.zeros(p.plan.numel, dtype=torch.float32, device=p.words.device)
        self.decompress(p, out, accumulate=False, scale=1.0, ctx=ctx)
        return out.double().square().sum()

    # ---- schedule and replicated state ------------------------------------------------------------
    def effective_cf(self, theta: float, step: int) -> float:
        """Level actually used at ``step`` (DGC's warm-up caps θ); must depend on agreed values only."""
        return theta

    def component_energies(self, ctx: CompressCtx) -> Optional[torch.Tensor]:
        """``aggregate_gain`` only: after :meth:`commit_aggregate`, the energy of each rank-one component of the
        tensor's applied aggregate, in order (``None``: sent plain, or nothing measured this step)."""
        return None

    def step_committed(self, compressed: bool) -> None:
        """Once per finite step after every bucket committed; ``compressed``: some bucket sent a payload."""

    def state_dict(self) -> dict[str, dict[str, Any]]:
        return {"replicated": {}, "local": {}}

    def load_state_dict(self, state: dict[str, dict[str, Any]], world_size_changed: bool = False) -> None:
        """Restore; with ``world_size_changed`` local state is dropped (rule 6)."""


REQUIRED_ATTRS = ("name", "Params", "kind", "rounds", "owns_state", "level_kind", "multilevel", "gain_kind",
                  "server_reencode", "owns_optimizer", "static_only", "update_space", "shared_indices", "clips_locally",
                  "aggregate_gain", "Memory", "exchange", "ladder", "applies_weight_decay",
                  "clip_norm", "server_error_feedback")
REQUIRED_METHODS = ("make_plan", "compress", "decompress", "accepts", "cf_grid", "realize_cf", "sent_sq_norm",
                    "bind_levels", "pin", "default_level", "check_engine", "take_clipping", "indices",
                    "effective_cf", "member_level", "step_committed", "state_dict", "load_state_dict")


def check_contract(cls: type) -> None:
    """Registration-time check that ``cls`` satisfies the contract (required attributes, methods, params model)."""
    if not isinstance(cls, type) or not issubclass(cls, Compressor):
        raise TypeError(f"ds_gravac: {cls!r} must subclass ds_gravac.Compressor")
    for attr in REQUIRED_ATTRS:
        if not hasattr(cls, attr):
            raise TypeError(f"ds_gravac: compressor {cls.__name__} lacks class attribute '{attr}'")
    for meth in REQUIRED_METHODS:
        if not callable(getattr(cls, meth, None)):
            raise TypeError(f"ds_gravac: compressor {cls.__name__} lacks method '{meth}'")
    if (cls.make_plan is Compressor.make_plan or cls.compress is Compressor.compress
            or cls.decompress is Compressor.decompress):
        raise TypeError(f"ds_gravac: compressor {cls.__name__} must implement make_plan, compress, decompress")
    params = cls.Params
    if (not (isinstance(params, type) and issubclass(params, BaseModel))
            or params.model_config.get("extra") != "forbid"):
        raise TypeError(f"ds_gravac: compressor {cls.__name__}.Params must be a pydantic model with extra='forbid'")
    if not isinstance(cls.kind, Kind):
        raise TypeError(f"ds_gravac: compressor {cls.__name__}.kind must be a ds_gravac Kind")
    for attr, value, enum_type in (("level_kind", cls.level_kind, LevelKind),
                                   ("multilevel", cls.multilevel, Multilevel), ("gain_kind", cls.gain_kind, GainKind)):
        if value not in tuple(enum_type):     # a plain string equal to a member's value is accepted
            allowed = ", ".join(repr(m.value) for m in enum_type)
            raise TypeError(f"ds_gravac: compressor {cls.__name__}.{attr} must be a {enum_type.__name__} "
                            f"({allowed}), not {value!r}")
    memory = cls.Memory
    if not (isinstance(memory, type) and issubclass(memory, CompressorMemory)):
        raise TypeError(f"ds_gravac: compressor {cls.__name__}.Memory must be a CompressorMemory subclass")
    if cls.owns_state and (not memory.slots or memory.input_slot not in memory.slots):
        raise TypeError(f"ds_gravac: compressor {cls.__name__} owns state: its Memory must name its slots and "
                        f"which of them is the input_slot")
