"""Retrieval metrics with the LongMemEval / MemGAS reference semantics, batched.

For a ranking of a conversation's N sessions and its gold session ids:

* ``recall_any@k`` — 1 if any gold session is in the top k;
* ``recall_all@k`` — 1 if every gold session is in the top k.  The reference uses
  Python's ``all([])`` so a question with no gold counts 1.0 (``strict=False``,
  for parity); ``strict=True`` gives NaN for those so averages skip them;
* ``ndcg_any@k`` — binary relevance, LongMemEval's DCG (``rel[0] +
  Σ_{i≥1} rel[i] / log2(i + 1)``, 0-based i), ideal DCG from all gold sessions
  present in the haystack; 0 when none is present.

A gold id absent from the haystack can never be recalled (recall_all is then 0).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["KS", "retrieval_metrics", "metric_names", "gold_mask"]

#: cut-offs reported by the reference harness
KS = (1, 3, 5, 10, 30, 50)


def metric_names(ks: Sequence[int] = KS) -> list[str]:
    return [f"{m}@{k}" for k in ks for m in ("recall_any", "recall_all", "ndcg_any")]


def gold_mask(corpus_ids: Sequence[Sequence[str]], gold: Sequence[Sequence[str]],
              n_max: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """``[Q, N]`` relevance mask and ``[Q]`` number of distinct gold ids per question."""
    q = len(corpus_ids)
    n_max = n_max if n_max is not None else max((len(c) for c in corpus_ids), default=0)
    rel = torch.zeros(q, n_max, dtype=torch.bool)
    n_gold = torch.zeros(q, dtype=torch.long)
    for i, (ids, g) in enumerate(zip(corpus_ids, gold)):
        gs = set(g)
        n_gold[i] = len(gs)
        for j, cid in enumerate(ids):
            if cid in gs:
                rel[i, j] = True
    return rel, n_gold


def _discounts(k: int, device) -> Tensor:
    pos = torch.arange(k, device=device, dtype=torch.float64)
    d = 1.0 / torch.log2(pos + 1.0).clamp_min(1.0)  # rel[0] undiscounted, then 1/log2(i+1)
    return d


def retrieval_metrics(rankings: Tensor, relevant: Tensor, n_gold: Tensor,
                      ks: Sequence[int] = KS, strict: bool = False) -> dict[str, Tensor]:
    """Per-question metrics for a batch of rankings.

    Args:
        rankings: ``[Q, >=max(ks)]`` or ``[Q, N]`` session indices, best first (padding
            may be -1: it is never relevant).
        relevant: ``[Q, N]`` bool, True where the session is gold.
        n_gold: ``[Q]`` distinct gold ids per question (including ids not in the
            haystack).
        ks: cut-offs.
        strict: recall_all of a question without gold is NaN instead of 1.0.

    Returns:
        ``{"recall_any@k": Tensor[Q], "recall_all@k": ..., "ndcg_any@k": ...}`` (float64).
    """
    q, n = relevant.shape
    dev = relevant.device
    safe = rankings.clamp_min(0)
    hit = torch.gather(relevant, 1, safe) & (rankings >= 0)  # [Q, R]
    n_present = relevant.sum(1)
    out: dict[str, Tensor] = {}
    cum = hit.cumsum(1)
    for k in ks:
        kk = min(k, hit.shape[1])
        got = cum[:, kk - 1] if kk > 0 else torch.zeros(q, dtype=torch.long, device=dev)
        out[f"recall_any@{k}"] = (got > 0).double()
        ra = (got == n_gold.to(dev)).double()
        if strict:
            ra = torch.where(n_gold.to(dev) == 0, torch.full_like(ra, math.nan), ra)
        out[f"recall_all@{k}"] = ra
        disc = _discounts(kk, dev)
        dcg = (hit[:, :kk].double() * disc).sum(1)
        ideal_len = torch.clamp(n_present, max=kk)
        cdisc = torch.cat([torch.zeros(1, dtype=torch.float64, device=dev), disc.cumsum(0)])
        idcg = cdisc[ideal_len]
        out[f"ndcg_any@{k}"] = torch.where(idcg > 0, dcg / idcg.clamp_min(1e-300),
                                           torch.zeros_like(dcg))
    return out
