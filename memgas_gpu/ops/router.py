"""Entropy-based granularity router (MemGAS read path, step 1).

For a query ``q`` and each granularity ``g`` (session, turns, summary, keywords) with
session embeddings ``X_g = [x_{g,1} .. x_{g,N}]``::

    p_g = softmax(sim(q, X_g) / lambda)          over the N sessions
    H_g = -sum_i p_{g,i} log(p_{g,i} + 1e-12)     (the authors' code adds 1e-12)

A confident (peaked) granularity has low entropy and gets a high weight:

* ``mode="inverse"`` (paper, default): ``w_g = (1 / H_g) / sum_h (1 / H_h)``, with
  ``H_g`` clamped to at least ``eps`` (default 1e-12) so that a one-hot distribution
  (``H = 0``) gets a finite, dominant weight instead of inf/NaN.
* ``mode="one_minus"`` (authors' code): ``w_g = (1 - H_g) / sum_h (1 - H_h)``. It is
  ill-posed once ``H_g > 1`` (any N >= 3 with a flat distribution): weights can be
  negative or the denominator can vanish. Reproduced as is for parity.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..choices import ROUTER_MODES

__all__ = ["entropy_router", "router_weights", "ROUTER_MODES"]


def entropy_router(
    sims: Tensor,
    temperature: float = 0.2,
    mode: str = "inverse",
    valid: Optional[Tensor] = None,
    *,
    eps: float = 1e-12,
) -> Tensor:
    """Router weights from precomputed similarities.

    Args:
        sims: ``[Q, G, N]`` similarity of each query to the N sessions of each
            granularity (padded when conversations of different sizes are batched).
        temperature: softmax temperature ``lambda`` (default 0.2).
        mode: ``"inverse"`` (paper, default) or ``"one_minus"`` (authors' code).
        valid: optional bool mask broadcastable to ``[Q, G, N]`` (e.g. ``[Q, 1, N]`` for
            padded sessions, or ``[Q, G, N]`` for a missing granularity of a session);
            invalid entries get probability 0. A granularity with no valid session gets
            ``H = 0``.
        eps: lower clamp of ``H`` in ``"inverse"`` mode (default 1e-12).

    Returns:
        ``[Q, G]`` weights summing to 1 over G (float32 or the input's float64).
    """
    if mode not in ROUTER_MODES:
        raise ValueError(f"unknown router mode {mode!r}; expected one of {ROUTER_MODES}")
    if sims.dim() != 3:
        raise ValueError(f"sims must be [Q, G, N], got shape {tuple(sims.shape)}")
    dt = torch.float64 if sims.dtype == torch.float64 else torch.float32
    z = sims.to(dt) / temperature
    if valid is not None:
        valid = valid.to(device=z.device, dtype=torch.bool).expand_as(z)
        z = torch.where(valid, z, torch.full_like(z, float("-inf")))
    p = torch.softmax(z, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # rows with no valid entry
    H = -(p * torch.log(p + 1e-12)).sum(dim=-1)  # [Q, G]
    if mode == "inverse":
        w = 1.0 / H.clamp_min(eps)
    else:
        w = 1.0 - H
    return w / w.sum(dim=-1, keepdim=True)


def router_weights(
    query_emb: Tensor,
    gran_emb: Tensor,
    temperature: float = 0.2,
    mode: str = "inverse",
    *,
    eps: float = 1e-12,
) -> Tensor:
    """Router weights ``w[q, g]`` for queries against one conversation.

    Args:
        query_emb: ``[Q, d]`` (or ``[d]``) query embeddings.
        gran_emb: ``[G, N, d]`` session embeddings per granularity.
        temperature: softmax temperature ``lambda`` (default 0.2).
        mode: ``"inverse"`` (paper, ``w ∝ 1/H``, default) or ``"one_minus"``
            (authors' code, ``w ∝ 1 - H``).
        eps: lower clamp of ``H`` in ``"inverse"`` mode (default 1e-12).

    Returns:
        ``[Q, G]`` weights (``[G]`` for a 1-D query), summing to 1.
    """
    squeeze = query_emb.dim() == 1
    q = query_emb[None, :] if squeeze else query_emb
    sims = torch.einsum("qd,gnd->qgn", q, gran_emb.to(q.dtype))
    w = entropy_router(sims, temperature, mode, eps=eps)
    return w[0] if squeeze else w
