"""MemGAS session scoring (read path): router -> seed nodes -> PPR -> session scores.

For a query ``q`` against a conversation with N sessions and nodes ``v`` (session
``s(v)``, granularity ``g(v)``)::

    w = router(q)                                   (entropy router, [G])
    score_v = w_{g(v)} * <q, x_v>
    seed_v  = score_v if score_v >= (alpha-th largest score) else 0   (ties kept)
    seed_v  = 0 where seed_v < 0 or NaN
    p = PPR(graph, reset = seed / sum(seed), damping d)   (igraph prpack semantics)
    session_i = sum_{v : s(v) = i} p_v

Ablations: ``use_ppr=False`` scores sessions by the summed seeds (``no_ppr``);
``use_router=False`` uses uniform weights ``1/G`` (``no_router``). Defaults follow the
paper: lambda = 0.2, alpha = 15, d = 0.1, router ``"inverse"`` (``w ∝ 1/H``).

This is the single-conversation op on raw tensors (a readable statement of the
algorithm, and what the parity tests compare with the per-query reference).  Indexes
of many conversations are scored by the one read path of
:mod:`memgas_gpu.retrieve.engine`, whose ``memgas`` preset composes the same stages.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .ppr import personalized_pagerank
from .propagate import seed_scores
from .router import entropy_router

__all__ = ["memgas_session_scores"]


def _route(sims: Tensor, gran: Tensor, sess: Tensor, valid: Optional[Tensor], G: int, N: int,
           temperature: float, router: str, use_router: bool) -> Tensor:
    """Router weights ``[Q, G]`` from node similarities ``[Q, n]``."""
    Q = sims.shape[0]
    if not use_router:
        return torch.full((Q, G), 1.0 / G, dtype=sims.dtype, device=sims.device)
    flat = gran * N + sess  # [n] or [Q, n]
    if flat.dim() == 1:
        flat = flat[None, :].expand(Q, -1)
    dump = G * N
    if valid is not None:
        flat = torch.where(valid, flat, torch.full_like(flat, dump))
    S = torch.zeros(Q, G * N + 1, dtype=sims.dtype, device=sims.device)
    S.scatter_(1, flat, sims)
    ok = torch.zeros(Q, G * N + 1, dtype=torch.bool, device=sims.device)
    ok.scatter_(1, flat, torch.ones_like(flat, dtype=torch.bool))
    return entropy_router(S[:, :dump].view(Q, G, N), temperature, router,
                          ok[:, :dump].view(Q, G, N))


def memgas_session_scores(
    query_emb: Tensor,
    node_emb: Tensor,
    session_of_node: Tensor,
    gran_of_node: Tensor,
    indptr: Tensor,
    indices: Tensor,
    *,
    n_sessions: Optional[int] = None,
    n_gran: Optional[int] = None,
    temperature: float = 0.2,
    alpha: int = 15,
    damping: float = 0.1,
    router: str = "inverse",
    use_router: bool = True,
    use_ppr: bool = True,
    tol: float = 1e-10,
    max_iter: int = 100,
    backend: str = "auto",
) -> Tensor:
    """MemGAS session scores of queries against ONE conversation.

    Args:
        query_emb: ``[Q, d]`` (or ``[d]``) query embeddings.
        node_emb: ``[n, d]`` node embeddings of the conversation.
        session_of_node: ``[n]`` session index in ``[0, n_sessions)`` per node.
        gran_of_node: ``[n]`` granularity index in ``[0, n_gran)`` per node; the router
            expects at most one node per (granularity, session): ``gran_emb[g][i]``.
        indptr, indices: symmetric CSR association graph over the ``n`` nodes.
        n_sessions: N (default ``session_of_node.max() + 1``).
        n_gran: G (default ``gran_of_node.max() + 1``).
        temperature: router temperature lambda (default 0.2).
        alpha: number of seed nodes (default 15).
        damping: PPR damping d (default 0.1).
        router: ``"inverse"`` (paper, default) or ``"one_minus"`` (authors' code).
        use_router: False gives uniform weights (``no_router`` ablation).
        use_ppr: False scores sessions by summed seeds (``no_ppr`` ablation).
        tol: PPR L1 tolerance (default 1e-10).
        max_iter: PPR iterations (default 100).
        backend: PPR backend, ``"auto"`` (default), ``"native"`` or ``"torch"`` (see
            :func:`~memgas_gpu.ops.ppr.personalized_pagerank`).

    Returns:
        ``[Q, N]`` float64 session scores (``[N]`` for a 1-D query); rank descending.
    """
    squeeze = query_emb.dim() == 1
    q = query_emb[None, :] if squeeze else query_emb
    dev = node_emb.device
    sess = session_of_node.to(device=dev, dtype=torch.int64)
    gran = gran_of_node.to(device=dev, dtype=torch.int64)
    N = int(sess.max().item()) + 1 if n_sessions is None else int(n_sessions)
    G = int(gran.max().item()) + 1 if n_gran is None else int(n_gran)
    dt = torch.float64 if node_emb.dtype == torch.float64 else torch.float32
    sims = q.to(device=dev, dtype=dt) @ node_emb.to(dt).T  # [Q, n]
    w = _route(sims, gran, sess, None, G, N, temperature, router, use_router)
    seeds = seed_scores(w[:, gran] * sims, alpha).to(torch.float64)
    if use_ppr:
        p = personalized_pagerank(indptr, indices, seeds, damping, tol, max_iter,
                                  backend=backend)
    else:
        p = seeds
    out = torch.zeros(q.shape[0], N, dtype=torch.float64, device=dev)
    out.index_add_(1, sess, p)
    return out[0] if squeeze else out
