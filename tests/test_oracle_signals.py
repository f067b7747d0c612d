"""Every ``memgas_hybrid`` signal against a direct computation.

A single signal with ``norm="none", router="uniform", fusion="sum"`` scores each session
by the raw signal, so ``index.retrieve(...).scores`` is compared with: numpy dot products
of the stand-in encoder's own vectors (dense signals), and ``bm25s`` over the same tokens
(BM25 signals), on a small hand-written conversation and on real LoCoMo (conv-30).
"""
from __future__ import annotations

import numpy as np
import pytest

from memgas_gpu.retrieve import MemoryIndex

from _standin import StandInEncoder, small_dataset

bm25s = pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

RAW = dict(norm="none", router="uniform", fusion="sum", time_beta=0.0,
           speaker_gamma=0.0)  # the raw signal: the question cues off


def _signal(index, name, questions=None):
    r = index.retrieve(questions, method="memgas_hybrid", signals=(name,), device="cpu", **RAW)
    return r.scores.double().numpy()


@pytest.fixture(scope="module")
def small():
    ds, summ, keyw = small_dataset()
    enc = StandInEncoder(dim=8)
    idx = MemoryIndex.build(ds, enc, summaries=summ, keywords=keyw, device="cpu",
                            progress=False)
    return ds[0], summ, keyw, enc, idx


def test_dense_signals_are_dot_products_of_the_encoder_vectors(small):
    conv, summ, keyw, enc, idx = small
    q = np.stack([enc.vector(x.text) for x in conv.questions]).astype(np.float64)
    S = np.stack([enc.vector(s.text) for s in conv.sessions]).astype(np.float64)
    U = np.stack([enc.vector(summ.texts[s.id]) for s in conv.sessions]).astype(np.float64)
    K = np.stack([enc.vector(keyw.texts[s.id]) for s in conv.sessions]).astype(np.float64)
    turns = [np.stack([enc.vector(t) for t in s.turns]).astype(np.float64)
             for s in conv.sessions]
    T = np.stack([t.mean(0) for t in turns])  # T = mean of the turn embeddings
    tmax = np.stack([(q @ t.T).max(1) for t in turns], 1)
    tmin = np.stack([(q @ t.T).min(1) for t in turns], 1)
    assert np.abs(tmax - tmin).min() > 1e-3  # every session's turns differ for every question
    want = {"dense_S": q @ S.T, "dense_T": q @ T.T, "dense_U": q @ U.T, "dense_K": q @ K.T,
            "dense_Tmax": tmax}
    for name, w in want.items():
        np.testing.assert_allclose(_signal(idx, name), w, atol=1e-5, rtol=0, err_msg=name)


def _bm25(corpus_tokens, query_tokens) -> np.ndarray:
    """bm25s scores (lucene, k1=1.5, b=0.75) of one query; 0 when no term is known."""
    r = bm25s.BM25()
    r.index(corpus_tokens, show_progress=False)
    known = [t for t in query_tokens if t in r.vocab_dict]
    return r.get_scores(known) if known else np.zeros(len(corpus_tokens))


def _bm25_expected(conv, tok, summaries, keywords):
    """``{signal: [Q, N]}`` from bm25s over the conversation's documents of each kind."""
    n = len(conv.sessions)
    owner = np.repeat(np.arange(n), [len(s.turns) for s in conv.sessions])
    docs = {"S": [tok(s.text) for s in conv.sessions],
            "T": [tok(t) for s in conv.sessions for t in s.turns],
            "U": [tok(x) for x in summaries], "K": [tok(x) for x in keywords]}
    out = {k: [] for k in ("bm25_S", "bm25_Tmax", "bm25_Tmean", "bm25_U", "bm25_K")}
    for q in conv.questions:
        qt = tok(q.text)
        out["bm25_S"].append(_bm25(docs["S"], qt))
        out["bm25_U"].append(_bm25(docs["U"], qt))
        out["bm25_K"].append(_bm25(docs["K"], qt))
        ts = _bm25(docs["T"], qt)
        best = np.zeros(n)
        np.maximum.at(best, owner, ts)
        out["bm25_Tmax"].append(best)
        out["bm25_Tmean"].append(np.bincount(owner, ts, minlength=n)
                                 / np.maximum(np.bincount(owner, minlength=n), 1))
    return {k: np.stack(v) for k, v in out.items()}


def test_bm25_signals_equal_bm25s_small(small):
    conv, summ, keyw, _, idx = small
    tok = idx.snapshot().lexical.tokenizer
    want = _bm25_expected(conv, tok, [summ.texts[s.id] for s in conv.sessions],
                          [keyw.texts[s.id] for s in conv.sessions])
    # the U and K documents differ, and so do Tmax and Tmean: a swap is visible
    assert np.abs(want["bm25_U"] - want["bm25_K"]).max() > 0.5
    assert np.abs(want["bm25_Tmax"] - want["bm25_Tmean"]).max() > 0.5
    for name, w in want.items():
        np.testing.assert_allclose(_signal(idx, name), w, rtol=1e-4, atol=1e-4, err_msg=name)


def test_bm25_signals_equal_bm25s_locomo(locomo_index):
    """conv-30, 105 questions: U = LoCoMo's own summaries, K = the index's keyword texts
    (offline extractor, recomputed here as the input of the oracle)."""
    from memgas_gpu.expand import expand_dataset

    ds, idx = locomo_index
    conv = ds[0]
    exp = expand_dataset(ds, summaries="source")
    want = _bm25_expected(conv, idx.snapshot().lexical.tokenizer, exp.summaries[conv.id],
                          exp.keywords[conv.id])
    for name, w in want.items():
        np.testing.assert_allclose(_signal(idx, name), w, rtol=1e-4, atol=1e-4, err_msg=name)


def test_dense_tmax_on_locomo_is_the_best_turn(locomo_index, minilm):
    """dense_Tmax of conv-30 = max over each session's turns of the question . turn
    product (the turn vectors encoded again by the bundled encoder for two sessions)."""
    ds, idx = locomo_index
    got = _signal(idx, "dense_Tmax", questions=range(20))
    q = idx.q_emb[:20].double().numpy()
    for i in (0, 7):
        t = minilm.encode(list(ds[0].sessions[i].turns)).double().numpy()
        np.testing.assert_allclose(got[:, i], (q @ t.T).max(1), atol=1e-5, rtol=0)
