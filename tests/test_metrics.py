"""Batched metrics equal a transcription of LongMemEval's evaluate_retrieval."""
from __future__ import annotations

import math
import random

import numpy as np
import torch

from memgas_gpu.eval.metrics import KS, gold_mask, retrieval_metrics


def _dcg(rel, k):
    rel = np.asarray(rel, dtype=float)[:k]
    if rel.size:
        return rel[0] + np.sum(rel[1:] / np.log2(np.arange(2, rel.size + 1)))
    return 0.0


def _reference(ranking, gold, ids, k):
    recalled = set(ids[i] for i in ranking[:k])
    r_any = float(any(g in recalled for g in gold))
    r_all = float(all(g in recalled for g in gold))
    rel = [1 if d in gold else 0 for d in ids]
    ideal = _dcg(sorted(rel, reverse=True), k)
    nd = 0.0 if ideal == 0 else _dcg([rel[i] for i in ranking[:k]], k) / ideal
    return r_any, r_all, nd


def test_metrics_match_reference_on_random_cases():
    rng = random.Random(0)
    ids, golds, ranks = [], [], []
    for q in range(300):
        n = rng.randint(1, 60)
        cid = [f"s{j}" for j in range(n)]
        g = rng.sample(cid, rng.randint(0, min(4, n)))
        if rng.random() < 0.1:
            g.append("missing")  # gold not in the haystack
        r = list(range(n)); rng.shuffle(r)
        ids.append(cid); golds.append(g); ranks.append(r)
    n_max = max(len(c) for c in ids)
    rank_t = torch.full((len(ids), n_max), -1, dtype=torch.long)
    for i, r in enumerate(ranks):
        rank_t[i, :len(r)] = torch.tensor(r)
    rel, n_gold = gold_mask(ids, golds, n_max)
    m = retrieval_metrics(rank_t, rel, n_gold)
    for i in range(len(ids)):
        for k in KS:
            ra, rl, nd = _reference(ranks[i], golds[i], ids[i], k)
            assert m[f"recall_any@{k}"][i].item() == ra
            assert m[f"recall_all@{k}"][i].item() == rl
            assert math.isclose(m[f"ndcg_any@{k}"][i].item(), nd, abs_tol=1e-12)


def test_hand_computed_case_and_strict():
    ids = [["a", "b", "c", "d"], ["a", "b"]]
    gold = [["c", "a"], []]
    rank = torch.tensor([[2, 1, 0, 3], [0, 1, -1, -1]])
    rel, n_gold = gold_mask(ids, gold)
    m = retrieval_metrics(rank, rel, n_gold, ks=(1, 3))
    assert m["recall_any@1"].tolist() == [1.0, 0.0]
    assert m["recall_all@1"].tolist() == [0.0, 1.0]  # no gold counts 1.0, as the reference
    assert m["recall_all@3"].tolist() == [1.0, 1.0]
    # DCG@3 = 1 + 0/1 + 1/log2(3); ideal = 1 + 1
    assert math.isclose(m["ndcg_any@3"][0].item(), (1 + 1 / math.log2(3)) / 2)
    s = retrieval_metrics(rank, rel, n_gold, ks=(1,), strict=True)
    assert math.isnan(s["recall_all@1"][1].item())
