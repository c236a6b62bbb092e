"""What a user sees when ds_gravac takes an engine over, and when ``ds_gravac.launch`` does not: one printed line on
rank 0 naming what is compressed, and a warning through DeepSpeed's logger for a config without a ``"gravac"``
section (with the misspelled key it has, if any) — a user otherwise cannot tell a compressed run from a plain one."""
from __future__ import annotations

import contextlib
import io
import logging

import models as M
from harness import run_ranks

STATIC = {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": 1000}


def _job(rank: int, world: int) -> dict:
    from deepspeed.utils import logger

    import ds_gravac
    from ds_gravac.launch import initialize_and_attach
    seen: list[tuple[int, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "ds_gravac" in record.getMessage():
                seen.append((record.levelno, record.getMessage()))
    keep = Keep()
    logger.addHandler(keep)
    try:
        model = M.make_model()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                              config=M.ds_config(STATIC, world=world))
        attached = [line for line in out.getvalue().splitlines() if "ds_gravac" in line]
        plain = M.make_model()
        cfg = M.ds_config(None, world=world)
        cfg["gravc"] = {}                                       # a misspelled section: plain DeepSpeed
        other, *_ = initialize_and_attach(model=plain, model_parameters=plain.parameters(), config=cfg)
        warned = list(seen)
    finally:
        logger.removeHandler(keep)
    members = ds_gravac.get_handle(engine).sync.members
    return {"attached": attached, "warned": warned, "handle_of_plain": ds_gravac.get_handle(other) is not None,
            "counts": (sum(m.compressible for m in members), len(members))}


def test_rank0_says_what_it_compresses_and_the_launcher_warns_without_a_section() -> None:
    r0, r1 = run_ranks(_job, 2)
    compressed, total = r0["counts"]
    assert 0 < compressed < total
    assert len(r0["attached"]) == 1 and r1["attached"] == []
    line = r0["attached"][0]
    assert line.startswith("ds_gravac: attached,")
    assert f"ds_gravac: attached, mode static, topk at CF 10: {compressed} of {total} gradient tensors" in line
    assert "python -m ds_gravac.plan" in line
    assert len(r0["warned"]) == 1 and r1["warned"] == [] and not r0["handle_of_plain"]
    level, line = r0["warned"][0]
    assert level == logging.WARNING
    assert 'no "gravac" section (the config has "gravc": did you mean "gravac"?)' in line
    assert "runs plain DeepSpeed" in line
