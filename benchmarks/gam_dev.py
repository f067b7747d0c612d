"""GAM on LoCoMo dev (conv-26/30/41): the tables of docs/gam.md.

Evidence-turn recall at k = 5, 10, 20 of GAM, its ablations, segmentation strategies and
boundary noise, flat utterance retrieval (dense, BM25, fusion) and the MemGAS-family
turn rankings; settings chosen by leave-one-conversation-out (LOO) on recall_all@10.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD nice python benchmarks/gam_dev.py \\
        --store /tmp/gam_i15_store --out /tmp/gam_dev.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

import memgas_gpu as mg
from memgas_gpu.encode import EmbeddingStore, Encoder
from memgas_gpu.eval.turns import evaluate_turns, turn_metrics
from memgas_gpu.gam import GamIndex, GamParams, build_events, preset

KEY = "recall_all@10"


def per_conv(idx, tr):
    """recall_all@10 per conversation (sum, count) and the overall metrics."""
    gold = [idx.questions[i].evidence_turn_ids for i in tr.question_index.tolist()]
    per = turn_metrics(tr.rankings, tr.turn_ids, gold)
    conv = idx.q_conv[tr.question_index]
    out = {}
    for c in conv.unique().tolist():
        v = per[KEY][conv == c]
        v = v[~torch.isnan(v)]
        out[idx.events.conv_ids[c]] = (float(v.sum()), int(v.numel()))
    return out, evaluate_turns(tr.rankings, tr.turn_ids, gold)


def loo(table: dict) -> tuple[float, dict]:
    """table: config -> {conv: (sum, n)}. Held-out score of the config picked on the rest."""
    convs = sorted(next(iter(table.values())))
    got, n_all, picks = 0.0, 0, {}
    for held in convs:
        def train(cfg):
            s = sum(table[cfg][c][0] for c in convs if c != held)
            n = sum(table[cfg][c][1] for c in convs if c != held)
            return s / n
        best = max(table, key=lambda c: (train(c), c))
        picks[held] = best
        got += table[best][held][0]
        n_all += table[best][held][1]
    return got / n_all, picks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/locomo/locomo_dev.json")
    ap.add_argument("--store", default="/tmp/gam_i15_store")
    ap.add_argument("--out", default="/tmp/gam_dev.json")
    ap.add_argument("--no-memgas", action="store_true")
    ap.add_argument("--anchors-only", action="store_true",
                    help="only the anchors x TAN table at the defaults")
    ap.add_argument("--segmentation-loo", action="store_true",
                    help="each segmentation with its own read settings (LOO), and paired "
                         "wins/losses against semantic at the defaults")
    ap.add_argument("--rows-only", action="store_true",
                    help="skip the LOO grid: every row at the GamParams defaults")
    a = ap.parse_args()
    ds = mg.load_dataset(a.data)
    enc = Encoder(device="cpu")
    st = EmbeddingStore(a.store, enc.fingerprint)
    ev = build_events(ds, enc, store=st)
    res = {"rows": {}, "loo": {}}

    def run(name, params, method="gam", idx=None):
        idx = idx or GamIndex.build(ds, enc, params, store=st, events=ev)
        tr = idx.retrieve(method=method, params=params)  # questions: from the store
        pc, m = per_conv(idx, tr)
        res["rows"][name] = {"metrics": m, "per_conv": pc, "topics": len(idx.topics),
                             "edges": int(idx.topics.src.numel())}
        print(f"{name:40s} topics={len(idx.topics):4d} " +
              " ".join(f"{k}={m[k]:.4f}" for k in m if "ndcg" not in k and k != "n"),
              flush=True)
        return idx, pc

    if a.anchors_only:
        idx = GamIndex.build(ds, enc, GamParams(), store=st, events=ev)
        for an in (1, 2, 4, 8, 16, 1000):
            for tan in (True, False):
                run(f"anchors={an} tan={tan}", GamParams(anchors=an, tan=tan), idx=idx)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        return
    if a.segmentation_loo:
        segmentation_loo(ds, enc, st, ev, res)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        return
    # --- grid for the defaults (LOO) ---------------------------------------------------
    if a.rows_only:
        rows(a, ds, enc, st, ev, res, run, GamParams())
        return
    grid = {}
    thetas, anchors, gammas, alphas, etas = (0.5, 0.6, 0.7, 0.8), (8, 16, 32, 1000), \
        (1.0, 2.0, 4.0), (0.5, 1.0, 2.0), (0.0, 0.3, 0.6, 1.0)
    for th in thetas:
        base = GamParams(theta=th)
        idx = GamIndex.build(ds, enc, base, store=st, events=ev)
        for an, ga, al, et in itertools.product(anchors, gammas, alphas, etas):
            p = base.replace(anchors=an, gamma=ga, alpha=al, eta=et)
            tr = idx.retrieve(params=p)
            grid[(th, an, ga, al, et)] = per_conv(idx, tr)[0]
        print("grid theta", th, "done", flush=True)
    score, picks = loo(grid)
    conv_ids = sorted(next(iter(grid.values())))
    full = {c: sum(v[k][0] for k in conv_ids) / sum(v[k][1] for k in conv_ids)
            for c, v in grid.items()}
    best = max(full, key=lambda c: (full[c], c))
    res["loo"]["gam"] = {"heldout": score, "picks": {k: list(v) for k, v in picks.items()},
                         "all_dev_best": list(best), "all_dev_best_score": full[best]}
    print("GAM LOO held-out", round(score, 4), picks, "best on all dev", best, full[best])
    th, an, ga, al, et = best
    rows(a, ds, enc, st, ev, res, run, GamParams(theta=th, anchors=an, gamma=ga, alpha=al,
                                                  eta=et))


def segmentation_loo(ds, enc, st, ev, res):
    """Per segmentation: LOO over the read settings; paired per-question comparison with
    semantic at the defaults."""
    base_vec = None
    for seg in ("semantic", "tokens256", "tokens512", "turns3", "turns5", "session", "event"):
        P = GamParams(segmentation=seg)
        idx = GamIndex.build(ds, enc, P, store=st, events=ev)
        tab = {}
        for an, ga, et in itertools.product((4, 8, 16, 1000), (1.0, 2.0, 4.0), (0.0, 0.6)):
            tab[(an, ga, et)] = per_conv(idx, idx.retrieve(params=P.replace(anchors=an, gamma=ga,
                                                                          eta=et)))[0]
        score, picks = loo(tab)
        tr = idx.retrieve(params=P)
        gold = [idx.questions[i].evidence_turn_ids for i in tr.question_index.tolist()]
        vec = turn_metrics(tr.rankings, tr.turn_ids, gold)[KEY]
        if base_vec is None:
            base_vec = vec
        ok = ~torch.isnan(vec)
        wins = int((vec[ok] > base_vec[ok]).sum())
        losses = int((vec[ok] < base_vec[ok]).sum())
        res["rows"][f"segmentation={seg} LOO"] = {"heldout": score, "picks": picks,
                                                  "wins_vs_semantic": wins,
                                                  "losses_vs_semantic": losses}
        print(f"{seg:10s} LOO held-out {score:.4f} picks {picks} vs semantic at defaults: "
              f"{wins} better, {losses} worse", flush=True)


def rows(a, ds, enc, st, ev, res, run, P):
    """Every table row at the settings ``P``."""

    # --- flat baselines (fusion alpha by LOO) --------------------------------------------
    idx0, _ = run("flat_dense", P, "flat_dense")
    run("flat_bm25", P, "flat_bm25", idx0)
    ftab = {al_: per_conv(idx0, idx0.retrieve(method="flat_fusion", params=P.replace(alpha=al_)))[0]
            for al_ in (0.5, 1.0, 2.0, 4.0)}
    fscore, fpicks = loo(ftab)
    res["loo"]["flat_fusion"] = {"heldout": fscore, "picks": fpicks}
    for al_ in (0.5, 1.0, 2.0, 4.0):
        run(f"flat_fusion alpha={al_}", P.replace(alpha=al_), "flat_fusion", idx0)
    # --- GAM, ablations, segmentations, noise -------------------------------------------
    run("gam", P)
    run("gam anchors=all (no drill-down cut)", P.replace(anchors=1000))
    run("gam gamma=0 (no topic prior)", P.replace(gamma=0.0))
    run("gam eta=0 (no EPG neighbour term)", P.replace(eta=0.0))
    for name in ("gam_no_tan", "gam_no_epg", "gam_no_ssm", "gam_no_mfr"):
        run(name, preset(name, P))
    for seg in ("semantic", "tokens256", "tokens512", "turns3", "turns5", "session", "event"):
        run(f"segmentation={seg}", P.replace(segmentation=seg))
    for noise in (0.1, 0.2, 0.3, 0.4):
        vals = []
        for seed in range(3):
            _, pc = run(f"noise={noise} seed={seed}", P.replace(noise=noise, noise_seed=seed))
            vals.append(sum(v[0] for v in pc.values()) / sum(v[1] for v in pc.values()))
        res["rows"][f"noise={noise} mean"] = {"recall_all@10": sum(vals) / len(vals)}
    # --- MemGAS family: sessions ranked, messages within a session by flat_fusion -------
    if not a.no_memgas:
        from memgas_gpu.retrieve import MemoryIndex

        t = time.time()
        mi = MemoryIndex.build(ds, enc, summaries="offline", keywords="offline", store=st,
                               device="cpu", progress=False)
        print("memory index", round(time.time() - t, 1), "s", flush=True)
        assert [q.id for q in mi.questions] == [q.id for q in idx0.questions]
        for method in ("memgas", "memgas_hybrid", "bm25", "turn", "session"):
            tr = idx0.session_turns(mi.retrieve(method=method), params=P)
            gold = [idx0.questions[i].evidence_turn_ids for i in tr.question_index.tolist()]
            m = evaluate_turns(tr.rankings, tr.turn_ids, gold)
            res["rows"][f"memgas-family {method}"] = {"metrics": m}
            print(f"memgas-family {method:20s} " +
                  " ".join(f"{k}={m[k]:.4f}" for k in m if "ndcg" not in k and k != "n"),
                  flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
