"""Multi-evidence stages on top of today's ``memgas_hybrid``, LoCoMo dev.

Builds (once, then reloads) the LoCoMo dev index for each summary source, computes
today's raw signals and fused scores (the engine's signal registry and read path),
applies each new stage on top, and prints recall_all@3/5/10 overall and per category,
leave-one-conversation-out over the three dev conversations (per stage family: the
grid point with the best question-weighted mean of recall_all@{3,5,10} on two
conversations, scored on the third), and the added time of each stage::

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD nice python benchmarks/multi_evidence.py \\
        --cache /tmp/i16 --out multi_evidence.json

Stages (``rerank_stages.py`` and ``cue_stages.py`` beside this script,
``memgas_gpu.ops.time_affinity``, ``memgas_gpu.retrieve.cues``): xQuAD over question terms, MMR over session embeddings,
RM3 on the BM25 signals, the speaker cue (message-level BM25 with the named speaker's
messages weighted), the time cue (session dates against the question's interval), and
personalized PageRank settings of the existing ``fusion="ppr"``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from memgas_gpu import load_dataset
from memgas_gpu.eval import evaluate
from memgas_gpu.lexical import lexical_signals, BM25Params
from memgas_gpu.ops.time_affinity import time_affinity
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.retrieve.cues import question_interval
from memgas_gpu.granularity import N_GRAN
from memgas_gpu.retrieve.engine import read_path, resolve
from memgas_gpu.retrieve.graphs import lexical_graph
from memgas_gpu.retrieve.search import Retrieval
from memgas_gpu.retrieve.signals import (SignalContext, compute_signals, lexical_specs,
                                         query_layout, signal_nodes)

from cue_stages import build_speaker_data, speaker_signal, speaker_weights, time_tensors
from rerank_stages import (feedback_weights, mmr, query_term_scores, rm3_expand,
                           term_coverage, xquad)

DEV = "/work/shared/data/locomo/locomo_dev.json"
KS = (3, 5, 10)
DEVICE = torch.device("cpu")
#: the recommended stages (docs/multi-evidence.md): speaker cue on the turn signal,
#: gamma 1, and the time cue with a hard interval, beta 2
REC = {"gamma": 1.0, "time_beta": 2.0}


def hybrid_signals(index, qi, names, rows, valid, dev, k1, b, bm25_method):
    """Raw ``[Q, S, N]`` signals of questions ``qi`` (the engine's signal registry)."""
    view, batch, _ = index.question_view(qi)
    ctx = SignalContext(view, batch, query_layout(view.conv_offsets, batch.q_conv), dev,
                        k1, b, bm25_method)
    return compute_signals(ctx, list(names))


def fuse(index, X, valid, conv, start, p, graph=None):
    """Steps 2-6 of the engine's read path on raw signals ``X``."""
    blocks = None
    if graph is not None:
        sizes = index.snapshot().conv_offsets[1:] - index.snapshot().conv_offsets[:-1]
        blocks = torch.repeat_interleave(torch.arange(index.n_conversations),
                                         sizes).repeat_interleave(N_GRAN)
    return read_path(X, valid, p, node_of_signal=signal_nodes(p.signals), graph=graph,
                     node_base=start * N_GRAN, query_conversation=conv, blocks=blocks)


def layout(index, qi):
    conv = index.q_conv[qi]
    start = index.snapshot().conv_offsets[conv]
    n = index.snapshot().conv_offsets[conv + 1] - start
    pos = torch.arange(int(n.max()))
    valid = pos[None] < n[:, None]
    rows = torch.where(valid, start[:, None] + pos, torch.zeros_like(valid, dtype=torch.long))
    return conv, start, n, valid, rows


def metrics(index, qi, scores, valid, n) -> dict:
    s = scores.float().cpu().masked_fill(~valid, float("-inf"))
    rk = torch.argsort(s, dim=1, descending=True, stable=True)
    rk = torch.where(torch.arange(s.shape[1])[None] < n[:, None], rk, torch.full_like(rk, -1))
    ev = evaluate(index, Retrieval("x", qi, s, rk, n), ks=KS)
    pq = ev.per_question
    out = {"all": {k: 100 * float(pq[f"recall_all@{k}"].mean()) for k in KS}}
    for t, v in ev.summary["by_type"].items():
        out[t] = {k: 100 * v[f"recall_all@{k}"] for k in KS}
    out["conv"] = {}
    for c, meta in enumerate(index.conversations):
        m = index.q_conv[qi] == c
        out["conv"][meta.id] = {"n": int(m.sum()),
                                **{k: 100 * float(pq[f"recall_all@{k}"][m].mean()) for k in KS}}
    out["hits"] = {k: pq[f"recall_all@{k}"].bool() for k in KS}
    return out


def timed(fn, reps=3):
    ts, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return out, statistics.median(ts)


def get_index(cache: Path, summaries: str, ds):
    path = cache / f"idx_{summaries}"
    if not (path / "manifest.json").exists():
        from memgas_gpu.encode import Encoder

        idx = MemoryIndex.build(ds, Encoder(device="cpu"), summaries=summaries, device="cpu",
                                progress=False)
        idx.save(path)
    return MemoryIndex.load(path)


def run_source(index, ds, log) -> dict:
    qi = torch.arange(len(index.questions))
    conv, start, n, valid, rows = layout(index, qi)
    p = resolve(index, "memgas_hybrid")[0]
    sig = list(p.signals)

    def base_path():
        X = hybrid_signals(index, qi, p.signals, rows, valid, DEVICE, p.k1, p.b, p.bm25_method)
        return X, fuse(index, X, valid, conv, start, p)

    (X, base), t_base = timed(base_path)
    res = {"base_time_s": t_base, "families": {}}
    fam = res["families"]

    def add(family, name, scores, t_extra):
        m = metrics(index, qi, scores, valid, n)
        fam.setdefault(family, []).append({"name": name, "m": m, "extra_s": t_extra})
        a = m["all"]
        log(f"  {family:10s} {name:38s} {a[3]:5.1f} {a[5]:5.1f} {a[10]:5.1f}  mh "
            f"{m['multi-hop'][3]:5.1f} {m['multi-hop'][5]:5.1f} {m['multi-hop'][10]:5.1f}"
            f"  +{1000 * t_extra:6.1f} ms")

    add("base", "memgas_hybrid", base, 0.0)
    rel = base.float()

    # --- xQuAD over question terms
    for g in ("S", "T"):
        (cov, w), t_cov = timed(lambda: term_coverage(*query_term_scores(
            index, qi, g, BM25Params(p.k1, p.b, p.bm25_method), device="cpu")))
        for beta in (0.25, 0.5, 1.0, 2.0):
            s, t = timed(lambda: xquad(rel, valid, cov, w, k=10, beta=beta))
            add("xquad", f"{g} beta={beta}", s, t_cov + t)

    # --- MMR over session embeddings (S, T)
    for gi, g in ((0, "S"), (1, "T")):
        def sims():
            e = torch.nn.functional.normalize(index.snapshot().gran[index.snapshot().row_slot[rows], gi].float(), dim=-1)
            return e @ e.transpose(1, 2)
        sim, t_sim = timed(sims)
        for beta in (0.1, 0.25, 0.5, 1.0):
            s, t = timed(lambda: mmr(rel, valid, sim, k=10, beta=beta))
            add("mmr", f"{g} beta={beta}", s, t_sim + t)

    # --- RM3 on the BM25 signals
    lex = index.snapshot().lexical
    lex_names = [s for s in sig if s.startswith("bm25")]
    doc_of = lex.doc_ptr["S"][index.snapshot().row_slot[rows]]
    n_docs = lex.docs["S"].n_rows
    for m_, nt, lam, temp in itertools.product((3, 5), (10, 20), (0.3, 0.5), (None, 1.0)):
        def prf():
            fb = feedback_weights(rel, valid, doc_of, n_docs, m=m_, temperature=temp)
            qx = rm3_expand(lex.queries.rows(qi), lex.docs["S"], fb, n_terms=nt, lam=lam)
            got = lexical_signals(index.snapshot(), qx, index.q_conv[qi],
                                  lexical_specs(lex_names),
                                  BM25Params(p.k1, p.b, p.bm25_method), device="cpu")
            X2 = X.clone()
            for j, s_ in enumerate(sig):
                if s_ in got:
                    X2[:, j] = torch.where(valid, got[s_], torch.zeros_like(got[s_]))
            return fuse(index, X2, valid, conv, start, p)
        s, t = timed(prf, reps=1)
        add("rm3", f"m={m_} n={nt} lam={lam} T={temp}", s, t)

    # --- speaker cue: BM25F-style, the named speaker's messages weighted 1 + gamma
    spk, t_spk_data = timed(lambda: build_speaker_data(index, ds), reps=1)
    log(f"  speaker data {t_spk_data:.2f} s (index-time), questions naming one: "
        f"{int((spk.named.sum(1) == 1).sum())}/{len(index.questions)}")
    spk_sig = {}
    for gamma, which in itertools.product((0.5, 1.0, 2.0, 4.0), ("T", "S", "TS")):
        sw = {g: speaker_weights(index, spk, gamma, g, p.k1, p.b, p.bm25_method, "cpu")
              for g in which}  # index-time (once per setting)

        def spk_path():
            X2 = X.clone()
            for g, name in (("T", "bm25_Tmax"), ("S", "bm25_S")):
                if g in which:
                    m_sig = speaker_signal(index, spk, qi, sw[g])
                    X2[:, sig.index(name)] = torch.where(valid, m_sig, torch.zeros_like(m_sig))
            return X2, fuse(index, X2, valid, conv, start, p)
        (X2, s), t = timed(spk_path)
        spk_sig[(gamma, which)] = X2
        add("speaker", f"{which} gamma={gamma}", s, t)

    # --- time cue: session date inside the question's interval
    _, t_qparse = timed(lambda: [question_interval(q.text) for q in index.questions])
    (qs, qe, sday), t_parse = timed(lambda: time_tensors(index), reps=1)
    log(f"  time cue parse {t_parse:.2f} s, questions with an interval: "
        f"{int((~torch.isnan(qs)).sum())}/{len(index.questions)}")
    sd = torch.where(valid, sday[rows], torch.full(rows.shape, float("nan"),
                                                   dtype=torch.float64))
    for beta, after, tau in itertools.product((0.5, 1.0, 2.0), (0.0, 7.0, 30.0), (0.0, 7.0)):
        def tpath():
            aff = time_affinity(qs[qi], qe[qi], sd, valid, after=after, tau=tau)
            return rel + beta * aff
        s, t = timed(tpath)
        add("time", f"beta={beta} after={after} tau={tau}", s, t + t_qparse)

    # --- combinations: time cue on top of the speaker cue / xQuAD / MMR
    aff = time_affinity(qs[qi], qe[qi], sd, valid, after=0.0, tau=0.0)
    for beta_t in (1.0, 2.0):
        for (gamma, which), X2 in spk_sig.items():
            if which == "TS":
                continue
            s = fuse(index, X2, valid, conv, start, p).float() + beta_t * aff
            add("speaker+time", f"{which} gamma={gamma} time beta={beta_t}", s,
                fam["speaker"][[r["name"] for r in fam["speaker"]].index(
                    f"{which} gamma={gamma}")]["extra_s"] + t_qparse)

    # --- propagation on the association graph (the existing fusion="ppr")
    graphs = {"dense": index.snapshot().graph(device="cpu"), "lexical": lexical_graph(index.snapshot(), device="cpu")}
    for gname, alpha, d in itertools.product(("dense", "lexical"), (15, 30), (0.1, 0.3, 0.5)):
        pp = replace(p, fusion="ppr", graph=gname, alpha=alpha, damping=d)
        s, t = timed(lambda: fuse(index, X, valid, conv, start, pp, graphs[gname]), reps=1)
        add("ppr", f"{gname} alpha={alpha} d={d}", s, max(0.0, t))
    res["timing"] = time_recommended(index, ds, qi, rows, valid, conv, start, p, log)
    return res


def time_recommended(index, ds, qi, rows, valid, conv, start, p, log, reps=9) -> dict:
    """Today's read path (signals + fuse) against the recommended one (bm25_Tmax
    replaced by the speaker signal, time cue added), interleaved, median of ``reps``.
    Index-time work (speaker weights, session dates, question intervals, like question
    tokens and embeddings) is done once outside the timed region."""
    spk = build_speaker_data(index, ds)
    sw = speaker_weights(index, spk, REC["gamma"], "T", p.k1, p.b, p.bm25_method, "cpu")
    qs, qe, sday = time_tensors(index)
    sd = torch.where(valid, sday[rows], torch.full(rows.shape, float("nan"),
                                                   dtype=torch.float64))
    others = tuple(s for s in p.signals if s != "bm25_Tmax")
    j = list(p.signals).index("bm25_Tmax")

    def today():
        X = hybrid_signals(index, qi, p.signals, rows, valid, DEVICE, p.k1, p.b, p.bm25_method)
        return fuse(index, X, valid, conv, start, p)

    def rec():
        Xo = hybrid_signals(index, qi, others, rows, valid, DEVICE, p.k1, p.b, p.bm25_method)
        m = speaker_signal(index, spk, qi, sw)
        X = torch.cat([Xo[:, :j], torch.where(valid, m, torch.zeros_like(m))[:, None],
                       Xo[:, j:]], 1)
        s = fuse(index, X, valid, conv, start, p).float()
        return s + REC["time_beta"] * time_affinity(qs[qi], qe[qi], sd, valid)

    ta, tb = [], []
    for _ in range(reps):
        ta.append(timed(today, reps=1)[1])
        tb.append(timed(rec, reps=1)[1])
    a, b = statistics.median(ta), statistics.median(tb)
    t0 = time.perf_counter()
    for q in index.questions:
        question_interval(q.text)
    per_q = (time.perf_counter() - t0) / max(len(index.questions), 1)
    log(f"  read path, {len(qi)} questions: today {1000 * a:.1f} ms, recommended "
        f"{1000 * b:.1f} ms ({b / a:.2f}x); question date parsing {1e6 * per_q:.0f} us per "
        f"question (with tokenisation, outside the read path)")
    return {"today_s": a, "recommended_s": b, "ratio": b / a, "parse_per_question_s": per_q}


def loo(rows: list, convs: list) -> dict:
    """Per held-out conversation: the best row on the others (question-weighted mean of
    recall_all@{3,5,10}), and the pooled held-out recall_all@k."""
    def score(r, keep):
        num = sum(v["n"] * sum(v[k] for k in KS) / 3 for c, v in r["m"]["conv"].items()
                  if c in keep)
        return num / sum(v["n"] for c, v in r["m"]["conv"].items() if c in keep)
    picks, tot = {}, {k: 0.0 for k in KS}
    nq = 0
    for c in convs:
        best = max(rows, key=lambda r: score(r, [x for x in convs if x != c]))
        v = best["m"]["conv"][c]
        picks[c] = best["name"]
        for k in KS:
            tot[k] += v[k] * v["n"]
        nq += v["n"]
    return {"picks": picks, **{k: tot[k] / nq for k in KS}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="/tmp/memgas_multi_evidence")
    ap.add_argument("--summaries", default="offline,source")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(DEV)
    report = {}
    for src in a.summaries.split(","):
        index = get_index(cache, src, ds)
        print(f"== summaries={src}   all @3 @5 @10 | multi-hop @3 @5 @10 | added time")
        r = run_source(index, ds, print)
        convs = [c.id for c in index.conversations]
        base_rows = r["families"]["base"]
        for fam, rows in r["families"].items():
            if fam == "base":
                continue
            lo = loo(base_rows + rows, convs)
            r.setdefault("loo", {})[fam] = lo
            print(f"  LOO {fam:8s} {lo[3]:5.1f} {lo[5]:5.1f} {lo[10]:5.1f}  picks {lo['picks']}")
        report[src] = r
    if a.out:
        from memgas_gpu._io import atomic_write

        def clean(o):
            if isinstance(o, dict):
                return {str(k): clean(v) for k, v in o.items() if k != "hits"}
            if isinstance(o, list):
                return [clean(v) for v in o]
            return o
        with atomic_write(a.out) as f:
            json.dump(clean(report), f, indent=1)


if __name__ == "__main__":
    main()
