"""A training script written the way DeepSpeed's own examples are (argparse with ``deepspeed.add_config_arguments``,
``deepspeed.initialize(args=..., model=..., model_parameters=..., training_data=...)``, the engine's data loader).
It never imports ds_gravac unless ``--edited`` (the one-line edit a user would make: ``ds_gravac.initialize``)."""
import argparse
import sys

import deepspeed
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--out", required=True)
parser.add_argument("--edited", action="store_true")
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
g = torch.Generator().manual_seed(1)
xs = torch.randn(512, 32, generator=g)
data = torch.utils.data.TensorDataset(xs, xs[:, :4].argmax(dim=1))
if args.edited:
    import ds_gravac
    initialize = ds_gravac.initialize
else:
    initialize = deepspeed.initialize
engine, optimizer, loader, _ = initialize(args=args, model=model, model_parameters=model.parameters(),
                                          training_data=data)
for step, (x, y) in enumerate(loader):
    loss = nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
    if step + 1 == args.steps:
        break
if engine.global_rank == 0:
    taken_over = "ds_gravac" in sys.modules and sys.modules["ds_gravac"].get_handle(engine) is not None
    torch.save({"params": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
                "taken_over": taken_over}, args.out)
