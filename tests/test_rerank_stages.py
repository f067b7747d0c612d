"""The re-ranking stages of benchmarks/rerank_stages.py (multi_evidence.py runs them):
set selection (xQuAD over question terms, MMR) against hand-computed cases and a
per-question Python reference of each formula; RM3 query expansion (hand-computed);
per-term BM25 contributions against the summed BM25 signals and bm25s on single-term
queries."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from memgas_gpu.lexical import BM25Params, TermMatrix

from _views import question_signals

from _benchmarks import load_benchmark

_stages = load_benchmark("rerank_stages")
xquad, mmr, order_scores = _stages.xquad, _stages.mmr, _stages.order_scores
feedback_weights, rm3_expand = _stages.feedback_weights, _stages.rm3_expand
query_term_scores, term_coverage = _stages.query_term_scores, _stages.term_coverage


def _order(scores, valid):
    s = scores.masked_fill(~valid, float("-inf"))
    return torch.argsort(s, dim=1, descending=True, stable=True)


def test_xquad_hand_case_prefers_the_uncovered_term():
    # s0 and s1 match term 0 only, s2 term 1 only; equal term weights
    rel = torch.tensor([[1.0, 0.9, 0.5]], dtype=torch.float64)
    cover = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    valid = torch.ones(1, 3, dtype=torch.bool)
    # place 1: 1 + .5 = 1.5 (s0) > 1.4 > 1.0; place 2: s1 0.9 + 0, s2 0.5 + 0.5 = 1.0
    assert _order(xquad(rel, valid, cover, w, k=3, beta=1.0), valid)[0].tolist() == [0, 2, 1]
    assert _order(xquad(rel, valid, cover, w, k=3, beta=0.0), valid)[0].tolist() == [0, 1, 2]
    # beta 0.79: s2's place-2 gain 0.895 < 0.9
    assert _order(xquad(rel, valid, cover, w, k=3, beta=0.79), valid)[0].tolist() == [0, 1, 2]


def test_mmr_hand_case_skips_the_near_duplicate():
    rel = torch.tensor([[1.0, 0.95, 0.5]], dtype=torch.float64)
    sim = torch.tensor([[1.0, 0.9, 0.1], [0.9, 1.0, 0.2], [0.1, 0.2, 1.0]], dtype=torch.float64)
    valid = torch.ones(1, 3, dtype=torch.bool)
    # place 2: s1 0.95 - 0.9 = 0.05, s2 0.5 - 0.1 = 0.4
    assert _order(mmr(rel, valid, sim, k=3, beta=1.0), valid)[0].tolist() == [0, 2, 1]
    assert _order(mmr(rel, valid, sim, k=3, beta=0.0), valid)[0].tolist() == [0, 1, 2]


def _xquad_ref(rel, valid, cover, w, k, beta):
    out = []
    for q in range(rel.shape[0]):
        cand = [n for n in range(rel.shape[1]) if valid[q, n]]
        ww = w[q] / w[q].sum() if w[q].sum() > 0 else w[q]
        res = [1.0] * cover.shape[2]
        chosen = []
        for _ in range(min(k, len(cand))):
            def gain(n):
                return float(rel[q, n]) + beta * sum(float(ww[t] * cover[q, n, t]) * res[t]
                                                     for t in range(cover.shape[2]))
            best = max(cand, key=lambda n: (gain(n), -n))
            chosen.append(best)
            cand.remove(best)
            res = [r * (1 - float(cover[q, best, t])) for t, r in enumerate(res)]
        out.append(chosen)
    return out


def _mmr_ref(rel, valid, sim, k, beta):
    out = []
    for q in range(rel.shape[0]):
        cand = [n for n in range(rel.shape[1]) if valid[q, n]]
        chosen = []
        for _ in range(min(k, len(cand))):
            def gain(n):
                red = max((float(sim[q, n, s]) for s in chosen), default=0.0)
                return float(rel[q, n]) - beta * red
            best = max(cand, key=lambda n: (gain(n), -n))
            chosen.append(best)
            cand.remove(best)
        out.append(chosen)
    return out


def test_batched_equals_per_question_reference_with_padding():
    g = torch.Generator().manual_seed(0)
    Q, N, L, k = 7, 9, 4, 5
    rel = torch.randn(Q, N, generator=g, dtype=torch.float64)
    n = torch.tensor([9, 3, 6, 1, 9, 5, 4])
    valid = torch.arange(N)[None] < n[:, None]
    cover = torch.rand(Q, N, L, generator=g, dtype=torch.float64)
    cover[cover < 0.5] = 0
    w = torch.rand(Q, L, generator=g, dtype=torch.float64)
    w[2] = 0  # a question without terms
    e = torch.nn.functional.normalize(torch.randn(Q, N, 6, generator=g, dtype=torch.float64),
                                      dim=-1)
    sim = e @ e.transpose(1, 2)
    for beta in (0.3, 1.5):
        got = _order(xquad(rel, valid, cover, w, k=k, beta=beta), valid)
        for q, want in enumerate(_xquad_ref(rel, valid, cover, w, k, beta)):
            assert got[q, :len(want)].tolist() == want
        got = _order(mmr(rel, valid, sim, k=k, beta=beta), valid)
        for q, want in enumerate(_mmr_ref(rel, valid, sim, k, beta)):
            assert got[q, :len(want)].tolist() == want


def test_order_scores_keeps_the_rest_in_relevance_order():
    rel = torch.tensor([[0.1, 0.5, 0.3, 0.9, 0.0]])
    valid = torch.tensor([[True, True, True, True, False]])
    s = order_scores(rel, valid, torch.tensor([[2, 0]]))
    assert _order(s, valid)[0, :4].tolist() == [2, 0, 3, 1]
    assert s[0, 4] == float("-inf")


def _dense(m: TermMatrix, V: int) -> torch.Tensor:
    out = torch.zeros(m.n_rows, V, dtype=torch.float64)
    for r in range(m.n_rows):
        a, b = int(m.indptr[r]), int(m.indptr[r + 1])
        out[r, m.indices[a:b]] = m.tf[a:b].double()
    return out


def test_rm3_hand_case():
    # query 0: terms {0: 2}; query 1: {1: 1}; three docs
    q = TermMatrix.from_ids([[0, 0], [1]])
    docs = TermMatrix.from_ids([[0, 2, 2, 3], [0, 4], [1, 1, 5]])
    fb = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    out = _dense(rm3_expand(q, docs, fb, n_terms=2, lam=0.5), 6)
    # P(t|R) for q0 = .5 (d0: 0 .25, 2 .5, 3 .25) + .5 (d1: 0 .5, 4 .5)
    #   = {0: .375, 2: .25, 3: .125, 4: .25}; top 2 with a tie at .25 -> 0 and the first
    #   of the tied terms in the sort (2); renormalised {0: .6, 2: .4}
    # |q| = 2: 2 * (.5 * 1 + .5 * .6) = 1.6 for term 0, 2 * .5 * .4 = .4 for term 2
    want0 = torch.tensor([1.6, 0, 0.4, 0, 0, 0], dtype=torch.float64)
    assert torch.allclose(out[0], want0, atol=1e-6)
    # a question without feedback keeps its terms
    assert torch.allclose(out[1], torch.tensor([0, 1.0, 0, 0, 0, 0], dtype=torch.float64))
    # lam = 0 is the original query
    same = _dense(rm3_expand(q, docs, fb, n_terms=2, lam=0.0), 6)
    assert torch.allclose(same, _dense(q, 6))


def test_feedback_weights_uniform_and_softmax_over_top_m():
    s = torch.tensor([[3.0, 1.0, 2.0, 9.0]])
    valid = torch.tensor([[True, True, True, False]])
    doc_of = torch.tensor([[10, 11, 12, 13]])
    w = feedback_weights(s, valid, doc_of, 14, m=2).to_dense()
    assert w[0, 10] == 0.5 and w[0, 12] == 0.5 and w[0].sum() == 1.0
    w = feedback_weights(s, valid, doc_of, 14, m=2, temperature=1.0).to_dense()
    e = np.exp([3.0, 2.0])
    assert torch.allclose(w[0, [10, 12]], torch.tensor(e / e.sum()))


def test_term_scores_sum_to_the_bm25_signals(locomo_index):
    _, idx = locomo_index
    qi = torch.arange(len(idx.questions))
    got = question_signals(idx, ("bm25_S", "bm25_U"), qi, params=BM25Params(), device="cpu")
    for g, name in (("S", "bm25_S"), ("U", "bm25_U")):
        ts, mask = query_term_scores(idx, qi, g, device="cpu")
        assert torch.allclose(ts.sum(1), got[name], rtol=1e-4, atol=1e-4)
        assert not ts[~mask].any()


def test_turn_term_scores_are_the_best_turn_of_a_one_term_query(locomo_index):
    bm25s = pytest.importorskip("bm25s")
    ds, idx = locomo_index
    conv = ds[0]
    tok = idx.snapshot().lexical.tokenizer
    turns = [tok(x) for s in conv.sessions for x in s.turns]
    r = bm25s.BM25()
    r.index(turns, show_progress=False)
    owner = np.repeat(np.arange(len(conv.sessions)), [len(s.turns) for s in conv.sessions])
    qi = torch.arange(12)
    ts, mask = query_term_scores(idx, qi, "T", device="cpu")
    vocab = idx.snapshot().lexical.vocab.terms
    qm = idx.snapshot().lexical.queries.rows(qi)
    for i in range(12):
        a, b = int(qm.indptr[i]), int(qm.indptr[i + 1])
        for j, (t, tf) in enumerate(zip(qm.indices[a:b].tolist(), qm.tf[a:b].tolist())):
            term = vocab[t]
            best = np.zeros(len(conv.sessions))
            if term in r.vocab_dict:
                np.maximum.at(best, owner, tf * r.get_scores([term]))
            np.testing.assert_allclose(ts[i, j].numpy(), best, rtol=1e-4, atol=1e-4)
    cover, w = term_coverage(ts, mask)
    assert torch.allclose(w, ts.amax(2))
    assert cover.max() <= 1 + 1e-6 and torch.allclose(
        cover.amax(1)[w > 0], torch.ones(int((w > 0).sum())))
