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

Every metric counts *distinct gold ids*: a session id present twice in a haystack
(the loaders drop such repeats, but an index or a caller may still hold them) counts
once, at its best-ranked position.  So the number of gold ids found in the top k never
decreases with k, and ``recall_any@k`` and ``recall_all@k`` are monotonic in k by
construction (``ndcg_any@k`` is not monotonic in k by its definition).
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
    """``[Q, N]`` gold identity and ``[Q]`` number of distinct gold ids per question.

    Entry ``[i, j]`` is the index (in first-seen order) of the gold id that session j of
    question i's haystack carries, or -1 if it is not gold; two positions holding the
    same id get the same index.  ``relevant >= 0`` is the plain relevance mask.
    """
    q = len(corpus_ids)
    n_max = n_max if n_max is not None else max((len(c) for c in corpus_ids), default=0)
    rel = torch.full((q, n_max), -1, dtype=torch.long)
    n_gold = torch.zeros(q, dtype=torch.long)
    for i, (ids, g) in enumerate(zip(corpus_ids, gold)):
        gs = {x: n for n, x in enumerate(dict.fromkeys(g))}
        n_gold[i] = len(gs)
        for j, cid in enumerate(ids):
            slot = gs.get(cid)
            if slot is not None:
                rel[i, j] = slot
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
        relevant: ``[Q, N]``: the gold identity of :func:`gold_mask` (int, -1 where
            not gold; equal values are one gold id), or a bool mask (each True
            position a gold id of its own).
        n_gold: ``[Q]`` distinct gold ids per question (including ids not in the
            haystack).
        ks: cut-offs.
        strict: recall_all of a question without gold is NaN instead of 1.0.

    Returns:
        ``{"recall_any@k": Tensor[Q], "recall_all@k": ..., "ndcg_any@k": ...}`` (float64).
    """
    q, n = relevant.shape
    dev = relevant.device
    if relevant.dtype == torch.bool:
        pos = torch.arange(n, device=dev).expand(q, n)
        slot = torch.where(relevant, pos, torch.full_like(pos, -1))
    else:
        slot = relevant.long()
    if rankings.shape[1] == 0 or n == 0:
        ranked = torch.full((q, rankings.shape[1]), -1, dtype=torch.long, device=dev)
    else:
        ranked = torch.gather(slot, 1, rankings.clamp(0, n - 1))
        ranked = torch.where(rankings >= 0, ranked, torch.full_like(ranked, -1))  # [Q, R]
    # a position counts only where its gold id is seen for the first time in the ranking
    r_len = ranked.shape[1]
    w = max(n, int(slot.max()) + 1 if slot.numel() else 0)  # gold ids; column w: not gold
    col = torch.where(ranked >= 0, ranked, torch.full_like(ranked, w))
    order = torch.arange(r_len, device=dev).expand(q, r_len)
    first = torch.full((q, w + 1), r_len, dtype=torch.long, device=dev)
    first = first.scatter_reduce(1, col, order, reduce="amin")
    hit = (ranked >= 0) & (torch.gather(first, 1, col) == order)  # [Q, R]
    present = torch.zeros(q, w + 1, dtype=torch.bool, device=dev)
    present.scatter_(1, torch.where(slot >= 0, slot, torch.full_like(slot, w)), True)
    n_present = present[:, :w].sum(1)
    out: dict[str, Tensor] = {}
    cum = hit.cumsum(1)
    for k in ks:
        kk = min(k, hit.shape[1])
        got = cum[:, kk - 1] if kk > 0 else torch.zeros(q, dtype=torch.long, device=dev)
        out[f"recall_any@{k}"] = (got > 0).double()
        ra = (got >= n_gold.to(dev)).double()  # got <= n_gold: distinct ids
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
