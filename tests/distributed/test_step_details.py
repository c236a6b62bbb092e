"""Controller inputs and codec work per step, checked against independent measurements on real 2-rank runs:
the pipelined decision's dense-step timing subtracts the previous step's probe time, the raw gain denominator
includes dense-classified tensors, strict decisions never compress a level twice, per-step records are bounded,
payload buffers of levels no longer used are released, and checkpoint loads say what differs and drop the
statistics of the step that was running."""
from __future__ import annotations

import collections
import logging

import pytest
import torch

import gravac_jobs as G
import models as M
from harness import run_ranks

GRAVAC = {**G.GRAVAC, "window": 12, "refresh_steps": 3, "min_sent_steps": 3}


def _observe_spy(handle) -> list:
    seen = []
    observe = handle.controller.observe

    def spy(stats):
        seen.append(stats)
        observe(stats)
    handle.controller.observe = spy
    return seen


def _timing_job(rank: int, world: int, clipping: float = 0.0) -> dict:
    """GraVAC with probes every step: what the controller receives vs what each rank measured. ``clipping`` > 0:
    local clipping at ``clipping/√N`` per tensor."""
    import ds_gravac
    model = M.make_model(width=128)
    raw: dict[int, list[float]] = collections.defaultdict(list)     # step -> ‖g‖² per tensor, float64
    current = {"step": 0}
    for p in model.parameters():   # registered before ds_gravac's hooks: the raw accumulated gradient
        p.register_post_accumulate_grad_hook(
            lambda t: raw[current["step"]].append(float(t.grad.double().square().sum())))
    gravac = {**GRAVAC, "gain_denominator": "raw", "min_compress_numel": 5000}
    extra = {"gradient_clipping": clipping} if clipping > 0.0 else {}
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(
        {**gravac, "local_clipping": clipping > 0.0}, **extra))
    handle = ds_gravac.get_handle(engine)
    seen = _observe_spy(handle)
    records = []
    for s in range(20):
        current["step"] = s
        M.train(engine, rank, 1, start=s)
        records.extend(handle.pop_stats())
    return {"probe_s": {r["step"]: r["probe_s"] for r in records}, "raw": dict(raw),
            "observed": [(a.step, a.t_gain_prev, a.den_raw) for a in seen]}


@pytest.fixture(scope="module")
def timing() -> list:
    return run_ranks(_timing_job, 2)


def test_dense_step_timing_subtracts_the_previous_steps_probe_time(timing: list) -> None:
    r0, r1 = timing
    checked = 0
    for step, t_gain_prev, _ in r0["observed"]:
        if step >= 1:
            want = (r0["probe_s"][step - 1] + r1["probe_s"][step - 1]) / 2
            assert t_gain_prev == pytest.approx(want, rel=1e-12), step
            checked += 1
    assert checked >= 15 and any(r0["probe_s"][s] > 0 for s in r0["probe_s"])


def test_raw_denominator_includes_dense_classified_tensors(timing: list) -> None:
    r0, r1 = timing
    for step, _, den_raw in r0["observed"]:
        want = sum(r0["raw"][step]) + sum(r1["raw"][step])      # ‖g‖² of every tensor of both ranks, float64
        assert den_raw == pytest.approx(want, rel=1e-5), step


CLIPPING = 0.3      # each rank clips per tensor at 0.3/√2: some of this model's gradients are above it, some below


def test_raw_denominator_counts_gradients_as_locally_clipped() -> None:
    r0, r1 = run_ranks(_timing_job, 2, CLIPPING)
    cap = CLIPPING ** 2 / 2
    squares = [sq for r in (r0, r1) for step in r["raw"] for sq in r["raw"][step]]
    assert any(sq > cap for sq in squares) and any(sq < cap for sq in squares)      # the cap matters here
    for step, _, den_raw in r0["observed"]:
        want = sum(min(sq, cap) for r in (r0, r1) for sq in r["raw"][step])
        assert den_raw == pytest.approx(want, rel=1e-5), step


def _strict_job(rank: int, world: int) -> dict:
    """Count every compression of every (step, tensor, level) with a plug-in that wraps Top-k."""
    import ds_gravac
    from ds_gravac.compress.registry import lookup

    TopK = lookup("topk")
    counts: collections.Counter = collections.Counter()

    class CountingTopK(TopK):
        def compress(self, x, plan, out, ctx, update_state):
            counts[(ctx.step, ctx.key, plan.level)] += 1
            return super().compress(x, plan, out, ctx, update_state)

        def compress_from(self, p1, x, plan2, out, ctx):
            counts[(ctx.step, ctx.key, plan2.level)] += 1
            return super().compress_from(p1, x, plan2, out, ctx)

    ds_gravac.register_compressor("countingtopk", CountingTopK, overwrite=True)
    model = M.make_model(width=128)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(
        {**GRAVAC, "compressor": "countingtopk", "decision": "strict"}))
    handle = ds_gravac.get_handle(engine)
    branches = []
    for s in range(24):
        M.train(engine, rank, 1, start=s)
        branches.append(handle.last_stats()["branch"])
    return {"counts": dict(counts), "branches": branches}


def test_strict_decision_compresses_each_level_once() -> None:
    res = run_ranks(_strict_job, 2)[0]
    assert {"min", "cand"} & set(res["branches"]), res["branches"]
    twice = {k: v for k, v in res["counts"].items() if v > 1}
    assert not twice, sorted(twice.items())[:5]


