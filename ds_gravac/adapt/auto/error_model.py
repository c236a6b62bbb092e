"""Error per level, measured on the *averaged* update — what the optimizer applies — never per rank.

Two kinds of error, in different units of learning, so the solver budgets each family on its own:

* **Unbiased quantizers (QSGD)** add variance and delay nothing. QSGD rounds ``v_i = s·x_i/ν_b`` (ν_b the L2
  norm of block b) up with probability ``p_i = v_i − ⌊v_i⌋`` and decodes ``ν_b·code/s``, so each value adds
  ``(ν_b/s)²·p_i(1 − p_i)``; ranks round independently and the update is their mean, hence

      V = N⁻² Σ_ranks Σ_blocks (ν_b/s)² Σ_{i∈b} p_i(1 − p_i)

  (:func:`qsgd_variance`; a uniform sample of blocks, scaled up, estimates it without encoding anything). With
  ``S = E‖ḡ‖²`` a step makes progress ``≈ S/(S + V)`` of a dense step (:func:`efficiency`). This is the
  all-gather exchange (N = 2); CaSync-PS re-rounds the owner's mean and adds that rounding's V once more.
* **Error-feedback compressors** send late what they do not send now; the error is the energy of the averaged
  update left for later, ``‖x̄ − G‖²`` with ``x̄`` the ranks' mean input and ``G`` the applied aggregate:
  - low rank: ``G_r = Ph_r·Ph_rᵀ·x̄`` is an orthogonal projection, so ``‖x̄ − G_r‖² = ‖x̄‖² − Σ_{k≤r} ‖c_k‖²``,
    with ``c_k`` the averaged factor's components (:func:`lowrank_unsent`, from the energies PowerSGD records
    for ``sync/aggregate_gain.py``; every lower rank is a prefix). Each rank's own residual also holds its
    deviation from the mean, which the averaged factors cancel: it is never used.
  - sparsifiers: each rank sends its own top-k, so ``G = N⁻¹ Σ_w T_k(x_w)`` and what stays is the *pooled*
    residual ``N⁻¹ Σ_w (x_w − T_k(x_w))``; levels are nested (a smaller k is a prefix of the same order), so one
    sort per rank gives every level (:func:`sparse_unsent`).

The solver budgets error feedback in **residual in flight** (:func:`residual_in_flight`), not in unsent energy:
a level that sends the fraction ``δ = 1 − u`` of what reaches it each step holds, in steady state, a memory ``M``
with ``M = (1 − δ)(M + S)``, i.e. ``M = S·u/(1 − u)`` — energy waits ``1/δ`` steps on average. Unsent energy
``S·u`` is nearly flat where ``u`` is near 1 (the LSTM's 10,000 × 200 embedding leaves 88% unsent at rank 16 and
98% at rank 2: 1.1× the error, but a seventh of the sent energy); the residual in flight is 7.2·S against 54·S.

Everything is float64, and the functions are pure: the same tensors give the same numbers on every rank.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ...compress.base import k_for

Tensor = torch.Tensor
F64 = torch.float64


# ---- unbiased quantizers ---------------------------------------------------------------------------------
def qsgd_variance(x: Tensor, levels: int, block: int = 128, blocks: Optional[Tensor] = None) -> float:
    """``Σ_blocks (ν_b/s)² Σ_i p_i(1 − p_i)`` of one rank's flat input (QSGD with ``s = levels`` and blocks of
    ``block`` values; the last block zero-padded as the compressor does). ``blocks``: indices of a uniform
    sample of blocks, whose sum is scaled by ``blocks_total / len(blocks)`` (unbiased)."""
    if levels < 1 or block < 1:
        raise ValueError(f"ds_gravac: QSGD levels {levels} and block {block} must be >= 1")
    flat = x.detach().reshape(-1).to(F64)
    total = -(-flat.numel() // block)
    if total == 0:
        return 0.0
    rows = torch.nn.functional.pad(flat, (0, total * block - flat.numel())).view(total, block)
    if blocks is not None:
        rows = rows.index_select(0, blocks.to(torch.int64))
    nu = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    safe = torch.where(nu > 0, nu, torch.ones_like(nu))
    v = rows * (levels / safe)
    p = v - torch.floor(v)
    per_block = (nu.squeeze(1) / levels).square() * (p * (1.0 - p)).sum(dim=1)
    scale = total / rows.shape[0] if blocks is not None and rows.shape[0] else 1.0
    return float(per_block.sum()) * scale


def averaged_qsgd_variance(xs: Sequence[Tensor], levels: int, block: int = 128) -> float:
    """``V`` of the mean of the ranks' independently rounded inputs: ``N⁻² Σ_w qsgd_variance(x_w)``."""
    n = len(xs)
    return sum(qsgd_variance(x, levels, block) for x in xs) / (n * n) if n else 0.0


def efficiency(signal: float, variance: float) -> float:
    """Progress of a step relative to dense, ``S/(S + V)`` (1 without signal or variance)."""
    return 1.0 if signal + variance <= 0 else signal / (signal + variance)


