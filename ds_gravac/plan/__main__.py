"""Command line of ``python -m ds_gravac.plan`` (see the package docstring; docs/configuration.md)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import NoReturn, Optional, Sequence

from .compute import plan_engine
from .offline import PlanInputError, build_engine, load_model, parse_rate, read_config, release
from .report import as_json, as_text

USAGE_ERROR = 2
DESCRIPTION = ("What attach would do with a DeepSpeed config and a model, without training: each bucket's compressor, "
               "level and bytes against dense, the cost model's predicted exchange on a nominal link, and every "
               "refusal attach would raise (exit status 2).")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ds_gravac.plan", description=DESCRIPTION)
    parser.add_argument("config", help="DeepSpeed JSON config with a \"gravac\" section")
    parser.add_argument("--model", required=True,
                        help="a torchvision model name (weights=None), or module:callable returning an nn.Module")
    parser.add_argument("--world-size", type=int, default=2, help="ranks of the run (default 2)")
    parser.add_argument("--rate", default="1gbit", help="link rate of the predicted step (default 1gbit)")
    parser.add_argument("--alpha-s", type=float, default=1e-3,
                        help="latency of one collective on that link, seconds (default 0.001)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.world_size < 2:
            raise PlanInputError(f"--world-size {args.world_size}: must be >= 2 (with one rank attach stays "
                                 f"passive: nothing is exchanged)")
        if not (math.isfinite(args.alpha_s) and args.alpha_s >= 0):
            raise PlanInputError(f"--alpha-s {args.alpha_s}: must be a latency >= 0 in seconds")
        rate = parse_rate(args.rate)
        config = read_config(args.config)
        model = load_model(args.model)
        params = sum(p.numel() for p in model.parameters())     # before ZeRO-3 would partition them away
        engine = build_engine(config, model, args.world_size)
    except PlanInputError as exc:
        print(f"ds_gravac.plan: {exc}", file=sys.stderr)
        return USAGE_ERROR
    try:
        plan = plan_engine(engine, args.world_size, rate, args.alpha_s)
    finally:
        release()
    if args.json:
        print(json.dumps(as_json(plan), indent=1))
    else:
        print(as_text(plan, f"ds_gravac plan: {args.config}, model {args.model} ({params:,} parameters), "
                            f"{args.world_size} ranks"))
    return USAGE_ERROR if plan.refusals else 0


def exit_without_finalizing(status: int) -> NoReturn:
    """Hand the status to the OS once the report is out, skipping the interpreter's finalization. Why: DeepSpeed
    keeps the throwaway engine, and with it its gloo groups' run-loop threads, reachable from module globals (ZeRO-3
    adds a second group); CPython 3.11 ends a thread that asks for the GIL during finalization with a forced unwind,
    which aborts inside gloo's noexcept run loop ("terminate called without an active exception", exit -6 in about
    one run in ten). Nothing of the tool's own needs a finalizer."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_without_finalizing(main())
