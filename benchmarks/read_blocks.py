"""Building blocks of a fast MemGAS read path over packed conversations: research code
for ``bench_read_blocks.py`` (docs/performance.md, "LongMemEval shape"), kept out of the
package; the engine took the sampled product over to its dense signals
(``memgas_gpu/retrieve/signals.py``).

All blocks work on the index's packed layout: the nodes of every conversation are one
contiguous run of ``node_emb`` (``conv_start[c]``, ``conv_count[c]`` nodes), and within a
conversation the nodes are *regular*: session-major with ``G`` granularity nodes per
session (node ``G * session + g``, :meth:`MemoryIndex.node_embeddings`). Query ``q``
belongs to conversation ``q_conv[q]``. None of them loops over conversations in Python.

* :func:`packed_similarities`: ``[Q, n_max]`` dot products of each query with the nodes
  of its own conversation, as ONE sampled dense product (``torch.sparse.sampled_addmm``
  over the block pattern): each node embedding is read once per query of its
  conversation, with no ``[Q, n_max, d]`` gather and no per-conversation launch.
  ``half_storage=True`` takes float16 node embeddings (half the bytes) and computes one
  matrix-vector product per conversation instead (``sampled_addmm`` has no float16 CPU
  kernel), float32 results.
* :func:`regular_router_seeds`: entropy-router weights and the top-``alpha`` seeds from
  those similarities, reading them as a ``[Q, G, N]`` *view* (no scatter into a
  ``[Q, G * N]`` copy, no per-node gather of the weights); equal, bit for bit, to
  the router of :func:`~memgas_gpu.ops.memgas_session_scores` +
  :func:`~memgas_gpu.ops.seed_scores`.
* :func:`packed_reset` / :func:`packed_session_sums`: the PageRank reset rows
  (:func:`~memgas_gpu.ops.query_waves`: the k-th query of every conversation shares
  row k) and the per-session sums of the result, through flat indices (no boolean-mask indexing).
* :func:`regular_packed_scores`: the four wired together; the same session scores as
  :func:`~memgas_gpu.ops.memgas_session_scores` run conversation by conversation
  (tests: same rankings; scores within 1e-12 in float64, 1e-7 in float32, where the
  similarities differ from per-conversation products by summation order).
"""
from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from memgas_gpu.ops import entropy_router, personalized_pagerank, query_waves

__all__ = ["packed_similarities", "regular_router_seeds", "packed_reset",
           "packed_session_sums", "regular_packed_scores", "block_pattern"]


def block_pattern(q_conv: Tensor, conv_start: Tensor, conv_count: Tensor,
                  n_nodes: int) -> Tuple[Tensor, Tensor]:
    """CSR pattern ``(crow [Q + 1], col [nnz])``: row ``q`` holds the node ids of
    conversation ``q_conv[q]`` in order. Reusable across calls with the same queries."""
    cnt = conv_count[q_conv]
    crow = torch.zeros(q_conv.numel() + 1, dtype=torch.int64, device=q_conv.device)
    crow[1:] = torch.cumsum(cnt, 0)
    nnz = int(crow[-1])
    row = torch.repeat_interleave(torch.arange(q_conv.numel(), device=q_conv.device), cnt,
                                  output_size=nnz)
    col = torch.arange(nnz, device=q_conv.device) + \
        (conv_start[q_conv] - crow[:-1]).index_select(0, row)
    return crow, col


def _pad(values: Tensor, cnt: Tensor, n_max: int) -> Tensor:
    """Row-major ragged ``values`` (row q has ``cnt[q]``) as ``[Q, n_max]``, zeros past."""
    Q = cnt.numel()
    if Q == 0:
        return values.new_zeros(0, n_max)
    if bool((cnt == n_max).all()):
        return values.view(Q, n_max)
    out = values.new_zeros(Q * n_max + 1)
    j = torch.arange(n_max, device=cnt.device)
    flat = (torch.arange(Q, device=cnt.device) * n_max)[:, None] + j
    flat = torch.where(j[None, :] < cnt[:, None], flat, torch.full_like(flat, Q * n_max))
    first = torch.cumsum(cnt, 0) - cnt
    src = torch.where(j[None, :] < cnt[:, None], first[:, None] + j, torch.zeros_like(flat))
    src = src.flatten() if values.numel() else torch.zeros_like(src.flatten())
    vals = torch.cat([values, values.new_zeros(1)]).index_select(0, src)
    out.index_copy_(0, flat.flatten(), vals)
    return out[:-1].view(Q, n_max)


