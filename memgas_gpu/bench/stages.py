"""Benchmark points of the core stages, ours against the reference way, same inputs.

* graph build: :func:`memgas_gpu.ops.build_association_graph` (all conversations,
  batched GMM) vs the authors' per-node loop (numpy similarities, ``argsort``, one
  scikit-learn ``GaussianMixture`` per node, :mod:`memgas_gpu.reference`), timed on an
  evenly spaced node subsample of one haystack and extrapolated (every haystack has
  the same shape, and a per-question loop is linear in haystacks);
* read path (routing + PPR + ranking): the engine's ``memgas`` preset and an
  ``argsort`` for all questions at once (throughput), and
  :func:`memgas_session_scores` for one question against its own haystack (latency
  p50/p99), vs :func:`memgas_gpu.reference.reference_session_scores` (numpy router,
  igraph prpack PPR) and ``np.argsort``, one question at a time;
* BM25: :func:`memgas_gpu.lexical.bm25_gather` over precomputed postings for all
  questions (dense ``[Q, N]`` scores) vs ``bm25s`` ``get_scores`` one question at a
  time on its haystack's own index.

Every function returns ``[ours, reference]`` :class:`Record` s (the reference may be
missing when its library is not installed; the reason is logged).
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np
import torch

from .. import ops
from .data import N_GRAN, Haystacks, Terms
from .limits import bm25_cost, graph_cost, query_cost
from .timing import Record, measure, percentile, sync

__all__ = ["graph_point", "query_point", "bm25_point", "graph_runner", "query_runner",
           "bm25_runner", "reference_graph_seconds", "conversation_csr"]

Log = Callable[[str], None]


def _size(h: Haystacks) -> dict:
    return {"haystacks": h.n_conv, "sessions": h.n_sessions}


def reference_graph_seconds(node_emb, max_nodes: int, m: int = 30,
                            skip_sessions: int = 5) -> tuple[float, int, int]:
    """Seconds of the per-node reference graph build of ONE conversation.

    Times ``max_nodes`` evenly spaced eligible nodes (all of them when fewer) and
    scales to all eligible nodes. Returns ``(seconds, timed_nodes, eligible_nodes)``.
    """
    from ..reference import reference_gmm_accept, single_thread

    emb = node_emb.detach().cpu().numpy() if hasattr(node_emb, "detach") else node_emb
    eligible = np.arange(skip_sessions * N_GRAN, len(emb))
    if len(eligible) == 0:
        return 0.0, 0, 0
    pick = eligible if len(eligible) <= max_nodes else \
        eligible[np.linspace(0, len(eligible) - 1, max_nodes).astype(int)]
    with single_thread():
        reference_gmm_accept(np.linspace(0.0, 1.0, m))  # warm-up: imports, first-fit costs
        t0 = time.perf_counter()
        for i in pick:
            sims = emb[i] @ emb[: i // N_GRAN * N_GRAN].T
            top = np.argsort(sims)[::-1][:m]
            if len(top) >= 2:
                reference_gmm_accept(sims[top])
        dt = time.perf_counter() - t0
    return dt * len(eligible) / len(pick), len(pick), len(eligible)


def graph_runner(h: Haystacks) -> Callable[[], tuple]:
    """``f()`` -> ``(indptr, indices)``: our association graph of all haystacks of ``h``."""
    return lambda: ops.build_association_graph(h.node_emb, h.session_of_node,
                                               conversation_of_node=h.conv_of_node)


def query_runner(h: Haystacks, graph: tuple, q: torch.Tensor, qconv: torch.Tensor
                 ) -> Callable[[], torch.Tensor]:
    """``f()`` -> ``[Q, N]`` rankings: routing + PPR + ranking of every question at once."""
    from ..retrieve import PRESETS, QueryBatch
    from ..retrieve.engine import score
    from .data import index_from_nodes

    dev = h.node_emb.device
    view = index_from_nodes(h.node_emb, [h.n_sessions] * h.n_conv,
                            (graph[0].to(dev), graph[1].to(dev))).view()
    batch = QueryBatch(q, qconv)
    p = PRESETS["memgas"]

    def run():
        sc, n = score(view, batch, p, str(dev))
        return ops.rank_sessions(sc, n)

    return run


def bm25_runner(terms: Terms, device=None) -> Callable[[], torch.Tensor]:
    """``f()`` -> dense ``[Q, n_max]`` BM25 scores of every query against its haystack's
    documents (what ``bm25s`` ``get_scores`` returns per question). The posting lists
    (:func:`memgas_gpu.lexical.bm25_postings`, question-independent, as ``bm25s`` builds
    at index time) are built here, outside the timing; each call is one gather of the
    touched postings and one scatter-add."""
    from ..lexical import bm25_gather, bm25_postings

    t = terms.to(device or "cpu")
    post = bm25_postings(t.doc_indptr, t.doc_indices, t.doc_tf, t.doc_group, t.n_terms)
    n_docs = t.doc_group.numel()
    sizes = torch.bincount(t.doc_group) if n_docs else t.doc_group.new_zeros(1)
    first = torch.cumsum(sizes, 0) - sizes
    doc_pos = torch.arange(n_docs, device=t.doc_group.device) - first[t.doc_group]
    width = int(sizes.max()) if n_docs else 0
    Q = t.q_indptr.numel() - 1

    def run():
        q, d, v = bm25_gather(post, t.q_indptr, t.q_indices, t.q_tf, t.q_group)
        out = torch.zeros(Q * width, dtype=v.dtype, device=v.device)
        return out.index_add_(0, doc_pos.index_select(0, d).add_(q * width), v).view(Q, width)

    run.index = (post, t, width)
    return run


def graph_point(h: Haystacks, *, rounds: int = 3, warmup: int = 1, ref_nodes: int = 100,
                sweep: str = "", reference: bool = True, ref_cache: Optional[dict] = None,
                log: Log = print) -> tuple[list[Record], tuple]:
    """Graph build of all haystacks of ``h``; returns ``(records, (indptr, indices))``."""
    dev = h.node_emb.device
    out = {}
    build = graph_runner(h)

    def run():
        out["g"] = build()

    flops, nbytes = graph_cost(h.n_conv, h.n_sessions, h.dim)
    rec = measure(run, stage="graph", impl="ours", size=_size(h), work=h.n_nodes,
                  unit="nodes", rounds=rounds, warmup=warmup, device=dev, sweep=sweep,
                  extra={"flops": flops, "bytes": nbytes})
    indptr, indices = out["g"]
    rec.extra["edges"] = int(indices.numel()) // 2
    recs = [rec]
    if reference:
        try:
            key = (h.n_sessions, h.dim, ref_nodes)
            if ref_cache is not None and key in ref_cache:
                one, k, n = ref_cache[key]
            else:
                one, k, n = reference_graph_seconds(h.conversation(0)[0], ref_nodes)
                if ref_cache is not None:
                    ref_cache[key] = (one, k, n)
            if k == n and h.n_conv == 1:
                note = "measured"
            else:
                note = (f"extrapolated from {k} of {n} nodes of 1 haystack"
                        + (f", x {h.n_conv} haystacks" if h.n_conv > 1 else ""))
            recs.append(Record("graph", "reference", _size(h), [one * h.n_conv], h.n_nodes,
                               "nodes", sweep, note))
        except ImportError as e:
            log(f"graph reference skipped: {e}")
    return recs, (indptr, indices)


def conversation_csr(indptr: torch.Tensor, indices: torch.Tensor, a: int, b: int):
    """Sub-CSR of nodes ``[a, b)`` of a block-diagonal graph (renumbered from 0)."""
    p0, p1 = int(indptr[a]), int(indptr[b])
    return indptr[a:b + 1] - p0, indices[p0:p1] - a


def query_point(h: Haystacks, graph: tuple, q: torch.Tensor, qconv: torch.Tensor, *,
                rounds: int = 5, warmup: int = 1, latency_calls: int = 50,
                ref_queries: int = 50, sweep: str = "", reference: bool = True,
                log: Log = print) -> list[Record]:
    """Routing + PPR + ranking of all queries ``q`` (``qconv``: their haystack)."""
    dev = h.node_emb.device
    indptr, indices = graph[0].to(dev), graph[1].to(dev)
    Q = int(q.shape[0])
    size = dict(_size(h), queries=Q)
    run_batch = query_runner(h, (indptr, indices), q, qconv)

    flops, nbytes = query_cost(Q, h.n_sessions, h.dim, int(indices.numel()), h.n_nodes,
                               h.n_conv)
    rec = measure(run_batch, stage="query", impl="ours", size=size, work=Q, unit="queries",
                  rounds=rounds, warmup=warmup, device=dev, sweep=sweep,
                  extra={"flops": flops, "bytes": nbytes})
    per = h.n_sessions * N_GRAN
    sess_local = torch.arange(h.n_sessions, device=dev).repeat_interleave(N_GRAN)
    lat = []
    if latency_calls:
        subs = {}
        for k in range(latency_calls + 1):
            i = k % Q
            c = int(qconv[i])
            if c not in subs:
                subs[c] = conversation_csr(indptr, indices, c * per, (c + 1) * per)
            ip, ix = subs[c]
            e = h.node_emb[c * per:(c + 1) * per]
            t0 = time.perf_counter()
            s = ops.memgas_session_scores(q[i], e, sess_local, h.gran_of_node[:per], ip, ix,
                                          n_sessions=h.n_sessions, n_gran=N_GRAN)
            torch.argsort(s, descending=True)
            sync(dev)
            if k:  # the first call is a warm-up
                lat.append(time.perf_counter() - t0)
        rec.extra.update(latency_p50_s=percentile(lat, 50), latency_p99_s=percentile(lat, 99),
                         latency_calls=len(lat))
    recs = [rec]
    if reference:
        try:
            recs.append(_reference_queries(h, (indptr.cpu(), indices.cpu()), q, qconv,
                                           ref_queries, size, sweep))
        except ImportError as e:
            log(f"query reference skipped: {e}")
    return recs


def _reference_queries(h, graph, q, qconv, ref_queries, size, sweep) -> Record:
    from ..reference import import_igraph, reference_session_scores

    ig = import_igraph()
    indptr, indices = graph
    per = h.n_sessions * N_GRAN
    Q = int(q.shape[0])
    k = min(Q, max(1, ref_queries))
    pick = np.linspace(0, Q - 1, k).astype(int) if k < Q else np.arange(Q)
    qn = q.detach().cpu().numpy()
    sess = np.repeat(np.arange(h.n_sessions), N_GRAN)
    gran = np.tile(np.arange(N_GRAN), h.n_sessions)
    graphs, embs, times = {}, {}, []
    for i in pick:
        c = int(qconv[i])
        if c not in graphs:  # built outside the timing: index-time work
            ip, ix = conversation_csr(indptr, indices, c * per, (c + 1) * per)
            rows = torch.repeat_interleave(torch.arange(per), ip[1:] - ip[:-1])
            keep = rows < ix
            graphs[c] = ig.Graph(n=per, edges=torch.stack([rows[keep], ix[keep]]).T.tolist(),
                                 directed=False)
            embs[c] = h.node_emb[c * per:(c + 1) * per].detach().cpu().numpy()
        if not times:  # warm-up call (first-call costs are not per-query work)
            reference_session_scores(qn[i:i + 1], embs[c], sess, gran, graphs[c], h.n_sessions)
        t0 = time.perf_counter()
        s = reference_session_scores(qn[i:i + 1], embs[c], sess, gran, graphs[c], h.n_sessions)
        np.argsort(-s[0])
        times.append(time.perf_counter() - t0)
    total = sum(times) * Q / len(times)
    note = "measured" if len(times) == Q else f"extrapolated from {len(times)} of {Q} queries"
    return Record("query", "reference", size, [total], Q, "queries", sweep, note,
                  extra={"latency_p50_s": percentile(times, 50),
                         "latency_p99_s": percentile(times, 99), "latency_calls": len(times)})


def bm25_point(terms: Terms, n_sessions: int, *, device=None, rounds: int = 5,
               warmup: int = 1, ref_queries: int = 100, sweep: str = "",
               reference: bool = True, log: Log = print) -> list[Record]:
    """BM25 scores of every query against its haystack's sessions (index precomputed)."""
    try:
        run = bm25_runner(terms, device)
    except ImportError as e:
        log(f"bm25 skipped: memgas_gpu.lexical is not importable ({e})")
        return []
    post, t, width = run.index
    n_conv = int(t.doc_group.max()) + 1 if t.doc_group.numel() else 0
    Q = t.q_indptr.numel() - 1
    size = {"haystacks": n_conv, "sessions": n_sessions, "queries": Q}
    flops, nbytes = bm25_cost(post, t, width)
    rec = measure(run, stage="bm25", impl="ours", size=size, work=Q, unit="queries", rounds=rounds,
                  warmup=warmup, device=device, sweep=sweep,
                  extra={"flops": flops, "bytes": nbytes})
    recs = [rec]
    if reference:
        try:
            recs.append(_reference_bm25(terms, n_sessions, ref_queries, size, sweep))
        except ImportError as e:
            log(f"bm25 reference skipped: bm25s is not installed ({e})")
    return recs


