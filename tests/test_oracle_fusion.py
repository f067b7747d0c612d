"""``memgas_hybrid`` normalisation, routing and fusion against independent oracles.

* A hand-computed case: one question, three sessions, two signals whose raw values are
  set by the stand-in encoder's vectors (``dense_S = [0.8, 0.2, -0.4]``,
  ``dense_U = [0.1, 0.5, 0.3]``); every norm and fusion worked out by hand below.
* Every fusion x norm x router on a small hand-written conversation against a numpy
  re-implementation of the documented read path (z-score / max / minmax, entropy router,
  Σ w·z, reciprocal ranks, top-α seeds) whose ``ppr`` step is igraph's personalized
  PageRank on graphs built by the reference: the scikit-learn GMM edges of the dense node
  vectors and of the BM25 node vectors (bm25s weights), and their union.
"""
from __future__ import annotations

import numpy as np
import pytest

from memgas_gpu import Conversation, Dataset, Question, Session
from memgas_gpu.retrieve import MemoryIndex

from _standin import StandInEncoder, TableSource, small_dataset

pytest.importorskip("Stemmer")
pytest.importorskip("sklearn")
igraph = pytest.importorskip("igraph")
bm25s = pytest.importorskip("bm25s")
from memgas_gpu.reference import edges_to_csr, reference_edges, reference_ppr  # noqa: E402

S_RAW = np.array([0.8, 0.2, -0.4])
U_RAW = np.array([0.1, 0.5, 0.3])


@pytest.fixture(scope="module")
def tiny():
    """3 sessions of one turn; q = e0, S_i = (s_i, ., 0), U_i = (u_i, 0, .): q.S = S_RAW,
    q.U = U_RAW."""
    table = {"q": [1.0, 0.0, 0.0]}
    sessions, summ = [], {}
    for i, (s, u) in enumerate(zip(S_RAW, U_RAW)):
        text = f"[a]: session {i}"
        table[text] = [s, np.sqrt(1 - s * s), 0.0]
        table[f"summary {i}"] = [u, 0.0, np.sqrt(1 - u * u)]
        sessions.append(Session(f"s{i}", "", (text,)))
        summ[f"s{i}"] = f"summary {i}"
    ds = Dataset([Conversation("c", sessions, [Question("q0", "q")])], format="test")
    enc = StandInEncoder(table, dim=3)
    return MemoryIndex.build(ds, enc, summaries=TableSource(summ),
                             keywords=TableSource({k: "kw" for k in summ}), device="cpu",
                             progress=False)


def _scores(index, **settings):
    r = index.retrieve(method="memgas_hybrid", device="cpu",
                       **{"time_beta": 0.0, "speaker_gamma": 0.0, **settings})
    return r.scores.double().numpy(), r.rankings.numpy()


SIG2 = ("dense_S", "dense_U")
# uniform weights 1/2: score = (a + b) / 2 with a, b the normalised signals
HAND = {
    "none": [(0.8 + 0.1) / 2, (0.2 + 0.5) / 2, (-0.4 + 0.3) / 2],
    # x / max: S / 0.8 = (1, .25, -.5), U / 0.5 = (.2, 1, .6)
    "max": [(1 + 0.2) / 2, (0.25 + 1) / 2, (-0.5 + 0.6) / 2],
    # (x - min) / (max - min): S (1, .5, 0), U (0, 1, .5)
    "minmax": [0.5, 0.75, 0.25],
    # (x - mean) / sample sd: S mean .2 sd .6 -> (1, 0, -1); U mean .3 sd .2 -> (-1, 1, 0)
    "z": [0.0, 0.5, -0.5],
}


@pytest.mark.parametrize("norm", sorted(HAND))
def test_norms_by_hand(tiny, norm):
    got, rank = _scores(tiny, signals=SIG2, norm=norm, router="uniform", fusion="sum")
    np.testing.assert_allclose(got[0], HAND[norm], atol=1e-6, rtol=0)
    assert rank[0].tolist() == np.argsort(-np.array(HAND[norm]), kind="stable").tolist()


def test_rrf_by_hand(tiny):
    # ranks (1 = best, Cormack et al.) S: (1, 2, 3), U: (3, 1, 2);
    # score = Σ_s w_s / (60 + rank_s)
    got, _ = _scores(tiny, signals=SIG2, norm="none", router="uniform", fusion="rrf")
    want = [(1 / 61 + 1 / 63) / 2, (1 / 62 + 1 / 61) / 2, (1 / 63 + 1 / 62) / 2]
    np.testing.assert_allclose(got[0], want, atol=1e-9, rtol=0)


