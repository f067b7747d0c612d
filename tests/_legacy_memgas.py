"""The memgas read path as it was before the one-engine refactor (commit 615a4a4),
frozen here as the oracle of ``test_engine.py::test_memgas_preset_bit_identical``: the
engine's ``memgas`` preset (and its ablations) must give the same bits.  Do not edit.
Seed selection is frozen here too; the router, the graph layout and PageRank are the
live ops (their own oracle tests pin them).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from memgas_gpu.ops import entropy_router, node_layout, personalized_pagerank


def seed_scores(node_scores: Tensor, alpha: int = 15, valid: Optional[Tensor] = None) -> Tensor:
    """Keep the top-``alpha`` node scores per row (threshold semantics, ties kept):
    ``scores[scores < topk(scores, alpha)[-1]] = 0`` as in the authors' code, then
    negative and NaN entries become 0; padding (``~valid``) gets 0.  Frozen copy of the
    seed selection of commit 615a4a4 (``ops.scores.seed_scores``), so that a change to
    the live ``ops.propagate.seed_scores`` shows up against this oracle."""
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


def query_waves(query_conversation: Tensor) -> Tuple[Tensor, int]:
    """PageRank row of each query when conversations share rows (``blocks`` mode).

    The k-th query of every conversation goes to row k (conversations never exchange
    mass over a block-diagonal graph), so ``n_rows`` is the largest number of queries
    of one conversation: 1 for LongMemEval.

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


def _conversation_sims(qe: Tensor, emb: Tensor, qconv: Tensor, start: Tensor, count: Tensor,
                       n_max: int) -> Tensor:
    """``[Q, n_max]`` dot products of each query with the nodes of its conversation,
    one ``[q_c, d] @ [d, n_c]`` product per conversation (no per-query gather)."""
    out = torch.zeros(qe.shape[0], n_max, dtype=qe.dtype, device=qe.device)
    order = torch.argsort(qconv, stable=True)
    convs, sizes = torch.unique_consecutive(qconv[order], return_counts=True)
    o = 0
    for a, n, k in zip(start[convs].tolist(), count[convs].tolist(), sizes.tolist()):
        qi = order[o:o + k]
        o += k
        out[qi, :n] = qe[qi] @ emb[a:a + n].T
    return out


