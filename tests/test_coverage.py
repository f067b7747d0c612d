"""Set selection of the top k (xQuAD over question terms, MMR): hand-computed cases and a
per-question Python reference of each formula."""
from __future__ import annotations

import torch

from memgas_gpu.ops.coverage import mmr, order_scores, xquad


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