def packed_similarities(q_emb: Tensor, q_conv: Tensor, node_emb: Tensor, conv_start: Tensor,
                        conv_count: Tensor, n_max: Optional[int] = None, *,
                        pattern: Optional[Tuple[Tensor, Tensor]] = None,
                        half_storage: bool = False) -> Tensor:
    """``[Q, n_max]`` similarities of each query with the nodes of its conversation.

    Args:
        q_emb: ``[Q, d]`` query embeddings.
        q_conv: ``[Q]`` conversation of each query.
        node_emb: ``[n, d]`` packed node embeddings (float32/float64; float16 with
            ``half_storage``).
        conv_start, conv_count: ``[C]`` first node and node count of each conversation.
        n_max: columns of the result (default ``conv_count[q_conv].max()``).
        pattern: optional :func:`block_pattern` of these queries (saves rebuilding it).
        half_storage: ``node_emb`` is float16 (half the bytes); one matrix-vector
            product per conversation, results in float32.

    Returns:
        ``[Q, n_max]`` (float32, or float64 for float64 inputs); column ``j`` is node
        ``conv_start[q_conv[q]] + j``; zeros past the conversation's nodes.
    """
    q_conv = q_conv.to(device=node_emb.device, dtype=torch.int64)
    conv_start = conv_start.to(device=node_emb.device, dtype=torch.int64)
    conv_count = conv_count.to(device=node_emb.device, dtype=torch.int64)
    cnt = conv_count[q_conv]
    if n_max is None:
        n_max = int(cnt.max()) if cnt.numel() else 0
    Q = q_conv.numel()
    if half_storage:
        return _half_similarities(q_emb, q_conv, node_emb, conv_start, conv_count, n_max)
    dt = torch.float64 if node_emb.dtype == torch.float64 else torch.float32
    if Q == 0 or n_max == 0:
        return torch.zeros(Q, n_max, dtype=dt, device=node_emb.device)
    crow, col = pattern if pattern is not None else block_pattern(
        q_conv, conv_start, conv_count, node_emb.shape[0])
    with warnings.catch_warnings():  # "sparse CSR support is in beta" is not news here
        warnings.simplefilter("ignore", UserWarning)
        pat = torch.sparse_csr_tensor(crow, col, torch.zeros(col.numel(), dtype=dt,
                                                             device=node_emb.device),
                                      (Q, node_emb.shape[0]), check_invariants=False)
        vals = torch.sparse.sampled_addmm(pat, q_emb.to(device=node_emb.device, dtype=dt),
                                          node_emb.to(dt).T, beta=0.0).values()
    return _pad(vals, cnt, n_max)


def _half_similarities(q_emb, q_conv, node_emb, conv_start, conv_count, n_max) -> Tensor:
    """float16 storage: one ``[n_c, d] @ [d, k]`` product per conversation (CPU float16
    GEMV reads half the bytes and was the fastest float16 path; no sampled kernel)."""
    Q = q_conv.numel()
    out = torch.zeros(Q, n_max, dtype=torch.float32, device=node_emb.device)
    qh = q_emb.to(device=node_emb.device, dtype=torch.float16)
    order = torch.argsort(q_conv, stable=True)
    convs, sizes = torch.unique_consecutive(q_conv[order], return_counts=True)
    o = 0
    for a, n, k in zip(conv_start[convs].tolist(), conv_count[convs].tolist(), sizes.tolist()):
        qi = order[o:o + k]
        o += k
        out[qi, :n] = (qh[qi] @ node_emb[a:a + n].T).float()
    return out


def regular_router_seeds(sims: Tensor, n_sessions: Tensor, n_gran: int, *,
                         temperature: float = 0.2, alpha: int = 15, router: str = "inverse",
                         use_router: bool = True) -> Tuple[Tensor, Tensor]:
    """Router weights and top-``alpha`` seeds of regular (session-major) node rows.

    Args:
        sims: ``[Q, G * N_max]`` similarities (:func:`packed_similarities`), node
            ``G * i + g`` = granularity ``g`` of session ``i``.
        n_sessions: ``[Q]`` sessions of each query's conversation (columns past
            ``G * n_sessions[q]`` are padding).
        n_gran: ``G``.
        temperature, alpha, router, use_router: as
            :func:`~memgas_gpu.ops.memgas_session_scores`.

    Returns:
        ``(weights [Q, G], seeds [Q, G * N_max] float64)``; seeds are the weighted
        similarities of the top ``alpha`` nodes (ties kept), 0 elsewhere, never negative.
    """
    Q, n_max = sims.shape
    G = int(n_gran)
    N = n_max // G
    v = sims.view(Q, N, G)
    ok_sess = torch.arange(N, device=sims.device)[None, :] < n_sessions.to(sims.device)[:, None]
    if use_router:
        w = entropy_router(v.transpose(1, 2), temperature, router, ok_sess[:, None, :])
    else:
        w = torch.full((Q, G), 1.0 / G, dtype=sims.dtype, device=sims.device)
    x = (v * w[:, None, :]).view(Q, n_max)
    ok = ok_sess[:, :, None].expand(Q, N, G).reshape(Q, n_max)
    key = torch.where(ok & ~torch.isnan(x), x, torch.full_like(x, float("-inf")))
    if n_max == 0:
        return w, x.to(torch.float64)
    kth = torch.topk(key, max(1, min(alpha, n_max)), dim=1).values[:, -1:]
    seeds = torch.where((key >= kth) & (key > 0), x, torch.zeros_like(x))
    return w, seeds.to(torch.float64)


