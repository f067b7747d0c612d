"""Batched retrieval over a :class:`~memgas_gpu.retrieve.index.MemoryIndex`.

Every question of the index (or a chosen subset) is answered in one pass: the
sessions of each question's conversation are gathered into a padded
``[Q, N_max]`` layout and scored with one batched product (flat methods), or by
:func:`memgas_gpu.ops.memgas_session_scores_packed` (MemGAS and its ablations),
where the k-th question of every conversation shares one personalized-PageRank
row over the block-diagonal graph, since conversations never exchange mass.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import ops
from .index import N_GRAN, MemoryIndex

__all__ = ["METHODS", "Retrieval", "SearchParams", "retrieve"]

#: flat methods and the granularity they score (index into S, T, U, K; "hybrid" aside)
FLAT = {"session": 0, "turn": 1, "summary": 2, "keyword": 3, "hybrid": None}
GRAPH_METHODS = ("memgas", "no_gmm", "no_ppr", "no_router", "no_association")
#: methods with lexical signals (see :mod:`memgas_gpu.retrieve.hybrid`)
LEXICAL_METHODS = ("bm25", "memgas_hybrid")
METHODS = GRAPH_METHODS + tuple(FLAT) + LEXICAL_METHODS


@dataclass
class SearchParams:
    """Read-path settings (DESIGN.md "Read path"); defaults are the paper's."""

    temperature: float = 0.2  # λ of the router softmax
    alpha: int = 15  # seed nodes kept
    damping: float = 0.1  # probability of following an edge (igraph's sense)
    router: str = "inverse"  # "inverse" (paper, 1/H) or "one_minus" (authors' code, 1-H)
    no_gmm_topk: int = 5  # edges per node of the no_gmm ablation


@dataclass
class Retrieval:
    """Rankings of one method for a batch of questions.

    Attributes:
        method: the method name.
        question_index: ``[Q]`` indices into ``index.questions``.
        scores: ``[Q, N_max]`` session scores (``-inf`` past a conversation's end).
        rankings: ``[Q, N_max]`` session positions within the question's
            conversation, best first (``-1`` padding).
        n_sessions: ``[Q]`` sessions in each question's conversation.
    """

    method: str
    question_index: Tensor
    scores: Tensor
    rankings: Tensor
    n_sessions: Tensor
    params: dict = field(default_factory=dict)


def _gather_layout(index: MemoryIndex, qi: Tensor):
    conv = index.q_conv[qi]
    start = index.conv_offsets[conv]
    n = index.conv_offsets[conv + 1] - start
    n_max = int(n.max()) if n.numel() else 0
    pos = torch.arange(n_max)
    valid = pos.unsqueeze(0) < n.unsqueeze(1)
    rows = torch.where(valid, start.unsqueeze(1) + pos, torch.zeros_like(valid, dtype=torch.long))
    return conv, start, n, valid, rows


