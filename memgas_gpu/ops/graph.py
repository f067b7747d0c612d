"""Association-graph construction (MemGAS write path).

Nodes are the granularity views of sessions, interleaved per session (node ``4 i + g``
for g in S, T, U, K, though nothing here assumes exactly 4 nodes per session). For
every node ``v`` of a session whose index within its conversation is ``>= skip_sessions``:

1. ``s_j = <x_v, x_j>`` for all nodes ``j`` of *earlier* sessions of the same
   conversation (never the node's own session);
2. keep the top ``m`` candidates (all of them when fewer exist);
3. fit a 2-component 1-D GMM to those scores (:func:`~memgas_gpu.ops.gmm1d.gmm1d_accept`,
   scikit-learn semantics) and link ``v`` to the candidates of the higher-mean
   component: ``E = {(v, j) : z_j = argmax_k mu_k}`` (undirected, unweighted).

Edges of a node depend only on earlier nodes, so appending sessions never changes old
edges: build the new edges with ``first_node`` and merge (see :func:`symmetric_csr`).

Work is done per conversation in chunks of nodes (``max_elements`` similarity entries
at a time, never an all-conversations ``n x n`` matrix); candidate rows of all chunks
and conversations are buffered and sent to one batched GMM call per ``gmm_batch`` rows.

Ties: the reference orders candidates with ``np.argsort(sims)[::-1]``, whose order among
equal similarities is implementation-defined; ours keeps the earlier node (the torch path
through :func:`~memgas_gpu.ops.topm.range_top_m`, the package's one top-m search, and
the native kernel alike). Only candidate sets with a tie exactly at the ``m``-th score
can differ (the GMM itself only sees values, so ties inside the top ``m`` are harmless).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _kernels
from .gmm1d import first_centre_table, gmm1d_accept
from .topm import range_top_m

__all__ = ["association_edges", "build_association_graph", "symmetric_csr", "node_layout"]


def node_layout(session_of_node: Tensor, conversation_of_node: Optional[Tensor] = None):
    """Per-node session bookkeeping.

    Args:
        session_of_node: ``[n]`` session id per node; nodes of a session are contiguous
            and sessions appear in chronological order within a conversation.
        conversation_of_node: optional ``[n]`` conversation id; nodes of a conversation
            are contiguous. Default: one conversation.

    Returns:
        ``(session_start, conv_start, session_rank)``: index of the first node of the
        node's session and of its conversation, and the 0-based order of appearance of
        the node's session within its conversation (all ``[n]`` int64).
    """
    n = session_of_node.numel()
    dev = session_of_node.device
    idx = torch.arange(n, device=dev)
    sess = session_of_node.to(torch.int64)
    first = idx == 0
    new_conv = first.clone()
    if conversation_of_node is not None:
        conv = conversation_of_node.to(device=dev, dtype=torch.int64)
        new_conv[1:] |= conv[1:] != conv[:-1]
    new_sess = new_conv.clone()
    new_sess[1:] |= sess[1:] != sess[:-1]
    zero = torch.zeros_like(idx)
    session_start = torch.cummax(torch.where(new_sess, idx, zero), dim=0).values
    conv_start = torch.cummax(torch.where(new_conv, idx, zero), dim=0).values
    cs = torch.cumsum(new_sess.to(torch.int64), dim=0)
    session_rank = cs - cs[conv_start]
    return session_start, conv_start, session_rank


def symmetric_csr(edges: Tensor, n: int) -> Tuple[Tensor, Tensor]:
    """Symmetric CSR of an undirected graph from directed edges.

    Args:
        edges: ``[2, E]`` int64 edge list (either direction; duplicates allowed).
        n: number of nodes.

    Returns:
        ``(indptr [n + 1], indices [nnz])`` int64: both directions, self-loops and
        duplicates removed, column indices sorted within each row.
    """
    edges = edges.to(torch.int64)
    dev = edges.device
    a, b = edges[0], edges[1]
    keep = a != b
    a, b = a[keep], b[keep]
    key = torch.unique(torch.cat([a * n + b, b * n + a]))
    rows = torch.div(key, n, rounding_mode="floor")
    cols = key - rows * n
    counts = torch.bincount(rows, minlength=n)
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    indptr[1:] = torch.cumsum(counts, dim=0)
    return indptr, cols


def association_edges(
    node_emb: Tensor,
    session_of_node: Tensor,
    m: int = 30,
    skip_sessions: int = 5,
    conversation_of_node: Optional[Tensor] = None,
    *,
    accept: str = "gmm",
    first_node: int = 0,
    batch_size: Optional[int] = None,
    max_elements: int = 1 << 24,
    gmm_batch: int = 1 << 16,
    backend: str = "auto",
) -> Tensor:
    """Directed ``new -> old`` association edges (see the module docstring).

    Args:
        node_emb: ``[n, d]`` node embeddings (similarity = dot product; computed in
            float32 unless the embeddings are float64).
        session_of_node: ``[n]`` session id per node (contiguous, chronological).
        m: number of candidates per node (default 30).
        skip_sessions: the first ``skip_sessions`` sessions of each conversation get no
            outgoing edges (default 5).
        conversation_of_node: optional ``[n]`` conversation id (contiguous runs); edges
            never cross conversations. Default: one conversation.
        accept: ``"gmm"`` (MemGAS: the higher-mean GMM component) or ``"all"`` (every
            one of the top ``m`` candidates: the fixed top-k ``no_gmm`` ablation).
        first_node: only nodes with index ``>= first_node`` get outgoing edges (for
            incremental appends; default 0).
        batch_size: optional cap on nodes per chunk (default: set by ``max_elements``).
        max_elements: similarity entries per chunk (default 2**24; bounds memory).
        gmm_batch: candidate rows per batched GMM call (default 2**16).
        backend: ``"auto"`` (default), ``"native"`` or ``"torch"``. On the CPU the native
            path fuses top-``m`` selection and the GMM per node (same edges; see
            ``_edges_native``); on CUDA only the GMM is native.

    Returns:
        ``[2, E]`` int64 edges ``(v, j)`` with ``j`` in an earlier session, on
        ``node_emb``'s device, sorted by ``v`` then by decreasing similarity.
    """
    if node_emb.dim() != 2:
        raise ValueError(f"node_emb must be [n, d], got shape {tuple(node_emb.shape)}")
    n = node_emb.shape[0]
    dev = node_emb.device
    if session_of_node.shape != (n,):
        raise ValueError(f"session_of_node must have shape ({n},)")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if accept not in ("gmm", "all"):
        raise ValueError(f"accept must be 'gmm' or 'all', got {accept!r}")
    empty = torch.zeros(2, 0, dtype=torch.int64, device=dev)
    if n == 0:
        return empty
    emb = node_emb.to(torch.float64 if node_emb.dtype == torch.float64 else torch.float32)
    session_start, conv_start, rank = node_layout(session_of_node.to(dev),
                                                  None if conversation_of_node is None
                                                  else conversation_of_node.to(dev))
    eligible = ((rank >= skip_sessions) & (session_start > conv_start)
                & (torch.arange(n, device=dev) >= first_node))
    if not bool(eligible.any()):
        return empty
    plan = _ChunkPlan(session_start, conv_start, eligible, first_node, max_elements,
                      batch_size)
    edges = _kernels.dispatch(
        "graph", dev, backend,
        native=lambda: _edges_native(emb, session_start, plan, m, accept),
        fallback=lambda: _edges_torch(emb, session_start, plan, m, accept, gmm_batch,
                                      backend),
        covered=dev.type == "cpu" and m <= _kernels.GMM_MAX_M)  # else torch + GMM kernel
    return edges if edges is not None else empty


class _ChunkPlan:
    """Chunks of eligible nodes for the similarity products: one host sync, then
    ``(c0, a, b, width)`` per chunk: rows ``[a, b)`` of the conversation starting at
    node ``c0``, whose candidates are the ``width`` nodes from ``c0`` on (all sessions
    before row ``b - 1``'s).

    Within a conversation the eligible nodes are a suffix (ranks are non-decreasing),
    so each conversation is cut from its first eligible node to its end, in chunks of
    at most ``max_elements`` similarity entries (and ``batch_size`` rows).
    """

    def __init__(self, session_start: Tensor, conv_start: Tensor, eligible: Tensor,
                 first_node: int, max_elements: int, batch_size: Optional[int]) -> None:
        n = session_start.numel()
        dev = session_start.device
        idx = torch.arange(n, device=dev)
        conv_first = torch.nonzero(idx == conv_start).flatten()
        conv_end = torch.cat([conv_first[1:], torch.tensor([n], device=dev)])
        elig_any = torch.zeros(n, dtype=torch.int64, device=dev).index_add_(
            0, conv_start, eligible.to(torch.int64))[conv_first]
        first_elig = torch.full((n,), n, dtype=torch.int64, device=dev).scatter_reduce_(
            0, conv_start, torch.where(eligible, idx, torch.full_like(idx, n)),
            "amin")[conv_first]
        self.convs = [(c0, c1, max(e0, first_node)) for c0, c1, e0, k in
                      torch.stack([conv_first, conv_end, first_elig, elig_any]).T.tolist()
                      if k > 0]
        self.ss_host = session_start.cpu()
        self.max_elements = max_elements
        self.batch_size = batch_size

    def chunks(self, max_rows: Optional[int] = None, min_rows: int = 0):
        """Yield ``(c0, a, b, width)``; ``max_rows`` caps the rows per chunk and a last
        chunk of fewer than ``min_rows`` rows joins the one before while the pair stays
        within twice ``max_elements``."""
        ss = self.ss_host
        for c0, c1, a in self.convs:
            while a < c1:
                width = int(ss[c1 - 1]) - c0  # widest candidate prefix
                rows = min(c1 - a, self.max_elements // max(width, 1))
                if max_rows is not None:
                    rows = min(rows, max_rows)
                if self.batch_size is not None:
                    rows = min(rows, self.batch_size)
                b = a + max(1, rows)
                if c1 - b < min_rows and (c1 - a) * width <= 2 * self.max_elements:
                    b = c1
                yield c0, a, b, int(ss[b - 1]) - c0  # session starts are non-decreasing
                a = b


class _CandidateBuffer:
    """Top-``m`` candidate rows of many chunks, sent to one batched GMM call per
    ``gmm_batch`` rows (the torch path)."""

    def __init__(self, accept: str, gmm_batch: int, backend: str) -> None:
        self.accept, self.gmm_batch, self.backend = accept, gmm_batch, backend
        self.parts: List[Tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.rows = 0
        self.edges: List[Tensor] = []

    def add(self, rows: Tensor, cand: Tensor, vals: Tensor, valid: Tensor) -> None:
        self.parts.append((rows, cand, vals, valid))
        self.rows += rows.numel()
        if self.rows >= self.gmm_batch:
            self.flush()

    def flush(self) -> None:
        if not self.parts:
            return
        rows, cand, vals, valid = (torch.cat(t) for t in zip(*self.parts))
        acc = (gmm1d_accept(vals, valid, backend=self.backend) if self.accept == "gmm"
               else valid)
        self.edges.append(torch.stack([rows[:, None].expand_as(acc)[acc], cand[acc]]))
        self.parts.clear()
        self.rows = 0


def _edges_torch(emb: Tensor, session_start: Tensor, plan: _ChunkPlan, m: int, accept: str,
                 gmm_batch: int, backend: str) -> Optional[Tensor]:
    """Top ``m`` earlier nodes per row (:func:`~memgas_gpu.ops.topm.range_top_m`, ties to
    the earlier node as the native kernel) and batched GMM per chunk (any device)."""
    dev = emb.device
    buf = _CandidateBuffer(accept, gmm_batch, backend)
    for c0, a, b, width in plan.chunks():
        ss = session_start[a:b] - c0  # number of candidates per row
        vals, cidx, valid = range_top_m(emb[a:b], emb[c0:c0 + width],
                                        torch.zeros_like(ss), ss, m, exact=False)
        buf.add(torch.arange(a, b, device=dev), cidx + c0,
                vals.masked_fill(~valid, 0.0), valid)
    buf.flush()
    return torch.cat(buf.edges, dim=1) if buf.edges else None


# Native chunks: rows per similarity block, and the fewest rows of a block: smaller
# matrix products can take another BLAS path whose rounding differs from the torch op's.
_NATIVE_ROWS = 256
_NATIVE_MIN_ROWS = 64


def _edges_native(emb: Tensor, session_start: Tensor, plan: _ChunkPlan, m: int,
                  accept: str) -> Optional[Tensor]:
    """CPU path: BLAS similarities in row blocks, then one native call per block selects
    the top ``m`` candidates of every row and fits its GMM (one row per OpenMP thread).
    Blocks of about ``_NATIVE_ROWS`` rows keep the similarity work close to the triangle
    (each row only needs earlier sessions) and the block in cache for the selection.
    Same edges as the torch path (a tie at the ``m``-th score keeps the lowest node id
    in both).
    """
    table = torch.tensor(first_centre_table(m), dtype=torch.int64)
    params = (float(torch.finfo(emb.dtype).eps), 1e-3, 1e-6, 100, 1e-4, 300)
    out: List[Tensor] = []
    for c0, a, b, width in plan.chunks(_NATIVE_ROWS, _NATIVE_MIN_ROWS):
        sims = emb[a:b] @ emb[c0:c0 + width].T
        idx, keep = _kernels.graph_topm(sims, session_start[a:b] - c0, m, accept == "gmm",
                                        table, params)
        rows = torch.arange(a, b)[:, None].expand(b - a, m)
        out.append(torch.stack([rows[keep], idx[keep] + c0]))
    return torch.cat(out, dim=1) if out else None


def build_association_graph(node_emb: Tensor, session_of_node: Tensor, m: int = 30,
                            skip_sessions: int = 5,
                            conversation_of_node: Optional[Tensor] = None,
                            **options) -> Tuple[Tensor, Tensor]:
    """MemGAS association graph as symmetric CSR: the edges of :func:`association_edges`
    (same arguments; ``options``: ``accept``, ``batch_size``, ``max_elements``,
    ``gmm_batch``, ``backend``), in both directions.

    Args:
        node_emb: ``[n, d]`` node embeddings.
        session_of_node: ``[n]`` session id per node (contiguous, chronological).
        m: candidates per node (default 30).
        skip_sessions: leading sessions without outgoing edges (default 5).
        conversation_of_node: optional ``[n]`` conversation id (contiguous runs); many
            conversations give one block-diagonal graph. Default: one conversation.

    Returns:
        ``(indptr [n + 1], indices [nnz])`` int64 symmetric CSR without self-loops or
        duplicates, indices sorted per row, on ``node_emb``'s device.
    """
    if "first_node" in options:
        raise TypeError("build_association_graph links every node: first_node is for "
                        "association_edges (incremental writes)")
    edges = association_edges(node_emb, session_of_node, m, skip_sessions,
                              conversation_of_node, **options)
    return symmetric_csr(edges, node_emb.shape[0])
