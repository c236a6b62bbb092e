"""Rank functions for the GraVAC/Accordion training tests (importable by spawned ranks)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

import models as M

# omega 0: saturation needs exactly equal throughputs, so the run is independent of wall-clock timing and
# decisions are reproducible between runs (saturation itself is covered by the controller unit tests).
GRAVAC = {"mode": "gravac", "compressor": "topk", "theta_min": 4, "theta_max": 100, "epsilon": 0.6,
          "omega": 0.0, "window": 40, "refresh_steps": 5, "min_sent_steps": 5, "bucket_cap_mb": 0.05,
          "min_compress_numel": 1000}


class Teacher(nn.Module):
    """Fixed random teacher whose labels are *sampled* from its softmax: learnable, with an irreducible loss
    floor (like real data), so final losses of different synchronization methods are comparable."""

    def __init__(self, temperature: float = 0.15) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.lin = nn.Linear(32, 10)
        self.temperature = temperature

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        probs = torch.softmax(self.lin(x) / self.temperature, dim=1)
        return torch.multinomial(probs, 1, generator=gen).view(-1)


def run(rank: int, gravac: dict, steps: int, grad_scale: float = 1.0, save: Optional[str] = None,
        resume: Optional[str] = None, start: int = 0, lr: float = 0.05) -> dict[str, Any]:
    """Train with ds_gravac; returns losses, per-step records (branch, cf_sent) and final parameters."""
    import ds_gravac
    model = M.make_model(seed=0, width=128, depth=4)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(gravac, micro=16, lr=lr))
    handle = ds_gravac.get_handle(engine)
    if resume is not None:
        handle.load_checkpoint(resume, tag="mid")
    teacher = Teacher()
    losses, records = [], []
    for s in range(start, start + steps):
        x, _ = M.batch(rank, s, micro=16)
        labels = teacher(x, torch.Generator().manual_seed(7919 * s + rank))
        loss = nn.functional.cross_entropy(engine(x), labels) * grad_scale
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()) / grad_scale)
        records.extend(handle.pop_stats())
    if save is not None:
        handle.save_checkpoint(save, tag="mid")
    keep = ("step", "branch", "cf_sent", "bytes_sent", "dense_bytes", "gravac/theta_c", "gravac/theta_min",
            "gravac/phase")
    return {"losses": losses, "records": [{k: r.get(k) for k in keep} for r in records],
            "events": handle.pop_events(), "params": M.params_of(engine),
            "state": handle.controller.state_dict()}