def _bounded_job(rank: int, world: int) -> dict:
    import ds_gravac
    import ds_gravac.sync.statistics as statistics
    statistics.RECORDS_KEPT = 10
    model = M.make_model()
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(
        {**GRAVAC, "window": 6, "refresh_steps": 2, "min_sent_steps": 2, "theta_min": 2, "theta_max": 200,
         "epsilon": 0.05}))
    handle = ds_gravac.get_handle(engine)
    used, leftovers = [], []
    for s in range(40):
        M.train(engine, rank, 1, start=s)
        rec = handle.last_stats()
        used.append(rec["cf_sent"])
        for codec in getattr(handle.sync, "codecs", {}).values():   # internal: payload layouts still allocated
            leftovers.append(len(codec._layouts))
    return {"steps": [r["step"] for r in handle.pop_stats()], "sent": used, "layouts": max(leftovers, default=99)}


def test_records_and_payload_buffers_are_bounded() -> None:
    res = run_ranks(_bounded_job, 2)[0]
    assert res["steps"] == list(range(30, 40))
    assert len(set(res["sent"])) >= 3, res["sent"]        # several levels were sent over the run ...
    assert res["layouts"] <= 1                            # ... but only the current one keeps its buffers


def _checkpoint_job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    grabbed: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            grabbed.append(record.getMessage())
    logging.getLogger("ds_gravac").addHandler(Grab())

    def engine_with(gravac: dict):
        model = M.make_model()
        return ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                    config=M.ds_config(gravac))[0]

    # one run saves at step 6 (as an older package version) and goes on; then loads step 6 again mid-run
    live = engine_with(GRAVAC)
    handle = ds_gravac.get_handle(live)
    M.train(live, rank, 6)
    real_version = ds_gravac.version.__version__
    ds_gravac.version.__version__ = "0.0.1"
    handle.save_checkpoint(save_dir, tag="mid")
    ds_gravac.version.__version__ = real_version
    M.train(live, rank, 4, start=6)
    handle.load_checkpoint(save_dir, tag="mid")
    M.train(live, rank, 6, start=6)
    # a fresh process-like engine resumes from the same checkpoint
    fresh = engine_with(GRAVAC)
    ds_gravac.get_handle(fresh).load_checkpoint(save_dir, tag="mid")
    M.train(fresh, rank, 6, start=6)
    # a different section: the keys that differ are named
    grabbed.clear()
    other = engine_with({**GRAVAC, "epsilon": 0.5})
    ds_gravac.get_handle(other).load_checkpoint(save_dir, tag="mid")
    timing = {"t_sys", "t_iter", "thru"}
    state = lambda e: {k: v for k, v in ds_gravac.get_handle(e).controller.state_dict().items()  # noqa: E731
                       if k not in timing}
    return {"live": (M.params_of(live), state(live)), "fresh": (M.params_of(fresh), state(fresh)),
            "warnings": list(grabbed)}


def test_checkpoint_load_mid_run_and_differences(tmp_path) -> None:
    for res in run_ranks(_checkpoint_job, 2, str(tmp_path)):
        live_params, live_state = res["live"]
        fresh_params, fresh_state = res["fresh"]
        assert live_state == fresh_state
        for key in fresh_params:
            assert torch.equal(live_params[key], fresh_params[key]), key
        text = "\n".join(res["warnings"])
        assert "checkpoint written by ds_gravac 0.0.1" in text
        assert "epsilon (0.6 -> 0.5)" in text


def _switch_job(rank: int, world: int, reset: bool) -> dict:
    """Accordion with ``reset_ef_on_switch``: at the decision point of a switch, the switched tensors' residuals
    are read (by a hook that runs right after ds_gravac's first hook of the step, before anything commits)."""
    import ds_gravac
    model = M.make_model(width=128)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(
        {"mode": "accordion", "compressor": "topk", "min_compress_numel": 1000, "bucket_cap_mb": 0.05,
         "accordion": {"interval_steps": 4, "eta": 0.2, "low_compression": 4, "high_compression": 50,
                       "reset_ef_on_switch": reset}}))
    handle = ds_gravac.get_handle(engine)
    seen: dict[int, dict[str, float]] = {}
    current = {"step": -1}

    def read(_: torch.Tensor) -> None:
        step = int(engine.global_steps)
        if step != current["step"] and engine.is_gradient_accumulation_boundary():
            current["step"] = step
            slots = handle.state_dict()["local"]["memory"]["slots"]["residual"]
            seen[step] = {name: float(t.norm()) for name, t in slots.items()}
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(read)
    M.train(engine, rank, 24)
    switches = [e for e in handle.pop_events() if e["event"] == "accordion_switch"]
    return {"seen": seen, "switches": switches}


@pytest.fixture(scope="module")
def switch_runs() -> dict:
    """Both settings on one spawn of the ranks (rank 0's view)."""
    return run_ranks(_switch_jobs, 2)[0]


def _switch_jobs(rank: int, world: int) -> dict:
    return {reset: _switch_job(rank, world, reset) for reset in (True, False)}


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "keep"])
def test_accordion_reset_ef_on_switch(switch_runs: dict, reset: bool) -> None:
    res = switch_runs[reset]
    assert res["switches"], "the run must switch levels at least once"
    for event in res["switches"]:
        names = event["to_low"] + event["to_high"]
        norms = [res["seen"][event["step"]][n] for n in names]
        before = [res["seen"][event["step"] - 1][n] for n in names]
        assert any(v > 0.0 for v in before), "the switched tensors held a residual one step earlier"
        if reset:
            assert all(v == 0.0 for v in norms), (event, norms)
        else:
            assert any(v > 0.0 for v in norms), (event, norms)
