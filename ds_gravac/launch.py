"""Compression for a DeepSpeed script that does not know ds_gravac.

``deepspeed --num_gpus N --module ds_gravac.launch train.py <its arguments>`` (or ``python -m ds_gravac.launch``,
``torchrun -m ds_gravac.launch``) runs ``train.py`` unchanged, as its own ``__main__``, after replacing
``deepspeed.initialize``: every engine it returns whose DeepSpeed config has a top-level ``"gravac"`` section is
taken over exactly as ``ds_gravac.initialize`` would take it over; engines without one are returned untouched.

Why a launcher module rather than an import hook: the switch is one word on the command line, the script and its
configs stay as they are, and nothing happens to processes that do not go through it.
"""
from __future__ import annotations

import os
import runpy
import sys
from typing import Any, Optional

USAGE = ("usage: deepspeed [launcher options] --module ds_gravac.launch SCRIPT.py [script arguments]\n"
         "       python -m ds_gravac.launch SCRIPT.py [script arguments]")


def initialize_and_attach(*args: Any, **kwargs: Any) -> tuple:
    """``deepspeed.initialize`` that attaches ds_gravac to engines whose config has a ``"gravac"`` section."""
    from . import _initialize
    return _initialize(args, kwargs, gravac=None, require_section=False)


def install() -> None:
    """Replace ``deepspeed.initialize`` (idempotent; DeepSpeed's own function was captured when ds_gravac was
    imported, so the replacement never calls itself)."""
    import deepspeed
    import ds_gravac  # noqa: F401  (captures DeepSpeed's initialize before it is replaced)
    deepspeed.initialize = initialize_and_attach


def split_argv(argv: list[str]) -> tuple[list[str], str, list[str]]:
    """``(launcher arguments, script, script arguments)``: the deepspeed launcher puts ``--local_rank=N`` before
    the script; it is handed on to the script, which is where DeepSpeed scripts expect it."""
    lead = []
    while argv and argv[0].startswith("--local_rank"):
        lead.append(argv.pop(0))
    if not argv or argv[0].startswith("-"):
        raise SystemExit(f"ds_gravac.launch: no script given\n{USAGE}")
    script, rest = argv[0], argv[1:]
    if not os.path.isfile(script):
        raise SystemExit(f"ds_gravac.launch: script {script!r} not found\n{USAGE}")
    return lead, script, rest


def main(argv: Optional[list[str]] = None) -> None:
    lead, script, rest = split_argv(list(sys.argv[1:] if argv is None else argv))
    install()
    sys.argv = [script, *lead, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))    # as `python script.py` would
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
