"""Ranking: the one place where scores become session rankings."""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["rank_sessions"]


def rank_sessions(scores: Tensor, n_sessions: Tensor) -> Tensor:
    """Rank each row's sessions by descending score (ties: earlier session first).

    Args:
        scores: ``[Q, N]`` session scores (padding ignored whatever its value).
        n_sessions: ``[Q]`` number of real sessions of each row.

    Returns:
        ``[Q, N]`` int64 session positions, best first, ``-1`` past ``n_sessions``.
    """
    pos = torch.arange(scores.shape[1], device=scores.device)[None, :]
    n = n_sessions.to(scores.device)[:, None]
    key = torch.where(pos < n, scores, torch.full_like(scores, float("-inf")))
    rk = torch.argsort(key, dim=1, descending=True, stable=True)
    return torch.where(pos < n, rk, torch.full_like(rk, -1))
