"""One step of PowerSGD and of ACP-SGD for a list of matrices, split at the points where ranks communicate.

The functions only compute; the caller sums their outputs across ranks (an all-reduce) between the stages. Both
compressors and the float64 reference tests run exactly this arithmetic, so what the tests prove (rank-r
recovery, conservation of error feedback, exactness at full rank) holds for the compressors.

PowerSGD, per matrix and step (two dependent rounds)::

    X  = M + E;   Qh = orth(Q_prev)
    round 1:  P_w = X·Qh            → P = Σ_w P_w    (no 1/N: orth is scale-invariant)
    round 2:  Ph = orth(P);  Q_w = Xᵀ·Ph  → Q = Σ_w Q_w / N
    G = Ph·Qᵀ;  E ← X − G;  Q_prev ← Q

ACP-SGD alternates which factor is computed from the *previous* step's shared factor, so each step has one
collective and the local error is known before it::

    P-step:  Qh = orth(Q_prev);  P_w = X·Qh;  E ← X − P_w·Qhᵀ;  P = Σ_w P_w;  G = P·Qhᵀ / N;  P_prev ← P
    Q-step:  Ph = orth(P_prev);  Q_w = Xᵀ·Ph; E ← X − Ph·Q_wᵀ;  Q = Σ_w Q_w;  G = Ph·Qᵀ / N;  Q_prev ← Q
"""
from __future__ import annotations

from typing import Sequence

import torch

from .lowrank import Orthogonalization, orthogonalize

Tensor = torch.Tensor


# ---- PowerSGD ----------------------------------------------------------------------------------------
def powersgd_round1(xs: Sequence[Tensor], q_prev: Sequence[Tensor], orth: Orthogonalization = "qr",
                    eps: float = 1e-8) -> tuple[list[Tensor], list[Tensor]]:
    """``(Qh, P_w)`` per matrix: the orthogonalized warm-start factor and this rank's left factor."""
    qhs = [orthogonalize(q, orth, eps) for q in q_prev]
    return qhs, [x @ qh for x, qh in zip(xs, qhs)]


def powersgd_round2(xs: Sequence[Tensor], p_sums: Sequence[Tensor], orth: Orthogonalization = "qr",
                    eps: float = 1e-8) -> tuple[list[Tensor], list[Tensor]]:
    """``(Ph, Q_w)`` per matrix from the summed left factors."""
    phs = [orthogonalize(p, orth, eps) for p in p_sums]
    return phs, [x.transpose(0, 1) @ ph for x, ph in zip(xs, phs)]


def powersgd_finish(xs: Sequence[Tensor], phs: Sequence[Tensor], q_sums: Sequence[Tensor], world_size: int
                    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """``(G, E_new, Q)`` per matrix: the averaged estimate, this rank's new error, the next warm start.

    The error is ``X − G``: what this rank's input lost against the shared estimate (its mean over ranks is the
    dense average minus G, which is what makes the error-feedback sum telescope)."""
    qs = [q / world_size for q in q_sums]
    gs = [ph @ q.transpose(0, 1) for ph, q in zip(phs, qs)]
    return gs, [x - g for x, g in zip(xs, gs)], qs


# ---- ACP-SGD -----------------------------------------------------------------------------------------
def acp_p_step(xs: Sequence[Tensor], q_prev: Sequence[Tensor], orth: Orthogonalization = "qr",
               eps: float = 1e-8) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """``(Qh, P_w, E_new)`` per matrix for a P-step (all before communication)."""
    qhs = [orthogonalize(q, orth, eps) for q in q_prev]
    pws = [x @ qh for x, qh in zip(xs, qhs)]
    return qhs, pws, [x - pw @ qh.transpose(0, 1) for x, pw, qh in zip(xs, pws, qhs)]


def acp_q_step(xs: Sequence[Tensor], p_prev: Sequence[Tensor], orth: Orthogonalization = "qr",
               eps: float = 1e-8) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """``(Ph, Q_w, E_new)`` per matrix for a Q-step (all before communication)."""
    phs = [orthogonalize(p, orth, eps) for p in p_prev]
    qws = [x.transpose(0, 1) @ ph for x, ph in zip(xs, phs)]
    return phs, qws, [x - ph @ qw.transpose(0, 1) for x, ph, qw in zip(xs, phs, qws)]


def acp_decode_p(p_sums: Sequence[Tensor], qhs: Sequence[Tensor], world_size: int) -> list[Tensor]:
    """``G = P·Qhᵀ / N`` after a P-step's all-reduce (``P`` is also the next ``P_prev``)."""
    return [p @ qh.transpose(0, 1) / world_size for p, qh in zip(p_sums, qhs)]


def acp_decode_q(phs: Sequence[Tensor], q_sums: Sequence[Tensor], world_size: int) -> list[Tensor]:
    """``G = Ph·Qᵀ / N`` after a Q-step's all-reduce (``Q`` is also the next ``Q_prev``)."""
    return [ph @ q.transpose(0, 1) / world_size for ph, q in zip(phs, q_sums)]