def _flat_nodes(q_row: Tensor, q_conv: Tensor, conv_start: Tensor, conv_count: Tensor,
                n: int, n_max: int, n_rows: int) -> Tensor:
    """``[Q, n_max]`` index into a flattened ``[n_rows, n]`` (+1 dump slot for padding)."""
    j = torch.arange(n_max, device=q_conv.device)
    flat = (q_row * n + conv_start[q_conv])[:, None] + j
    return torch.where(j[None, :] < conv_count[q_conv][:, None], flat,
                       torch.full_like(flat, n_rows * n))


def packed_reset(seeds: Tensor, q_row: Tensor, n_rows: int, q_conv: Tensor,
                 conv_start: Tensor, conv_count: Tensor, n: int) -> Tensor:
    """PageRank reset ``[n_rows, n]``: query ``q``'s seeds on its conversation's nodes in
    row ``q_row[q]`` (rows from :func:`~memgas_gpu.ops.query_waves`)."""
    flat = _flat_nodes(q_row, q_conv, conv_start, conv_count, n, seeds.shape[1], n_rows)
    out = torch.zeros(n_rows * n + 1, dtype=seeds.dtype, device=seeds.device)
    out.index_put_((flat.flatten(),), seeds.flatten(), accumulate=True)
    return out[:-1].view(n_rows, n)


def packed_session_sums(p: Tensor, q_row: Tensor, q_conv: Tensor, conv_start: Tensor,
                        conv_count: Tensor, n_max: int, n_gran: int) -> Tensor:
    """``[Q, n_max // G]`` session scores: query ``q``'s PageRank (row ``q_row[q]`` of
    ``p [n_rows, n]``) summed over each session's ``G`` nodes, in node order (the same
    additions as a scatter-add from zero)."""
    n_rows, n = p.shape
    flat = _flat_nodes(q_row, q_conv, conv_start, conv_count, n, n_max, n_rows)
    src = torch.cat([p.reshape(-1), p.new_zeros(1)])
    v = src.index_select(0, flat.flatten()).view(q_row.numel(), n_max // n_gran, n_gran)
    out = v[..., 0].clone()
    for g in range(1, n_gran):
        out += v[..., g]
    return out


def regular_packed_scores(q_emb: Tensor, q_conv: Tensor, node_emb: Tensor, conv_start: Tensor,
                          conv_count: Tensor, indptr: Tensor, indices: Tensor,
                          conversation_of_node: Tensor, *, n_gran: int = 4,
                          temperature: float = 0.2, alpha: int = 15, damping: float = 0.1,
                          router: str = "inverse", use_router: bool = True,
                          use_ppr: bool = True, tol: float = 1e-10, max_iter: int = 100,
                          half_storage: bool = False, backend: str = "auto"
                          ) -> Tuple[Tensor, Tensor]:
    """MemGAS session scores of regular packed conversations from the blocks above:
    ``(scores [Q, N_max] float64, valid [Q, N_max] bool)``; the same scores as
    :func:`~memgas_gpu.ops.memgas_session_scores` run conversation by conversation."""
    dev = node_emb.device
    q_conv = q_conv.to(device=dev, dtype=torch.int64)
    conv_start = conv_start.to(device=dev, dtype=torch.int64)
    conv_count = conv_count.to(device=dev, dtype=torch.int64)
    n = node_emb.shape[0]
    cnt = conv_count[q_conv]
    n_max = int(conv_count.max()) if conv_count.numel() else 0
    n_max = n_max + (-n_max) % n_gran
    sims = packed_similarities(q_emb, q_conv, node_emb, conv_start, conv_count, n_max,
                               half_storage=half_storage)
    n_sess = cnt // n_gran
    _, seeds = regular_router_seeds(sims, n_sess, n_gran, temperature=temperature,
                                    alpha=alpha, router=router, use_router=use_router)
    if use_ppr:
        row, R = query_waves(q_conv)
        reset = packed_reset(seeds, row, R, q_conv, conv_start, conv_count, n)
        p = personalized_pagerank(indptr, indices, reset, damping, tol, max_iter,
                                  blocks=conversation_of_node, backend=backend)
        scores = packed_session_sums(p, row, q_conv, conv_start, conv_count, n_max, n_gran)
    else:
        v = seeds.view(q_conv.numel(), n_max // n_gran, n_gran)
        scores = v[..., 0].clone()
        for g in range(1, n_gran):
            scores += v[..., g]
    N_max = n_max // n_gran
    valid = torch.arange(N_max, device=dev)[None, :] < n_sess[:, None]
    return scores, valid