def test_router_by_hand(tiny):
    # temperature 0.1, norm none: p_S = softmax(10 S), p_U = softmax(10 U); w ∝ 1 / H
    def H(x):
        p = np.exp(10 * x - (10 * x).max())
        p /= p.sum()
        return -(p * np.log(p + 1e-12)).sum()

    w = np.array([1 / H(S_RAW), 1 / H(U_RAW)])
    w /= w.sum()
    assert abs(w[0] - w[1]) > 0.1  # S is the more peaked signal
    got, _ = _scores(tiny, signals=SIG2, norm="none", router="inverse", temperature=0.1,
                     fusion="sum")
    np.testing.assert_allclose(got[0], w[0] * S_RAW + w[1] * U_RAW, atol=1e-6, rtol=0)


@pytest.mark.parametrize("alpha,want", [(1, [0.4, 0.0, 0.0]), (3, [0.4, 0.25, 0.15]),
                                        (15, [0.4 + 0.05, 0.1 + 0.25, 0.15])])
def test_seeds_by_hand(tiny, alpha, want):
    # node scores w * x: S (.4, .1, -.2) on the S nodes, U (.05, .25, .15) on the U nodes;
    # the top-α are kept, negatives dropped, each session sums its nodes
    got, _ = _scores(tiny, signals=SIG2, norm="none", router="uniform", fusion="seeds",
                     alpha=alpha)
    np.testing.assert_allclose(got[0], want, atol=1e-6, rtol=0)
    got_none, _ = _scores(tiny, signals=SIG2, norm="none", router="uniform", fusion="ppr",
                          graph="none", alpha=alpha)
    # PageRank over no edges: every node dangles and jumps back to the reset vector
    np.testing.assert_allclose(got_none, got / got.sum(), atol=1e-9, rtol=0)


# ----------------------------------------------------------------- numpy reference
NODE = {"dense_S": 0, "dense_T": 1, "dense_Tmax": 1, "dense_U": 2, "dense_K": 3, "bm25_S": 0,
        "bm25_Tmax": 1, "bm25_Tmean": 1, "bm25_U": 2, "bm25_K": 3}


def ref_normalise(x: np.ndarray, norm: str) -> np.ndarray:
    if norm == "z":
        return (x - x.mean()) / x.std(ddof=1)
    if norm == "max":
        return x / abs(x.max())
    if norm == "minmax":
        return (x - x.min()) / (x.max() - x.min())
    return x


def ref_weights(z: np.ndarray, router: str, temperature: float) -> np.ndarray:
    if router == "uniform":
        return np.full(len(z), 1.0 / len(z))
    H = []
    for row in z:
        p = np.exp(row / temperature - (row / temperature).max())
        p /= p.sum()
        H.append(-(p * np.log(p + 1e-12)).sum())
    w = 1.0 / np.asarray(H)
    return w / w.sum()


def ref_fuse(raw: np.ndarray, signals, norm, router, temperature, fusion, alpha, damping,
             graph) -> np.ndarray:
    """One question: raw ``[S, N]`` signals -> ``[N]`` session scores."""
    z = np.stack([ref_normalise(r, norm) for r in raw])
    w = ref_weights(z, router, temperature)
    n = raw.shape[1]
    if fusion == "sum":
        return w @ z
    if fusion == "rrf":
        rank = np.argsort(np.argsort(-z, axis=1, kind="stable"), axis=1)
        return (w[:, None] / (60.0 + 1 + rank)).sum(0)  # rank 1 = best
    node = np.zeros(4 * n)
    for s, name in enumerate(signals):
        node[4 * np.arange(n) + NODE[name]] += w[s] * z[s]
    kth = np.sort(node)[::-1][min(alpha, node.size) - 1]
    node[node < kth] = 0
    node[node < 0] = 0
    if fusion == "ppr":  # no graph: PageRank over no edges returns the normalised seeds
        node = reference_ppr(graph, node, damping) if graph is not None else node / node.sum()
    return node.reshape(n, 4).sum(1)


# ----------------------------------------------------------------- reference graphs
def _bm25_weights(docs_tokens, terms) -> np.ndarray:
    """``[n_docs, len(terms)]`` BM25 weight of every term in every document: the bm25s
    score of the one-term query (0 for terms outside this corpus)."""
    r = bm25s.BM25()
    r.index(docs_tokens, show_progress=False)
    out = np.zeros((len(docs_tokens), len(terms)))
    for j, t in enumerate(terms):
        if t in r.vocab_dict:
            out[:, j] = r.get_scores([t])
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(n > 0, x / np.where(n > 0, n, 1), 0.0)