def variance_budget(signal: float, e_min: float) -> float:
    """The largest ``Σ V`` with ``S/(S + ΣV) ≥ e_min``: the unbiased families' budget for the solver."""
    if not 0.0 < e_min <= 1.0:
        raise ValueError(f"ds_gravac: e_min must be in (0, 1] (got {e_min})")
    return signal * (1.0 / e_min - 1.0)


# ---- error feedback ---------------------------------------------------------------------------------------
UNSENT_MAX = 1.0 - 1e-6      # a level sending (next to) nothing: a residual of 10⁶·S, large and finite


def residual_in_flight(unsent: float, energy: float) -> float:
    """``S·u/(1 − u)`` with ``S = energy`` and ``u = unsent/energy`` clamped to ``[0, UNSENT_MAX]``: the
    steady-state error-feedback memory of a level that leaves the fraction ``u`` of each step's energy for later
    (0 without energy)."""
    if not energy > 0.0:
        return 0.0
    u = min(max(float(unsent) / float(energy), 0.0), UNSENT_MAX)
    return float(energy) * u / (1.0 - u)


# ---- error feedback: low rank ----------------------------------------------------------------------------
def lowrank_unsent(mean_sq_norm: float, energies: Tensor, ranks: Sequence[int]) -> list[float]:
    """``‖x̄‖² − Σ_{k≤r} e_k`` for every ``r`` of ``ranks`` (clamped at 0: the estimate of ``‖x̄‖²`` may be
    sampled). ``energies``: the per-component energies of the averaged factor, most energetic first; a rank
    beyond them is an error (the step did not compute it)."""
    e = energies.detach().to(F64).reshape(-1)
    cum = torch.cat([torch.zeros(1, dtype=F64), torch.cumsum(e, 0)])
    out = []
    for r in ranks:
        if not 0 <= r < cum.numel():
            raise ValueError(f"ds_gravac: rank {r} beyond the {e.numel()} component energies measured")
        out.append(max(0.0, float(mean_sq_norm) - float(cum[r])))
    return out


def averaged_factor_energies(xs: Sequence[Tensor], qh: Tensor) -> Tensor:
    """One PowerSGD step's component energies ``‖c_k‖²`` of the averaged update, float64: ``P = Σ_w X_w·Qh``,
    ``Ph = orth(P)``, ``C = N⁻¹ Σ_w X_wᵀ·Ph``. ``qh``: an ``m × R`` orthonormal basis (the warm start)."""
    n = len(xs)
    mats = [x.detach().to(F64) for x in xs]
    q = qh.detach().to(F64)
    p = sum(x @ q for x in mats)
    ph = torch.linalg.qr(p, mode="reduced")[0]
    c = sum(x.t() @ ph for x in mats) / n
    return c.square().sum(dim=0)


def svd_unsent(xbar: Tensor, ranks: Sequence[int]) -> list[float]:
    """``Σ_{k>r} σ_k²`` of the mean input: the unsent energy once the warm start has converged to the top singular
    subspace (Eckart–Young), the low-rank error an offline replay can compute from one gradient."""
    s = torch.linalg.svdvals(xbar.detach().to(F64))
    tail = torch.cat([torch.flip(torch.cumsum(torch.flip(s.square(), [0]), 0), [0]), torch.zeros(1, dtype=F64)])
    return [float(tail[min(int(r), s.numel())]) for r in ranks]


# ---- error feedback: sparsifiers -------------------------------------------------------------------------
def sparse_unsent(xs: Sequence[Tensor], cfs: Sequence[float]) -> list[float]:
    """``‖N⁻¹ Σ_w (x_w − T_k(x_w))‖²`` for ``k = k_for(θ, n)`` of every CF θ: each rank keeps its k largest
    magnitudes (ties: the lower index, the canonical rule of ``compress/sparse_select.py``). Nested: one sort per
    rank, then the pooled residual is updated from the largest CF down, touching each sent value once."""
    if not xs:
        return [0.0] * len(cfs)
    n, numel = len(xs), xs[0].numel()
    flats = [x.detach().reshape(-1).to(F64) for x in xs]
    resid = sum(flats) / n
    energy = float(torch.dot(resid, resid))
    order = sorted(range(len(cfs)), key=lambda j: (-float(cfs[j]), j))       # fewest kept values first
    ks = [k_for(float(cfs[j]), numel) for j in order]
    top = [torch.sort(f.abs(), descending=True, stable=True)[1][:max(ks, default=0)] for f in flats]
    out = [0.0] * len(cfs)
    done = 0
    for j, k in zip(order, ks):
        if k > done:
            for f, idx_all in zip(flats, top):
                idx = idx_all[done:k]
                old = resid[idx]
                new = old - f[idx] / n
                energy += float(torch.dot(new, new) - torch.dot(old, old))
                resid[idx] = new
            done = k
        out[j] = max(0.0, energy)
    return out


def sq_norm(x: Tensor) -> float:
    """``‖x‖²`` in float64."""
    f = x.detach().reshape(-1).to(F64)
    return float(torch.dot(f, f))


__all__ = ["qsgd_variance", "averaged_qsgd_variance", "efficiency", "variance_budget", "residual_in_flight",
           "UNSENT_MAX", "lowrank_unsent",
           "averaged_factor_energies", "svd_unsent", "sparse_unsent", "sq_norm"]
