"""Straightforward MemGAS reference (the authors' algorithm), used as the test oracle.

Everything here is deliberately slow and literal: one scikit-learn ``GaussianMixture``
per node for the association graph and one igraph ``personalized_pagerank`` per query.
The fast, batched versions live in :mod:`memgas_gpu.ops`; tests and benchmarks compare
the two.  scikit-learn and python-igraph are test-only dependencies, imported lazily::

    pip install -e ".[dev]"
"""
from __future__ import annotations

import warnings
from typing import List, Sequence, Tuple

import numpy as np

__all__ = [
    "reference_gmm_accept",
    "reference_gmm_accept_rows",
    "reference_edges",
    "reference_build_graph",
    "reference_ppr",
    "reference_router_weights",
    "reference_session_scores",
    "edges_to_csr",
    "import_igraph",
    "single_thread",
]


def _require(module: str, package: str):
    """``module``, or ImportError naming the package that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"memgas_gpu.reference needs {package}: "
                          "pip install -e \".[dev]\"") from exc


def _sklearn_gmm():
    return _require("sklearn.mixture", "scikit-learn").GaussianMixture


def import_igraph():
    return _require("igraph", "python-igraph")


def reference_gmm_accept(scores: np.ndarray) -> np.ndarray:
    """scikit-learn accept mask of one row (the authors' code).

    Args:
        scores: ``[k]`` scores in the order the reference passes them (descending).

    Returns:
        ``[k]`` bool: ``predict == argmax(means_)`` of
        ``GaussianMixture(n_components=2, random_state=0)``.
    """
    GaussianMixture = _sklearn_gmm()
    x = np.asarray(scores).reshape(-1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gmm = GaussianMixture(n_components=2, random_state=0).fit(x)
        labels = gmm.predict(x)
    return labels == int(np.argmax(gmm.means_))


def single_thread():
    """scikit-learn's thread pools only add overhead on 30-point fits (3x slower)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1)


def reference_gmm_accept_rows(rows) -> np.ndarray:
    """:func:`reference_gmm_accept` of every row of ``[B, k]`` (single-threaded)."""
    rows = np.asarray(rows)
    with single_thread():
        return np.stack([reference_gmm_accept(r) for r in rows]) if len(rows) else \
            np.zeros(rows.shape, dtype=bool)


def _session_starts(session_of_node: np.ndarray) -> np.ndarray:
    """For each node, the index of the first node of its session (nodes are grouped)."""
    s = np.asarray(session_of_node)
    start = np.zeros(len(s), dtype=np.int64)
    for i in range(1, len(s)):
        start[i] = start[i - 1] if s[i] == s[i - 1] else i
    return start


def reference_edges(node_emb, session_of_node, m: int = 30,
                    skip_sessions: int = 5) -> List[Tuple[int, int]]:
    """Association edges of ONE conversation, node by node (authors' code).

    For node ``i`` whose session is the ``skip_sessions``-th or later, the candidates
    are all nodes of earlier sessions (with 4 nodes per session: ``emb[:i // 4 * 4]``):
    ``sims = emb[i] @ emb[:start].T`` (float32), ``np.argsort(sims)[::-1][:m]``, then a
    scikit-learn GMM; accepted candidates ``j`` give edges ``(i, j)``.

    Args:
        node_emb: ``[n, d]`` float32 array or tensor.
        session_of_node: ``[n]`` non-decreasing session ids.
        m: number of candidates (default 30).
        skip_sessions: sessions without outgoing edges (default 5).

    Returns:
        List of directed ``(new, old)`` edges.
    """
    emb = _to_numpy(node_emb).astype(np.float32)
    start = _session_starts(_to_numpy(session_of_node))
    sess_rank = np.cumsum(np.r_[1, (start[1:] != start[:-1])]) - 1 if len(start) else start
    edges = []
    with single_thread():
        _edges_loop(emb, start, sess_rank, m, skip_sessions, edges)
    return edges


def _edges_loop(emb, start, sess_rank, m, skip_sessions, edges):
    for i in range(len(emb)):
        if sess_rank[i] < skip_sessions or start[i] == 0:
            continue
        sims = emb[i] @ emb[: start[i]].T
        sorted_indices = np.argsort(sims)[::-1]
        top = sorted_indices[: min(m, len(sorted_indices))]
        scores = sims[top]
        if len(scores) < 2:
            acc = np.ones(len(scores), dtype=bool)
        else:
            acc = reference_gmm_accept(scores)
        edges.extend((i, int(j)) for j in top[acc])


def edges_to_csr(edges: Sequence[Tuple[int, int]], n: int):
    """Symmetric, deduplicated CSR (``indptr``, ``indices``) numpy arrays from edges."""
    e = np.asarray(list(edges), dtype=np.int64).reshape(-1, 2)
    e = e[e[:, 0] != e[:, 1]]
    both = np.concatenate([e, e[:, ::-1]], axis=0)
    both = np.unique(both, axis=0)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(indptr, both[:, 0] + 1, 1)
    return np.cumsum(indptr), both[:, 1].copy()


def reference_build_graph(node_emb, session_of_node, m: int = 30, skip_sessions: int = 5):
    """igraph ``Graph(n, edges, directed=False)`` of one conversation."""
    ig = import_igraph()
    n = len(_to_numpy(session_of_node))
    return ig.Graph(n=n, edges=reference_edges(node_emb, session_of_node, m, skip_sessions),
                    directed=False)


def reference_ppr(graph, reset, damping: float = 0.1) -> np.ndarray:
    """igraph prpack personalized PageRank of one reset vector (authors' code).

    ``reset`` is cleaned as ``where(isnan(r) | (r < 0), 0, r)`` first. An all-zero
    reset returns zeros (igraph would raise).
    """
    r = np.asarray(reset, dtype=np.float64)
    r = np.where(np.isnan(r) | (r < 0), 0.0, r)
    if r.sum() <= 0:
        return np.zeros(graph.vcount())
    return np.asarray(graph.personalized_pagerank(
        damping=damping, directed=False, reset=r.tolist(), implementation="prpack"))


def reference_router_weights(query_emb, gran_emb, temperature: float = 0.2,
                             mode: str = "inverse") -> np.ndarray:
    """Entropy router of one query (float64 numpy). ``gran_emb``: ``[G, N, d]``."""
    q = _to_numpy(query_emb).astype(np.float64)
    X = _to_numpy(gran_emb).astype(np.float64)
    H = []
    for g in range(X.shape[0]):
        z = X[g] @ q / temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        H.append(-(p * np.log(p + 1e-12)).sum())
    H = np.asarray(H)
    if mode == "inverse":
        w = 1.0 / np.maximum(H, 1e-12)
    elif mode == "one_minus":
        w = 1.0 - H
    else:
        raise ValueError(mode)
    return w / w.sum()


def reference_session_scores(query_emb, node_emb, session_of_node, gran_of_node, graph,
                             n_sessions: int, temperature: float = 0.2, alpha: int = 15,
                             damping: float = 0.1, router: str = "inverse",
                             use_router: bool = True, use_ppr: bool = True) -> np.ndarray:
    """Per-query MemGAS session scores of one conversation (authors' code, one by one).

    Returns ``[Q, N]`` float64 scores; rank with ``np.argsort(-scores)``.
    """
    Q = np.atleast_2d(_to_numpy(query_emb)).astype(np.float32)
    E = _to_numpy(node_emb).astype(np.float32)
    sess = _to_numpy(session_of_node).astype(np.int64)
    gran = _to_numpy(gran_of_node).astype(np.int64)
    G = int(gran.max()) + 1
    d = E.shape[1]
    gran_emb = np.zeros((G, n_sessions, d), dtype=np.float32)
    gran_emb[gran, sess] = E
    out = np.zeros((len(Q), n_sessions))
    for qi, q in enumerate(Q):
        sims = (E @ q).astype(np.float64)
        if use_router:
            w = reference_router_weights(q, gran_emb, temperature, router)
        else:
            w = np.full(G, 1.0 / G)
        scores = w[gran] * sims
        k = min(alpha, len(scores))
        topk_values = np.sort(scores)[::-1][:k]
        scores[scores < topk_values[-1]] = 0
        scores = np.where(np.isnan(scores) | (scores < 0), 0.0, scores)
        node = reference_ppr(graph, scores, damping) if use_ppr else scores
        np.add.at(out[qi], sess, node)
    return out


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)