def lexical_node_vectors(conv, tok, summ, keyw) -> np.ndarray:
    """``[4N, V]`` L2-normalised BM25 document vectors (T: mean of the normalised turn
    vectors, normalised), node ``4 i + g``."""
    n = len(conv.sessions)
    docs = {"S": [tok(s.text) for s in conv.sessions],
            "T": [tok(t) for s in conv.sessions for t in s.turns],
            "U": [tok(summ.texts[s.id]) for s in conv.sessions],
            "K": [tok(keyw.texts[s.id]) for s in conv.sessions]}
    terms = sorted({t for d in docs.values() for doc in d for t in doc})
    vec = {g: _unit(_bm25_weights(d, terms)) for g, d in docs.items()}
    owner = np.repeat(np.arange(n), [len(s.turns) for s in conv.sessions])
    t_sum = np.zeros((n, len(terms)))
    np.add.at(t_sum, owner, vec["T"])
    vec["T"] = _unit(t_sum)
    return np.stack([vec[g] for g in "STUK"], 1).reshape(4 * n, len(terms))


def dense_node_vectors(conv, enc, summ, keyw) -> np.ndarray:
    rows = []
    for s in conv.sessions:
        rows += [enc.vector(s.text), np.stack([enc.vector(t) for t in s.turns]).mean(0),
                 enc.vector(summ.texts[s.id]), enc.vector(keyw.texts[s.id])]
    return np.stack(rows).astype(np.float32)


def _igraph(edges, n):
    indptr, indices = edges_to_csr(edges, n)
    src = np.repeat(np.arange(n), np.diff(indptr))
    keep = src < indices
    return igraph.Graph(n=n, edges=list(zip(src[keep].tolist(), indices[keep].tolist())),
                        directed=False)


SKIP = 2


@pytest.fixture(scope="module")
def small():
    ds, summ, keyw = small_dataset()
    enc = StandInEncoder(dim=8)
    idx = MemoryIndex.build(ds, enc, summaries=summ, keywords=keyw, device="cpu",
                            progress=False, skip_sessions=SKIP)
    conv = ds[0]
    n = 4 * len(conv.sessions)
    sess = np.repeat(np.arange(len(conv.sessions)), 4)
    dense = reference_edges(dense_node_vectors(conv, enc, summ, keyw), sess, m=30,
                            skip_sessions=SKIP)
    lexical = reference_edges(lexical_node_vectors(conv, idx.snapshot().lexical.tokenizer, summ, keyw)
                              .astype(np.float32), sess, m=30, skip_sessions=SKIP)
    assert len(dense) > 10 and len(lexical) > 10
    assert set(dense) != set(lexical)
    graphs = {"dense": _igraph(dense, n), "lexical": _igraph(lexical, n),
              "both": _igraph(dense + lexical, n), "none": None}
    return idx, graphs


SIGNALS = ("bm25_S", "bm25_Tmax", "bm25_U", "dense_Tmax", "dense_U", "dense_K")


def _raw(index, signals):
    return np.stack([index.retrieve(method="memgas_hybrid", device="cpu", signals=(s,),
                                    norm="none", router="uniform", fusion="sum",
                                    time_beta=0.0, speaker_gamma=0.0)
                     .scores.double().numpy() for s in signals], 1)  # [Q, S, N]


CASES = [(f, n, r, "dense") for f in ("sum", "rrf", "seeds", "ppr")
         for n in ("z", "max", "minmax") for r in ("inverse", "uniform")]
CASES += [("ppr", "z", "inverse", g) for g in ("lexical", "both", "none")]


@pytest.mark.parametrize("fusion,norm,router,graph", CASES)
def test_fusion_matches_numpy_and_igraph(small, fusion, norm, router, graph):
    idx, graphs = small
    raw = _raw(idx, SIGNALS)
    settings = dict(signals=SIGNALS, norm=norm, router=router, fusion=fusion, graph=graph,
                    temperature=0.5, alpha=6, damping=0.3)
    got, rank = _scores(idx, **settings)
    for q in range(raw.shape[0]):
        want = ref_fuse(raw[q], SIGNALS, norm, router, 0.5, fusion, 6, 0.3, graphs[graph])
        np.testing.assert_allclose(got[q], want, atol=1e-6, rtol=1e-6, err_msg=f"question {q}")
        assert rank[q].tolist() == np.argsort(-got[q], kind="stable").tolist()


def test_graphs_change_ppr(small):
    """The three graphs give three different rankings (so a wrong graph is visible)."""
    idx, _ = small
    out = [_scores(idx, signals=SIGNALS, fusion="ppr", graph=g, alpha=6, damping=0.3)[0]
           for g in ("dense", "lexical", "both", "none")]
    for i in range(4):
        for j in range(i):
            assert np.abs(out[i] - out[j]).max() > 1e-3, (i, j)
