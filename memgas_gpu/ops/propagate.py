"""Seed selection and propagation over a block-diagonal graph (read path, steps
"seeds" and "propagate").

Many conversations share one graph whose blocks (conversations) never exchange mass,
so the k-th query of every conversation can share PageRank row k
(:func:`query_waves`): a LongMemEval run, one question per haystack, needs one row.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .ppr import personalized_pagerank

__all__ = ["seed_scores", "query_waves", "propagate"]


def seed_scores(node_scores: Tensor, alpha: int = 15, valid: Optional[Tensor] = None) -> Tensor:
    """Keep the top-``alpha`` node scores per row (threshold semantics, ties kept).

    ``scores[scores < topk(scores, alpha)[-1]] = 0`` as in the authors' code, then
    negative and NaN entries become 0.

    Args:
        node_scores: ``[Q, n]`` weighted similarities.
        alpha: number of seeds (default 15); ``min(alpha, n_valid)`` is used.
        valid: optional ``[Q, n]`` bool mask of real nodes (padding gets 0).

    Returns:
        ``[Q, n]`` seed weights (same dtype), non-negative.
    """
    x = node_scores
    key = torch.where(torch.isnan(x), torch.full_like(x, float("-inf")), x)
    if valid is not None:
        key = torch.where(valid, key, torch.full_like(key, float("-inf")))
    k = max(1, min(alpha, x.shape[1]))
    if x.shape[1] == 0:
        return x.clone()
    # rows with fewer than alpha valid nodes get kth = -inf: all of them are kept
    kth = torch.topk(key, k, dim=1).values[:, -1:]
    out = torch.where(key < kth, torch.zeros_like(x), x)
    out = torch.where(torch.isnan(out) | (out < 0), torch.zeros_like(out), out)
    if valid is not None:
        out = torch.where(valid, out, torch.zeros_like(out))
    return out


def query_waves(query_conversation: Tensor) -> Tuple[Tensor, int]:
    """PageRank row of each query when conversations share rows (``blocks`` mode).

    The k-th query of every conversation goes to row k, so ``n_rows`` is the largest
    number of queries of one conversation: 1 for LongMemEval.

    Returns:
        ``(row [Q] int64, n_rows)``.
    """
    q = query_conversation.to(torch.int64)
    order = torch.argsort(q, stable=True)
    sorted_c = q[order]
    first = torch.searchsorted(sorted_c, sorted_c, right=False)
    row = torch.empty_like(q)
    row[order] = torch.arange(q.numel(), device=q.device) - first
    return row, (int(row.max().item()) + 1 if q.numel() else 0)


def propagate(seeds: Tensor, node_pos: Tensor, valid: Tensor, query_conversation: Tensor,
              indptr: Tensor, indices: Tensor, blocks: Tensor, damping: float = 0.1,
              tol: float = 1e-10, max_iter: int = 100, backend: str = "auto") -> Tensor:
    """Personalized PageRank from every query's seeds; the mass on its own nodes.

    Args:
        seeds: ``[Q, m]`` non-negative seed weights of each query's candidate nodes.
        node_pos: ``[Q, m]`` int64 graph node id of each candidate.
        valid: ``[Q, m]`` bool, False for padding.
        query_conversation: ``[Q]`` block (conversation) of each query.
        indptr, indices: symmetric block-diagonal CSR graph over all ``n`` nodes.
        blocks: ``[n]`` int64 block id per node.
        damping, tol, max_iter, backend: see :func:`~memgas_gpu.ops.personalized_pagerank`.

    Returns:
        ``[Q, m]`` float64 PageRank mass of each candidate node (0 for padding); each
        query's masses sum to 1 over its block (0 when it has no positive seed).
    """
    Q, m = seeds.shape
    n = indptr.numel() - 1
    dev = seeds.device
    slot, R = query_waves(query_conversation.to(dev))
    reset = torch.zeros(R, n, dtype=torch.float64, device=dev)
    rows = slot[:, None].expand(Q, m)
    reset.index_put_((rows[valid], node_pos[valid]), seeds[valid].to(torch.float64),
                     accumulate=True)
    p = personalized_pagerank(indptr.to(dev), indices.to(dev), reset, damping, tol, max_iter,
                              blocks=blocks.to(dev), backend=backend)
    got = p[rows, torch.where(valid, node_pos, torch.zeros_like(node_pos))]
    return torch.where(valid, got, torch.zeros_like(got))
