"""Shared cases of the auto controller tests: a ResNet-like set of shape classes, their dense-step signals
(a 1/k spectrum; a steep or an exactly rank-bounded group on request), a controller bound to an injected link,
and the steps and intervals that drive it."""
from __future__ import annotations

from hypothesis import strategies as st

from ds_gravac.adapt.auto.controller import AutoController
from ds_gravac.adapt.auto.ladder import RANKS
from ds_gravac.adapt.auto.timing import Pricer, link_fits
from ds_gravac.adapt.base import ControllerContext
from ds_gravac.config import parse_config
from ds_gravac.sync.aggregate_gain import AggregateSample, GroupSignal
from ds_gravac.sync.cost_model.fits import FitTable
from ds_gravac.telemetry.stats import AgreedStats

SHAPES = [("stem.weight", (64, 3, 7, 7)), *[(f"a{i}.weight", (256, 2304)) for i in range(4)],
          *[(f"b{i}.weight", (512, 4608)) for i in range(3)], ("fc.weight", (100, 2048))]


def _signals(ctl: AutoController, steep: str = "") -> tuple[GroupSignal, ...]:
    """A dense step's signals: every group's energy and prefix energies of a spectrum ‖c_k‖² ∝ 1/k (group
    ``steep``: ∝ 1/k², at a tenth of the energy — cheap to compress hard, as the LSTM's embedding was)."""
    out = []
    for g in ctl.groups:
        n, m = g.shape
        width = min(n, m, RANKS[0])
        power = 2.0 if g.name == steep else 1.0
        spectrum = [1.0 / k ** power for k in range(1, min(n, m) + 1)]
        energy = (1.0 if g.name == steep else 10.0) * g.count
        scale = energy / sum(spectrum)
        prefix = tuple(scale * sum(spectrum[:r]) if r <= width else None for r in RANKS)
        out.append(GroupSignal(den=energy, applied=energy, prefix=prefix))
    return tuple(out)


def _controller(rate_bit_s: float, remeasured_bit_s: float = 0.0, steep: str = "", dense_bytes: int = 4,
                exact: str = "", **keys: object) -> AutoController:
    """Signals of three steps observed; the link at ``rate_bit_s``, re-timed at ``remeasured_bit_s`` (every
    decision after the first) when given; group ``exact`` has a rank-64 gradient (``_exact_signals``); ``keys``
    override the ``auto`` section."""
    auto = {"interval_steps": 10, "dwell": 0, "remeasure_decisions": 1 if remeasured_bit_s else 0, **keys}
    ctl = AutoController(parse_config({"mode": "auto", "compressor": "powersgd", "auto": auto}))
    ctl.signal_groups(SHAPES)
    fits = FitTable(link_fits(rate_bit_s, 1e-4, 2))
    later = FitTable(link_fits(remeasured_bit_s or rate_bit_s, 1e-4, 2))
    ctl.bind(ControllerContext(world_size=2, samples_per_step=32, realize_cf=float, cf_grid=None,
                               multilevel="none", gain_kind="projection", level_kind="rank",
                               compressible=tuple(n for n, _ in SHAPES), cost_fits=lambda: fits,
                               measure_link=lambda: later, dense_bytes_per_element=dense_bytes))
    for step in range(3):
        _observe(ctl, step, _exact_signals(ctl, exact, 64) if exact else _signals(ctl, steep))
    return ctl


def _observe(ctl: AutoController, step: int, signals: tuple, t_iter: float = 0.0) -> None:
    """One step's agreed statistics: the group signals of ``step`` and the measured time of the step before."""
    sample = AggregateSample(step=step, levels=(), den=0.0, nums=(), groups=signals)
    ctl.observe(AgreedStats(step=step + 1, decision=None, den=0.0, den_raw=0.0, nums=(), t_iter_prev=t_iter,
                            t_gain_prev=0.0, values_sent=0.0, bytes_sent=0.0, nonfinite=0.0, world_size=2,
                            aggregate=sample))


def _plan(rate_bit_s: float) -> tuple[AutoController, list[int], float]:
    ctl = _controller(rate_bit_s)
    quiet = ctl.tight_until                     # the first decision after the tight start
    proposal = ctl.propose(quiet, 0.1)
    ctl.accept(quiet, proposal)
    codes = ctl.codes
    payload = Pricer(FitTable(link_fits(rate_bit_s, 1e-4, 2)), 2).payload(ctl.groups, codes)
    return ctl, codes, payload


def _exchange_s(rate_bit_s: float, groups: list, codes: list[int]) -> float:
    """The plan's exchange seconds, summed here from the pricer's per-level times."""
    return sum(row[c] for row, c in zip(Pricer(FitTable(link_fits(rate_bit_s, 1e-4, 2)), 2).times(groups), codes))


def _scaled(ctl: AutoController, factor: float) -> tuple:
    return tuple(GroupSignal(den=s.den * factor, applied=s.applied * factor,
                             prefix=tuple(None if p is None else p * factor for p in s.prefix)) for s in _signals(ctl))


def _interval(ctl: AutoController, step: int, seconds: float, steep: str = "") -> int:
    """One interval of steps measured at ``seconds`` each; then the decision at its end. Returns that step."""
    for s in range(step, step + ctl.interval):
        _observe(ctl, s, _signals(ctl, steep), t_iter=seconds)
    step += ctl.interval
    ctl.before_proposal(step)
    ctl.accept(step, ctl.propose(step, 0.1))
    return step


def _exact_signals(ctl: AutoController, exact: str, rank: int) -> tuple[GroupSignal, ...]:
    """``_signals``, except that group ``exact`` has a gradient of rank ``rank`` (as a fully connected layer fed
    ``rank`` samples has), its spectrum ∝ 1/k up to there."""
    out = list(_signals(ctl))
    g = next(g for g in ctl.groups if g.name == exact)
    energy = 10.0 * g.count
    spectrum = [1.0 / k for k in range(1, rank + 1)]
    prefix = tuple(energy * sum(spectrum[:r]) / sum(spectrum) for r in RANKS)
    out[g.index] = GroupSignal(den=energy, applied=energy, prefix=prefix)
    return tuple(out)


# values on a grid of quarters: sums are exact in float64, so ties are real and the tie rule is tested
quarters = st.integers(0, 24).map(lambda v: v / 4)


@st.composite
def instances(draw):
    groups = draw(st.integers(1, 5))
    sizes = [draw(st.integers(1, 4)) for _ in range(groups)]
    times = [[draw(quarters) for _ in range(k)] for k in sizes]
    errors = [[draw(quarters) for _ in range(k)] for k in sizes]
    return times, errors, draw(st.integers(0, 60).map(lambda v: v / 4))
