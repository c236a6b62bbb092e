"""What the ``mode: "auto"`` distributed tests watch on a real engine (importable by spawned ranks): every step's
bucket actions, the agreed per-group signals the controller observes, and one step's local gradients."""
from __future__ import annotations

from typing import Any, Callable


def watch(engine: Any, probe: int, signal: Callable[[Any], tuple]) -> dict:
    """Record ``actions[step]`` (compressed, levels) per bucket, ``signals[step]`` (``signal(group_signal)`` per
    group) and ``grads`` (this rank's gradients of step ``probe``, float64)."""
    import ds_gravac
    handle = ds_gravac.get_handle(engine)
    seen: dict = {"actions": {}, "signals": {}, "grads": {}}
    planner, ctl = handle.sync.planner, handle.controller
    step_plan, observe = planner.step_plan, ctl.observe

    def recorded_plan(step: int, decision: Any) -> Any:
        plan = step_plan(step, decision)
        seen["actions"][step] = [(a.compressed, a.levels) for a in plan.actions]
        return plan

    def recorded_observe(stats: Any) -> None:
        if stats.aggregate is not None:
            seen["signals"][stats.aggregate.step] = [signal(s) for s in stats.aggregate.groups]
        observe(stats)
    planner.step_plan, ctl.observe = recorded_plan, recorded_observe
    for name, p in engine.module.named_parameters():
        p.register_hook(lambda g, name=name: seen["grads"].__setitem__(name, g.detach().double().clone())
                        if engine.global_steps == probe else None)
    return seen


def records(engine: Any, keep: tuple[str, ...] = ("step", "branch", "bytes_sent", "dense_bytes", "nonfinite")
            ) -> list[dict]:
    """The step records' kept keys and every ``auto/`` key."""
    import ds_gravac
    return [{k: v for k, v in r.items() if k in keep or k.startswith("auto/")}
            for r in ds_gravac.get_handle(engine).pop_stats()]


def engine_of(section: dict, world: int, width: int) -> Any:
    """A ThreeBucketNet of ``width`` under ds_gravac with this ``"gravac"`` section (seed 0: the same on every
    rank and run)."""
    import ds_gravac
    import models as M
    model = M.make_model(seed=0, width=width)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(section, world=world))
    return engine


def group_of(res: dict) -> dict[str, int]:
    """Member name → group index, from a job's ``groups`` ((name, members, …) per group)."""
    return {m: g for g, group in enumerate(res["groups"]) for m in group[1]}


TIMED = ("auto/measured_step_s", "auto/predicted_step_s")     # this machine's step times: differ between runs


def check_resume(res: dict) -> None:
    """The resumed run's parameters and untimed records equal the uninterrupted run's."""
    import torch
    for name, value in res["params"].items():
        assert torch.equal(value, res["resumed_params"][name]), name
    straight = {int(r["step"]): r for r in res["records"]}
    for rec in res["resumed_records"]:
        assert ({k: v for k, v in rec.items() if k not in TIMED}
                == {k: v for k, v in straight[int(rec["step"])].items() if k not in TIMED}), rec["step"]


def check_bucket_levels(res: dict, cf_of: Callable[[float], float]) -> None:
    """Every step, every bucket: sent dense when the step is dense or its group's logged level is 0 (dense),
    else compressed at ``cf_of(level)`` on every member; and something was compressed."""
    owner, names = group_of(res), [g[0] for g in res["groups"]]
    recs = {int(r["step"]): r for r in res["records"]}
    compressed_somewhere = False
    for step, actions in res["actions"].items():
        for (compressible, members), (compressed, levels) in zip(res["buckets"], actions):
            level = recs[step][f"auto/level/{names[owner[members[0]]]}"] if compressible else 0.0
            if recs[step]["branch"] == "dense" or level == 0.0:
                assert not compressed, (step, members)
            else:
                assert compressed and set(levels) == {cf_of(level)}, (step, members, levels)
                compressed_somewhere = True
    assert compressed_somewhere


def poisoned_step(engine: Any, rank: int, step: int) -> tuple[dict, dict, dict, dict]:
    """Train step ``step`` with rank 1's gradient of one tensor NaN, then one finite step: the controller state
    before the poisoned step, after it, after the next one (which would carry its signals), and its record."""
    import ds_gravac
    import models as M
    ctl = ds_gravac.get_handle(engine).controller
    records(engine)                     # drop the earlier records
    before = ctl.state_dict()
    engine.module.hidden[0].weight.register_hook(
        lambda g: g.clone().fill_(float("nan")) if rank == 1 and engine.global_steps == step else g)
    M.train(engine, rank, 1, start=step)
    after = ctl.state_dict()
    M.train(engine, rank, 1, start=step + 1)
    return before, after, ctl.state_dict(), records(engine)[0]


def check_poisoned(res: dict, step: int) -> None:
    """Nothing of a non-finite step reaches the state: not at the step, and its signals are not sent with the next
    (whose statistics carry no sample, so no group's sample count moves)."""
    before, after, following, record = res["poisoned"]
    assert record["step"] == step and record["nonfinite"] == 1
    assert after == before and any(before["signals"]["n_energy"])
    assert following["signals"]["n_energy"] == after["signals"]["n_energy"]
