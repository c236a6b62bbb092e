"""A user's script that ends without any teardown of its own: attach, train a few steps, fall off the end.

An ``atexit`` function registered before ds_gravac is imported runs after ds_gravac's exit hook (last in, first
out) and records, per rank, what that hook left: ds_gravac's groups must be destroyed (their gloo threads stopped
before interpreter finalization), the default group untouched."""
from __future__ import annotations

import atexit
import json
import sys
from pathlib import Path

import torch
import torch.distributed as tdist

OUT = Path(sys.argv[1])
seen: dict = {}


def after_ds_gravac() -> None:
    live = []
    for group in seen["groups"]:
        try:
            tdist.get_process_group_ranks(group)
            live.append(True)
        except (ValueError, RuntimeError, KeyError):
            live.append(False)
    (OUT / f"rank{seen['rank']}.json").write_text(json.dumps({
        "groups": len(seen["groups"]), "live": live, "channels_left": len(seen["handle"].channels.groups),
        "default_group": tdist.is_initialized()}))


atexit.register(after_ds_gravac)

import deepspeed  # noqa: E402
from torch import nn  # noqa: E402

import ds_gravac  # noqa: E402

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0, "steps_per_print": 10**9,
          "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
          "gravac": {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": 0}}
engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=config)
seen.update(rank=tdist.get_rank(), handle=ds_gravac.get_handle(engine),
            groups=list(ds_gravac.get_handle(engine).channels.groups))
for step in range(3):
    x = torch.randn(4, 16)
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()