def _chunk(q: int, per_q_elems: int, budget: int = 1 << 26) -> int:
    return max(1, min(q, budget // max(per_q_elems, 1)))


def _similarities(index: MemoryIndex, qi: Tensor, rows: Tensor, valid: Tensor, which,
                  dev: torch.device) -> Tensor:
    """``[Q, G, N_max]`` dot products of each question with its sessions (pad = -inf)."""
    q_all = index.q_emb[qi]
    n_max = rows.shape[1]
    g = N_GRAN if which == "all" else 1
    out = torch.empty(qi.numel(), g, n_max, dtype=torch.float32, device=dev)
    step = _chunk(qi.numel(), n_max * g * index.dim)
    for a in range(0, qi.numel(), step):
        b = min(a + step, qi.numel())
        slots = index.row_slot[rows[a:b]]
        if which == "all":
            x = index.gran[slots].to(dev)  # [B, N, 4, d]
            out[a:b] = torch.einsum("bd,bngd->bgn", q_all[a:b].to(dev), x)
        elif which == "hybrid":
            x = index.hybrid[slots].to(dev)  # [B, N, d]
            out[a:b, 0] = torch.einsum("bd,bnd->bn", q_all[a:b].to(dev), x)
        else:
            x = index.gran[slots, which].to(dev)
            out[a:b, 0] = torch.einsum("bd,bnd->bn", q_all[a:b].to(dev), x)
    return out.masked_fill(~valid.to(dev).unsqueeze(1), float("-inf"))


def retrieve(index: MemoryIndex, questions: Optional[Sequence[int]] = None,
             method: str = "memgas", params: Optional[SearchParams] = None,
             device: Optional[str] = None, **overrides) -> Retrieval:
    """Rank the sessions of each question's conversation.

    Args:
        index: the memory index.
        questions: indices into ``index.questions`` (default: all).
        method: ``"memgas"`` (full), ablations ``"no_gmm"`` (fixed top-k edges),
            ``"no_ppr"`` (seed scores summed per session), ``"no_router"`` (uniform
            granularity weights), ``"no_association"`` (no edges), or flat
            ``"session"``, ``"turn"`` (mean of turn embeddings), ``"summary"``,
            ``"keyword"``, ``"hybrid"`` (summary + keywords + session text).
        params: :class:`SearchParams`; keyword ``overrides`` replace its fields.
        device: where to compute (default: CUDA if available).

    Returns:
        A :class:`Retrieval`.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if method in LEXICAL_METHODS:
        return _retrieve_lexical(index, questions, method, params, device, overrides)
    params = replace(params or SearchParams(), **overrides)
    if params.router not in ("inverse", "one_minus"):
        raise ValueError(f"router must be 'inverse' or 'one_minus', got {params.router!r}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    qi = (torch.arange(len(index.questions)) if questions is None
          else torch.as_tensor(list(questions), dtype=torch.long))
    conv, _, n, valid, rows = _gather_layout(index, qi)
    if method in FLAT:
        which = FLAT[method] if method != "hybrid" else "hybrid"
        if which == "hybrid" and index.hybrid is None:
            raise ValueError("this index was built without hybrid embeddings (hybrid=False)")
        scores = _similarities(index, qi, rows, valid, which, dev)[:, 0]
    else:
        if method == "no_association":
            n_nodes = index.n_rows * N_GRAN
            graph = (torch.zeros(n_nodes + 1, dtype=torch.long),
                     torch.zeros(0, dtype=torch.long))
        elif method == "no_gmm":
            graph = index.graph(replace(index.params, rule="topk", topk=params.no_gmm_topk),
                                device=str(dev))
        else:
            graph = index.graph(device=str(dev))
        sess, conv_of_node = index.node_layout()
        scores, ok = ops.memgas_session_scores_packed(
            index.q_emb[qi].to(dev), conv.to(dev), index.node_embeddings().to(dev),
            sess.to(dev), torch.arange(N_GRAN).repeat(index.n_rows).to(dev),
            conv_of_node.to(dev), graph[0].to(dev), graph[1].to(dev), n_gran=N_GRAN,
            temperature=params.temperature, alpha=params.alpha, damping=params.damping,
            router=params.router, use_router=method != "no_router",
            use_ppr=method != "no_ppr")
        n_max = rows.shape[1]
        scores = scores[:, :n_max].masked_fill(~ok[:, :n_max], float("-inf"))
    rankings = torch.argsort(scores, dim=1, descending=True, stable=True)
    pos = torch.arange(scores.shape[1], device=dev).unsqueeze(0)
    rankings = torch.where(pos < n.to(dev).unsqueeze(1), rankings, torch.full_like(rankings, -1))
    return Retrieval(method, qi, scores.cpu(), rankings.cpu(), n,
                     params=dict(vars(params)))


def _retrieve_lexical(index, questions, method, params, device, overrides) -> Retrieval:
    """``bm25`` (BM25 over session text) and ``memgas_hybrid``; ``params`` is a
    :class:`~memgas_gpu.retrieve.hybrid.HybridParams` (a :class:`SearchParams` maps its
    temperature, alpha, damping and router onto the hybrid defaults)."""
    from .hybrid import HybridParams, retrieve_hybrid

    if isinstance(params, SearchParams):
        params = HybridParams(alpha=params.alpha, damping=params.damping,
                              router=params.router)
    p = replace(params or HybridParams(), **overrides)
    if method == "bm25":
        p = replace(p, signals=("bm25_S",), fusion="sum", router="uniform", norm="none")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    qi = (torch.arange(len(index.questions)) if questions is None
          else torch.as_tensor(list(questions), dtype=torch.long))
    _, _, n, _, _ = _gather_layout(index, qi)
    scores = retrieve_hybrid(index, qi, p, dev)
    rankings = torch.argsort(scores, dim=1, descending=True, stable=True)
    pos = torch.arange(scores.shape[1], device=dev).unsqueeze(0)
    rankings = torch.where(pos < n.to(dev).unsqueeze(1), rankings, torch.full_like(rankings, -1))
    return Retrieval(method, qi, scores.cpu(), rankings.cpu(), n, params=dict(vars(p)))