def _reference_bm25(terms: Terms, n_sessions: int, ref_queries: int, size: dict,
                    sweep: str) -> Record:
    import bm25s

    def rows(indptr, indices, tf, i):
        a, b = int(indptr[i]), int(indptr[i + 1])
        return [str(int(w)) for w, c in zip(indices[a:b], tf[a:b]) for _ in range(int(c))]

    Q = terms.q_indptr.numel() - 1
    k = min(Q, max(1, ref_queries))
    pick = np.linspace(0, Q - 1, k).astype(int) if k < Q else np.arange(Q)
    retrievers, times = {}, []
    for i in pick:
        c = int(terms.q_group[i])
        if c not in retrievers:  # index-time work, outside the timing
            r = bm25s.BM25()
            r.index([rows(terms.doc_indptr, terms.doc_indices, terms.doc_tf, j)
                     for j in range(c * n_sessions, (c + 1) * n_sessions)], show_progress=False)
            retrievers[c] = r
        qt = rows(terms.q_indptr, terms.q_indices, terms.q_tf, i)
        if not times:
            retrievers[c].get_scores(qt)  # warm-up
        t0 = time.perf_counter()
        retrievers[c].get_scores(qt)
        times.append(time.perf_counter() - t0)
    total = sum(times) * Q / len(times)
    note = "measured" if len(times) == Q else f"extrapolated from {len(times)} of {Q} queries"
    return Record("bm25", "reference", size, [total], Q, "queries", sweep,
                  note + " (bm25s get_scores per question)",
                  extra={"latency_p50_s": percentile(times, 50),
                         "latency_p99_s": percentile(times, 99)})
