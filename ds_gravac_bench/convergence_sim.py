"""Independent convergence check: N simulated ranks in one process, no ds_gravac, no torch.distributed.

Why: when a compressed benchmark run lags DeepSpeed dense in loss, this separates "the algorithm converges
slower on this task" from "ds_gravac synchronizes wrongly". It replays the benchmark's training (same synthetic
CIFAR-10 data, model, batch per rank, SGD momentum and weight decay) with the update rules written out directly:

* ``dense``   – mean of the ranks' gradients, momentum SGD with weight decay (what DeepSpeed dense computes);
* ``eftopk``  – per rank ``x = g + r``, send exact Top-k of ``x`` (tensors under ``--min-numel`` dense),
  ``r = x - sent``; mean of the sent values into momentum SGD (Top-k with error feedback);
* ``dgc``     – per rank ``u = m·u + g + wd·w``, ``v = v + u``, send exact Top-k of ``v``, zero ``v`` (and ``u``
  unless ``--no-masking``) at the sent indices; plain SGD on the mean (DGC's update rules, with exact
  selection instead of sampling);
* ``ef21``    – per rank a gradient estimate ``h``: send exact Top-k of ``g - h``, ``h += sent``; the shared
  estimate ``H`` (the mean of the ranks' ``h``) grows by the mean of the sent values and goes into momentum SGD
  (EF21: what is sent corrects an estimate instead of delivering a delayed residual);
* ``ef21m``   – EF21 on the local momentum: per rank ``u = m·u + g + wd·w``, send Top-k of ``u - h``,
  ``h += sent``; plain SGD on the mean of the ranks' ``h`` (the estimate tracks the slowly turning momentum
  instead of the noisy gradient; EF21-SGDM).

Prints the 10-step mean training loss; ``--out`` writes every step's loss as JSON.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from runners.data import SyntheticImageDataset
from runners.models import build_model

MODES = ("dense", "eftopk", "dgc", "ef21", "ef21m")


def topk_keep(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense tensor holding only the k largest-magnitude entries of x, their flat indices)."""
    flat = x.reshape(-1)
    idx = flat.abs().topk(k).indices
    kept = torch.zeros_like(flat)
    kept[idx] = flat[idx]
    return kept.view_as(x), idx


class SimulatedRanks:
    """Replicated parameters, per-rank compressor memory and the shared optimizer state of one mode."""

    def __init__(self, params: list[torch.Tensor], mode: str, cf: float, ranks: int, lr: float,
                 momentum: float, weight_decay: float, min_numel: int, masking: bool = True) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: choose one of {', '.join(MODES)}")
        if cf < 1:
            raise ValueError(f"cf {cf}: must be >= 1")
        self.params, self.mode, self.cf, self.ranks = params, mode, cf, ranks
        self.lr, self.m, self.wd, self.min_numel, self.masking = lr, momentum, weight_decay, min_numel, masking
        self.memory = [[torch.zeros_like(p) for p in params] for _ in range(ranks)]     # r (eftopk) / v (dgc)
        self.momentum = [[torch.zeros_like(p) for p in params] for _ in range(ranks)]   # u (dgc)
        self.buf = [torch.zeros_like(p) for p in params]                                # optimizer momentum
        self.estimate = [torch.zeros_like(p) for p in params]                           # H (ef21)

    def _k(self, numel: int) -> int:
        return max(1, math.ceil(numel / self.cf))

    @torch.no_grad()
    def step(self, grads: list[list[torch.Tensor]]) -> None:
        """Apply one optimizer step from every rank's local gradients ``grads[rank][param]``."""
        for j, p in enumerate(self.params):
            if self.mode == "ef21m" and p.numel() >= self.min_numel:
                total = torch.zeros_like(p)
                for r in range(self.ranks):
                    u, h = self.momentum[r][j], self.memory[r][j]
                    u.mul_(self.m).add_(grads[r][j]).add_(p, alpha=self.wd)
                    kept, _ = topk_keep(u - h, self._k(p.numel()))
                    h.add_(kept)
                    total += h
                p.sub_(total / self.ranks, alpha=self.lr)
                continue
            if self.mode == "dgc":
                total = torch.zeros_like(p)
                for r in range(self.ranks):
                    u, v = self.momentum[r][j], self.memory[r][j]
                    u.mul_(self.m).add_(grads[r][j]).add_(p, alpha=self.wd)
                    v.add_(u)
                    kept, idx = topk_keep(v, self._k(v.numel()))
                    v.view(-1)[idx] = 0.0
                    if self.masking:
                        u.view(-1)[idx] = 0.0
                    total += kept
                p.sub_(total / self.ranks, alpha=self.lr)
                continue
            total = torch.zeros_like(p)
            for r in range(self.ranks):
                if self.mode == "dense" or p.numel() < self.min_numel:
                    total += grads[r][j]
                    continue
                if self.mode == "ef21":
                    kept, _ = topk_keep(grads[r][j] - self.memory[r][j], self._k(p.numel()))
                    self.memory[r][j] += kept
                    total += kept
                    continue
                x = grads[r][j] + self.memory[r][j]
                kept, _ = topk_keep(x, self._k(x.numel()))
                self.memory[r][j] = x - kept
                total += kept
            if self.mode == "ef21" and p.numel() >= self.min_numel:
                mean = self.estimate[j].add_(total, alpha=1.0 / self.ranks)     # the shared estimate is the mean
            else:
                mean = total / self.ranks
            g = mean + self.wd * p
            self.buf[j].mul_(self.m).add_(g)
            p.sub_(self.buf[j], alpha=self.lr)


def run(model_name: str, mode: str, cf: float, steps: int, ranks: int = 2, batch: int = 32, lr: float = 0.001,
        momentum: float = 0.9, weight_decay: float = 1e-4, min_numel: int = 16384, masking: bool = True,
        seed: int = 1234, dtype: torch.dtype = torch.float32, every: int = 10) -> tuple[list[float], list[torch.Tensor]]:
    """Train for ``steps``; return the mean over ranks of each step's training loss and the final parameters."""
    torch.manual_seed(seed)
    data = SyntheticImageDataset(10, steps * ranks * batch, seed=seed)
    model = build_model(model_name, num_classes=10).to(dtype)
    params = list(model.parameters())
    sim = SimulatedRanks(params, mode, cf, ranks, lr, momentum, weight_decay, min_numel, masking)
    losses: list[float] = []
    for step in range(steps):
        grads, step_loss = [], 0.0
        for r in range(ranks):
            first = (step * ranks + r) * batch
            xs, ys = zip(*(data[i] for i in range(first, first + batch)))
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(torch.stack(xs).to(dtype)), torch.tensor(ys))
            loss.backward()
            step_loss += loss.item() / ranks
            grads.append([p.grad.detach().clone() for p in params])
        sim.step(grads)
        losses.append(step_loss)
        if every and (step + 1) % every == 0:
            print(f"{mode} cf {cf:g} step {step + 1}: mean loss of the last {every} = "
                  f"{sum(losses[-every:]) / every:.3f}", flush=True)
    return losses, [p.detach() for p in params]


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet101")
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--cf", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--no-masking", action="store_true", help="dgc: keep u at sent entries (momentum_masking false)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    losses, _ = run(a.model, a.mode, a.cf, a.steps, ranks=a.ranks, lr=a.lr, masking=not a.no_masking)
    if a.out:
        a.out.write_text(json.dumps({"model": a.model, "mode": a.mode, "cf": a.cf, "lr": a.lr,
                                     "ranks": a.ranks, "masking": not a.no_masking, "losses": losses}))


if __name__ == "__main__":
    main()
