"""Fusion of routed signals into session or node scores (read path, step "fuse").

Given normalised signals ``z [Q, S, N]`` and router weights ``w [Q, S]``:

* :func:`weighted_sum`: ``score_i = Σ_s w_s z_{s,i}`` (``fusion="sum"``);
* :func:`reciprocal_rank_fusion`: ``score_i = Σ_s w_s / (k + rank_s(i))`` with rank 1
  for the best session of signal ``s`` (``fusion="rrf"``, k = 60 as Cormack et al.);
* :func:`node_scores`: the weighted signals added onto the granularity node each one
  is attached to, ``[Q, G, N]``, ready for seed selection and propagation;
* :func:`sum_granularities`: session score = its G node scores added in node order.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["weighted_sum", "reciprocal_rank_fusion", "node_scores", "sum_granularities"]


def weighted_sum(z: Tensor, w: Tensor) -> Tensor:
    """``[Q, N]`` = Σ_s ``w[:, s] * z[:, s]``."""
    return (w[..., None] * z).sum(1)


def reciprocal_rank_fusion(z: Tensor, w: Tensor, valid: Tensor, k: float = 60.0) -> Tensor:
    """``[Q, N]`` = Σ_s ``w[:, s] / (k + rank_s)``; rank 1 is the best valid session of
    signal ``s`` (ties broken by session order); padding ranks last."""
    key = torch.where(valid[:, None], z, torch.full_like(z, float("-inf")))
    order = torch.argsort(key, dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(1, z.shape[-1] + 1, device=z.device).expand_as(order))
    return (w[..., None] / (k + rank.to(z.dtype))).sum(1)


def node_scores(z: Tensor, w: Tensor, node_of_signal: Sequence[int], n_gran: int) -> Tensor:
    """``[Q, G, N]``: ``w_s z_s`` added onto node ``node_of_signal[s]`` of each session."""
    Q, S, N = z.shape
    out = torch.zeros(Q, n_gran, N, dtype=z.dtype, device=z.device)
    idx = torch.as_tensor(list(node_of_signal), dtype=torch.long, device=z.device)
    return out.index_add_(1, idx, w[..., None] * z)


def sum_granularities(x: Tensor) -> Tensor:
    """``[Q, G, N] -> [Q, N]``, adding the G node scores of a session in node order
    (sequentially, so the bits do not depend on the reduction kernel)."""
    out = x[:, 0].clone()
    for g in range(1, x.shape[1]):
        out += x[:, g]
    return out
