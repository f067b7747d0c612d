"""Per-query normalisation of retrieval signals (read path, step "normalise").

Signals live on different scales: cosines in [-1, 1] and compressed (most sessions
within 0.1 of each other for MiniLM), BM25 unbounded and dependent on query length and
IDF.  Normalising each signal over the sessions of the query's conversation makes
them commensurable before routing and fusion (docs/algorithm.md, "Read path").
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..choices import NORMS

__all__ = ["NORMS", "normalise_signals"]


def normalise_signals(x: Tensor, valid: Tensor, norm: str = "z") -> Tensor:
    """Normalise every signal over the valid sessions of its query.

    Args:
        x: ``[Q, S, N]`` raw signals (S signals over N sessions, padded).
        valid: ``[Q, N]`` bool, True for the query's real sessions.
        norm: ``"z"``: ``(x - mean) / std`` (sample std, ddof 1, floored at 1e-12);
            ``"max"``: ``x / |max|``; ``"minmax"``: ``(x - min) / (max - min)``;
            ``"none"``: ``x`` unchanged (same dtype, same bits).

    Returns:
        ``[Q, S, N]`` normalised signals; padding is 0.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    v = valid[:, None, :]
    if norm == "none":
        return torch.where(v, x, torch.zeros_like(x))
    cnt = v.sum(-1, keepdim=True).clamp_min(1).to(x.dtype)
    xm = torch.where(v, x, torch.zeros_like(x))
    if norm == "z":
        mean = xm.sum(-1, keepdim=True) / cnt
        var = (torch.where(v, x - mean, torch.zeros_like(x)) ** 2).sum(-1, keepdim=True)
        sd = (var / (cnt - 1).clamp_min(1)).sqrt()
        out = (x - mean) / sd.clamp_min(1e-12)
    else:
        mx = torch.where(v, x, torch.full_like(x, float("-inf"))).amax(-1, keepdim=True)
        if norm == "max":
            out = x / mx.abs().clamp_min(1e-12)
        else:
            mn = torch.where(v, x, torch.full_like(x, float("inf"))).amin(-1, keepdim=True)
            out = (x - mn) / (mx - mn).clamp_min(1e-12)
    return torch.where(v, out, torch.zeros_like(out))
