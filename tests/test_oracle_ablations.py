"""Each MemGAS ablation against the straightforward reference on real LoCoMo (conv-30).

As ``memgas`` is checked in test_pipeline.py: the reference is the authors' algorithm one
question at a time (:func:`memgas_gpu.reference.reference_session_scores`: router,
top-α seeds, igraph PPR) on a graph built by the reference, with the ablated step
switched off there: no router, no PPR, a graph without edges, a top-5 accept-all graph.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")
igraph = pytest.importorskip("igraph")
from memgas_gpu.reference import (reference_build_graph,  # noqa: E402
                                  reference_session_scores)


def topk_accept_all_edges(emb: np.ndarray, n_gran: int = 4, k: int = 5,
                          skip_sessions: int = 5) -> list:
    """``no_gmm``'s graph the plain way: every node of session ``>= skip_sessions`` is
    linked to its ``k`` most similar nodes of earlier sessions (float32 dot products)."""
    edges = []
    for i in range(len(emb)):
        start = i // n_gran * n_gran
        if i // n_gran < skip_sessions:
            continue
        sims = emb[:start] @ emb[i]
        edges += [(i, int(j)) for j in np.argsort(-sims, kind="stable")[:k]]
    return edges


@pytest.fixture(scope="module")
def ref(locomo_index):
    _, idx = locomo_index
    emb = idx.snapshot().node_embeddings().numpy()
    n = idx.n_rows * 4
    sess = np.repeat(np.arange(idx.n_rows), 4)
    graphs = {"gmm": reference_build_graph(emb, sess, m=30, skip_sessions=5),
              "none": igraph.Graph(n=n, directed=False),
              "topk5": igraph.Graph(n=n, edges=topk_accept_all_edges(emb), directed=False)}
    graphs["topk5"].simplify()  # a pair linked both ways is one undirected edge
    assert graphs["gmm"].ecount() > 100 and graphs["topk5"].ecount() > 100

    def scores(graph, **kw):
        return reference_session_scores(idx.q_emb.numpy(), emb, sess,
                                        np.tile(np.arange(4), idx.n_rows), graphs[graph],
                                        n_sessions=idx.n_rows, **kw)

    return idx, scores


CASES = {
    "no_ppr": ("gmm", dict(use_ppr=False)),
    "no_router": ("gmm", dict(use_router=False)),
    "no_association": ("none", {}),
    "no_gmm": ("topk5", {}),
}


@pytest.mark.parametrize("method", sorted(CASES))
def test_ablation_matches_reference(ref, method):
    idx, scores = ref
    graph, kw = CASES[method]
    want = scores(graph, **kw)
    r = idx.retrieve(method=method, device="cpu")
    np.testing.assert_allclose(r.scores.double().numpy(), want, atol=1e-6, rtol=0)
    agree = sum(np.argsort(-want[q], kind="stable")[:10].tolist() == r.rankings[q, :10].tolist()
                for q in range(len(want)))
    assert agree >= 0.99 * len(want), f"top-10 agree on {agree}/{len(want)}"


def test_ablations_differ_from_each_other(ref):
    """The references of the four ablations and of memgas are five different rankings,
    so an ablation wired to another one's setting cannot pass the test above."""
    _, scores = ref
    outs = {"memgas": scores("gmm")} | {m: scores(g, **kw) for m, (g, kw) in CASES.items()}
    names = sorted(outs)
    for i, a in enumerate(names):
        for b in names[:i]:
            assert np.abs(outs[a] - outs[b]).max() > 1e-3, (a, b)