def memgas_session_scores_packed(
    query_emb: Tensor,
    query_conversation: Tensor,
    node_emb: Tensor,
    session_of_node: Tensor,
    gran_of_node: Tensor,
    conversation_of_node: Tensor,
    indptr: Tensor,
    indices: Tensor,
    *,
    n_gran: Optional[int] = None,
    temperature: float = 0.2,
    alpha: int = 15,
    damping: float = 0.1,
    router: str = "inverse",
    use_router: bool = True,
    use_ppr: bool = True,
    tol: float = 1e-10,
    max_iter: int = 100,
    max_elements: int = 1 << 26,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """MemGAS session scores for queries of MANY conversations in one pass.

    The nodes of all conversations are concatenated (each conversation a contiguous
    run; ``conversation_of_node`` ids in ``[0, C)``) with one block-diagonal graph, as
    built by ``build_association_graph(..., conversation_of_node=...)``. Query ``q``
    belongs to conversation ``query_conversation[q]``. Each query is scored against
    its own conversation only (gathered, ``[chunk, n_c, d]`` at most ``max_elements``
    entries at a time); then the k-th query of every conversation shares PPR row k
    (``blocks=conversation_of_node``), so a LongMemEval run (one query per haystack)
    needs a single PPR row. Results equal :func:`memgas_session_scores` run per
    conversation.

    Args:
        query_emb: ``[Q, d]`` query embeddings.
        query_conversation: ``[Q]`` conversation id per query.
        node_emb: ``[n, d]`` node embeddings of all conversations.
        session_of_node: ``[n]`` session id per node (contiguous, chronological within
            each conversation); sessions are numbered by order of appearance.
        gran_of_node: ``[n]`` granularity index per node.
        conversation_of_node: ``[n]`` conversation id per node (contiguous runs).
        indptr, indices: symmetric, block-diagonal CSR graph over all ``n`` nodes.
        n_gran, temperature, alpha, damping, router, use_router, use_ppr, tol,
        max_iter: as in :func:`memgas_session_scores`.
        max_elements: bound on gathered embedding entries per query chunk (2**26).
        backend: PPR backend, ``"auto"`` (default), ``"native"`` or ``"torch"``.

    Returns:
        ``(scores [Q, N_max] float64, valid [Q, N_max] bool)``: column ``j`` is the
        ``j``-th session (order of appearance) of the query's conversation; columns
        past its session count are padding (score 0, ``valid`` False).
    """
    dev = node_emb.device
    n, d = node_emb.shape
    Q = query_emb.shape[0]
    conv = conversation_of_node.to(device=dev, dtype=torch.int64)
    qconv = query_conversation.to(device=dev, dtype=torch.int64)
    gran = gran_of_node.to(device=dev, dtype=torch.int64)
    _, _, rank = node_layout(session_of_node.to(dev), conv)
    C = int(conv.max().item()) + 1
    G = int(gran.max().item()) + 1 if n_gran is None else int(n_gran)
    idx = torch.arange(n, device=dev)
    start = torch.full((C,), n, dtype=torch.int64, device=dev).scatter_reduce_(0, conv, idx,
                                                                               "amin")
    count = torch.bincount(conv, minlength=C)
    n_sess = torch.zeros(C, dtype=torch.int64, device=dev).scatter_reduce_(0, conv, rank + 1,
                                                                           "amax")
    n_max = int(count.max().item())
    N_max = int(n_sess.max().item())
    dt = torch.float64 if node_emb.dtype == torch.float64 else torch.float32
    emb = node_emb.to(dt)
    qe = query_emb.to(device=dev, dtype=dt)

    seeds = torch.zeros(Q, n_max, dtype=torch.float64, device=dev)
    pos_all = torch.zeros(Q, n_max, dtype=torch.int64, device=dev)
    ok_all = torch.zeros(Q, n_max, dtype=torch.bool, device=dev)
    col = torch.arange(n_max, device=dev)
    # CPU: one matmul per conversation (the [chunk, n_max, d] gather's memory traffic
    # dominated the read path, 2/3 of its time at 64 x 500 sessions); CUDA: the gather
    # is a few hundred microseconds of bandwidth, fewer launches win
    per_conv = _conversation_sims(qe, emb, qconv, start, count, n_max) \
        if dev.type == "cpu" else None
    chunk = max(1, max_elements // max(1, n_max * d))
    for q0 in range(0, Q, chunk):
        q1 = min(Q, q0 + chunk)
        c = qconv[q0:q1]
        ok = col[None, :] < count[c][:, None]
        pos = torch.where(ok, start[c][:, None] + col[None, :], torch.zeros_like(col)[None, :])
        sims = (per_conv[q0:q1] if per_conv is not None
                else torch.einsum("qd,qnd->qn", qe[q0:q1], emb[pos]))
        g, s = gran[pos], rank[pos]
        w = _route(sims, g, s, ok, G, N_max, temperature, router, use_router)
        seeds[q0:q1] = seed_scores(w.gather(1, g) * sims, alpha, ok).to(torch.float64)
        pos_all[q0:q1], ok_all[q0:q1] = pos, ok

    if use_ppr:
        slot, R = query_waves(qconv)
        reset = torch.zeros(R, n, dtype=torch.float64, device=dev)
        rows = slot[:, None].expand(Q, n_max)
        reset.index_put_((rows[ok_all], pos_all[ok_all]), seeds[ok_all], accumulate=True)
        p = personalized_pagerank(indptr, indices, reset, damping, tol, max_iter, blocks=conv,
                                  backend=backend)
        node_p = torch.where(ok_all, p[rows, pos_all], torch.zeros_like(seeds))
    else:
        node_p = seeds
    out = torch.zeros(Q, N_max + 1, dtype=torch.float64, device=dev)
    tgt = torch.where(ok_all, rank[pos_all], torch.full_like(pos_all, N_max))
    out.scatter_add_(1, tgt, node_p)
    valid = torch.arange(N_max, device=dev)[None, :] < n_sess[qconv][:, None]
    return out[:, :N_max], valid


def legacy_retrieve_scores(index, method="memgas", temperature=0.2, alpha=15, damping=0.1,
                           router="inverse", no_gmm_topk=5):
    """Scores ``[Q, n_max]`` of every question, exactly as ``retrieve`` computed them."""
    from dataclasses import replace

    N_GRAN = 4
    qi = torch.arange(len(index.questions))
    conv = index.q_conv[qi]
    start = index.snapshot().conv_offsets[conv]
    n = index.snapshot().conv_offsets[conv + 1] - start
    n_max = int(n.max())
    if method == "no_association":
        graph = (torch.zeros(index.n_rows * N_GRAN + 1, dtype=torch.long),
                 torch.zeros(0, dtype=torch.long))
    elif method == "no_gmm":
        graph = index.snapshot().graph(replace(index.params, rule="topk", topk=no_gmm_topk), device="cpu")
    else:
        graph = index.snapshot().graph(device="cpu")
    sizes = index.snapshot().conv_offsets[1:] - index.snapshot().conv_offsets[:-1]
    conv_of_row = torch.repeat_interleave(torch.arange(index.n_conversations), sizes)
    rows = torch.arange(index.n_rows)
    sess, conv_of_node = rows.repeat_interleave(N_GRAN), conv_of_row.repeat_interleave(N_GRAN)
    node_emb = index.snapshot().gran[index.snapshot().row_slot].reshape(-1, index.dim)
    scores, ok = memgas_session_scores_packed(
        index.q_emb[qi], conv, node_emb, sess, torch.arange(N_GRAN).repeat(index.n_rows),
        conv_of_node, graph[0], graph[1], n_gran=N_GRAN, temperature=temperature,
        alpha=alpha, damping=damping, router=router, use_router=method != "no_router",
        use_ppr=method != "no_ppr")
    return scores[:, :n_max].masked_fill(~ok[:, :n_max], float("-inf"))
