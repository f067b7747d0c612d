"""Grid sweeps of read-path settings in one batched run (behind ``memgas sweep``).

The raw signals (dense similarities, BM25 over every granularity) are computed once
per distinct BM25 setting (``k1``, ``b``, ``bm25_method``, ``stopwords``) for all
questions; every grid point then re-runs only the cheap steps of the read path
(normalise, route, fuse, propagate) through :func:`memgas_gpu.retrieve.engine.finish`.
Results carry overall, per-type and per-conversation ``recall_all@k``, and
:func:`leave_one_out` picks, for each conversation, the setting that is best on the
*other* conversations.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Optional, Sequence

import torch

from ..retrieve.engine import finish, resolve
from ..retrieve.graphs import read_graph
from ..retrieve.params import ReadParams
from ..retrieve.presets import DEFAULT_METHOD, HYBRID_EXTRACTIVE_SIGNALS, HYBRID_SIGNALS
from ..retrieve.search import Retrieval
from ..retrieve.signals import (SIGNALS, SignalContext, available, compute_cues,
                                compute_signals, fused_signals, query_layout)
from .. import ops
from ..settings import SettingsError
from .runner import evaluate

__all__ = ["GRID_KEYS", "BM25_KEYS", "PLAIN_BM25", "signal_set", "run_sweep", "relex", "rank",
           "leave_one_out", "gains"]

#: grid keys and their value types (:class:`ReadParams` fields, plus ``stopwords``)
GRID_KEYS = {"signals": str, "norm": str, "temperature": float, "router": str, "alpha": int,
             "damping": float, "fusion": str, "graph": str, "k1": float, "b": float,
             "bm25_method": str, "stopwords": str, "time_beta": float,
             "speaker_gamma": float}
#: keys that change the raw signals (the rest only change the fusion)
BM25_KEYS = ("k1", "b", "bm25_method", "stopwords", "speaker_gamma")
#: the plain BM25 baseline row: session text, ``bm25s``'s tokenizer defaults (needs DATA)
PLAIN_BM25 = "bm25 (bm25s defaults)"


def signal_set(spec: str) -> tuple:
    """``"bm25_S+dense_Tmax"`` or an alias: ``all``, ``lexical``, ``dense``, ``default``,
    ``extractive``."""
    sig = fused_signals()
    aliases = {"all": tuple(s for s in sig if s != "dense_concat"),
               "dense": tuple(s for s in sig if SIGNALS[s].kind == "dense"
                              and s != "dense_concat"),
               "lexical": tuple(s for s in sig if SIGNALS[s].kind == "lexical"),
               "default": HYBRID_SIGNALS, "extractive": HYBRID_EXTRACTIVE_SIGNALS}
    if spec in aliases:
        return aliases[spec]
    out = tuple(x for x in spec.split("+") if x)
    bad = [x for x in out if x not in sig]
    if bad or not out:
        raise SettingsError(f"unknown signal(s) {bad} in {spec!r}; use names joined by '+' "
                            f"({', '.join(sig)}) or one of {sorted(aliases)}")
    return out


def relex(index, dataset, expansion, tokenizer):
    """The index's lexical index rebuilt from ``dataset`` with another ``tokenizer``
    (same sessions in the same slots, same summaries and keywords, same questions)."""
    from ..lexical import build_lexical

    return build_lexical(dataset, expansion, dataset.distinct_sessions(),
                         [q.text for q in index.questions], tokenizer)


def _evaluate(index, qi, scores, n, ks):
    return evaluate(index, Retrieval("sweep", qi, scores.cpu(),
                                     ops.rank_sessions(scores, n).cpu(), n), ks=ks)


def run_sweep(index, grid: dict, ks: Sequence[int] = (3, 5, 10), device: Optional[str] = None,
              dataset=None, expansion=None, baselines: bool = False,
              method: str = DEFAULT_METHOD) -> list:
    """Evaluate every point of ``grid`` (``{key: [values]}``, keys in :data:`GRID_KEYS`)
    on top of ``method``'s preset.

    Args:
        index: the memory index (its questions are evaluated).
        grid: the axes; signal sets as tuples (see :func:`signal_set`).
        ks: ``recall_all`` cut-offs.
        device: where to compute.
        dataset, expansion: the loaded dataset and its expansion, needed for a
            ``stopwords`` axis and the plain BM25 baseline.
        baselines: also evaluate every single signal alone, and plain BM25 (needs
            ``dataset``).
        method: the preset the grid varies.

    Returns:
        One dict per point: ``settings``, ``recall_all@k``, ``by_type``,
        ``by_conversation``.
    """
    bad = [k for k in grid if k not in GRID_KEYS]
    if bad:
        raise SettingsError(f"unknown grid key(s) {bad}; use {', '.join(GRID_KEYS)}")
    if "stopwords" in grid and dataset is None:
        raise SettingsError("a stopwords grid needs the dataset (DATA), not an index")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    view, batch, qi = index.question_view()
    lay = query_layout(view.conv_offsets, batch.q_conv)
    scored = torch.tensor([not q.is_abstention for q in index.questions], dtype=torch.bool)
    names = available(view, signal_set("all"))
    # every registered cue, once: its weight is a setting of each grid point
    cues = compute_cues(SignalContext(view, batch, lay, dev, resolve(view, method)[0]),
                        [n for n, s in SIGNALS.items() if s.kind == "cue"])
    bm25_axes = [k for k in BM25_KEYS if k in grid]
    fuse_axes = [k for k in grid if k not in BM25_KEYS]
    results = []

    def record(settings, ev):
        pq = ev.per_question
        row = {"settings": settings}
        row.update({f"recall_all@{k}": float(pq[f"recall_all@{k}"][scored].mean()) for k in ks})
        row["by_type"] = {t: {f"recall_all@{k}": s[f"recall_all@{k}"] for k in ks}
                          for t, s in ev.summary["by_type"].items()}
        row["by_conversation"] = {}
        for c, meta in enumerate(index.conversations):
            m = scored & (index.q_conv == c)
            row["by_conversation"][meta.id] = {
                "n": int(m.sum()),
                **{f"recall_all@{k}": float(pq[f"recall_all@{k}"][m].mean()) for k in ks}}
        results.append(row)

    def signals(bp: dict, lexical, which):
        lexb = batch
        if lexical is not None:
            lexb = type(batch)(batch.q_emb, batch.q_conv, lexical.queries.rows(qi))
        base = resolve(view, method)[0]
        p = dataclasses.replace(base, **{k: bp[k] for k in BM25_KEYS if k in bp
                                         and k != "stopwords"})
        return compute_signals(SignalContext(view, lexb, lay, dev, p, lexical), which)

    for bvals in itertools.product(*(grid[k] for k in bm25_axes)):
        bset = dict(zip(bm25_axes, bvals))
        lexical = None
        if "stopwords" in bset:
            from ..lexical import Tokenizer

            lexical = relex(index, dataset, expansion, Tokenizer(stopwords=bset["stopwords"]))
        bp = {k: v for k, v in bset.items() if k != "stopwords"}
        X = signals(bp, lexical, names)
        if baselines:
            for j, name in enumerate(names):
                p = resolve(view, "bm25", signals=(name,))[0]
                s, n = finish(view, X[:, j:j + 1], lay, p, dev, None)
                record({**bset, "signals": name, "baseline": True},
                       _evaluate(index, qi, s, n, ks))
        for fvals in itertools.product(*(grid[k] for k in fuse_axes)):
            fset = dict(zip(fuse_axes, fvals))
            p, _ = resolve(view, method, **{**fset, **bp})
            missing = [s for s in p.signals if s not in names]
            if missing:
                raise SettingsError(f"this index cannot compute signal(s) {missing}")
            cols = [names.index(s) for s in p.signals]
            s, n = finish(view, X[:, cols], lay, p, dev, _sweep_graph(view, p, dev, lexical),
                          cues=cues)
            settings = {**bset, **fset}
            if "signals" in settings:
                settings["signals"] = "+".join(p.signals)
            record(settings, _evaluate(index, qi, s, n, ks))
    if baselines and dataset is not None:
        # the plain baseline: BM25 over session text with bm25s's own tokenizer
        # defaults (Lucene stopwords, Snowball stemming), k1 1.5, b 0.75
        from ..lexical import Tokenizer

        lexical = relex(index, dataset, expansion, Tokenizer())
        p = resolve(view, "bm25")[0]
        s, n = finish(view, signals({}, lexical, ("bm25_S",)), lay, p, dev, None)
        record({"signals": PLAIN_BM25, "baseline": True}, _evaluate(index, qi, s, n, ks))
    return results


def _sweep_graph(view, p: ReadParams, dev, lexical):
    if lexical is not None and p.fusion == "ppr" and p.graph in ("lexical", "both"):
        raise SettingsError("a stopwords grid with a lexical graph is not supported: the "
                            "lexical graph uses the index's own tokenizer")
    return read_graph(view, p, dev)


def rank(rows: list, by: str, ks: Sequence[int]) -> list:
    """Rows sorted by ``by`` then the other ``recall_all@k`` (descending)."""
    other = [f"recall_all@{k}" for k in ks if f"recall_all@{k}" != by]
    return sorted(rows, key=lambda r: tuple(-r[m] for m in [by] + other))


def leave_one_out(rows: list, by: str) -> dict:
    """For each conversation: the best setting on the others (question-weighted ``by``),
    and its score on the held-out one.

    Only the questions :func:`~memgas_gpu.eval.evaluate` averages count (``n``: the
    non-abstention ones): a conversation without any (a LongMemEval haystack whose one
    question is an abstention) has no score (NaN) and is left out, listed under
    ``skipped``; it made every estimate NaN. Empty when no conversation has one.
    """
    cand = [r for r in rows if not r["settings"].get("baseline")]
    if not cand:
        return {}
    counted = {c: v["n"] for c, v in cand[0]["by_conversation"].items()}
    convs = [c for c, n in counted.items() if n > 0]
    if not convs:
        return {}
    out, tot, nq = {}, 0.0, 0
    for c in convs:
        def score(r):
            others = [v for k, v in r["by_conversation"].items() if k != c and v["n"] > 0]
            num = sum(v["n"] * v[by] for v in others)
            den = sum(v["n"] for v in others)
            return num / max(den, 1)
        best = max(cand, key=score)
        held = best["by_conversation"][c]
        out[c] = {"settings": best["settings"], "train": score(best), "held_out": held[by],
                  "n": held["n"]}
        tot += held[by] * held["n"]
        nq += held["n"]
    return {"by_conversation": out, by: tot / max(nq, 1), "metric": by,
            "skipped": [c for c, n in counted.items() if n == 0]}


def gains(rows: list, ks: Sequence[int]) -> list:
    """Per question type (and ``all``) and k: the best non-baseline row against the best
    baseline (every single signal and plain BM25). Rows: ``(type, k, ours, best_baseline,
    baseline_name, delta)``, in percent."""
    top = next((r for r in rows if not r["settings"].get("baseline")), None)
    base = [r for r in rows if r["settings"].get("baseline")]
    if top is None or not base:
        return []

    def get(r, t, m):
        return r[m] if t == "all" else r["by_type"].get(t, {}).get(m, float("nan"))

    out = []
    for t in ["all"] + list(top["by_type"]):
        for k in ks:
            m = f"recall_all@{k}"
            b = max(base, key=lambda r: get(r, t, m))
            ours, best = 100 * get(top, t, m), 100 * get(b, t, m)
            out.append((t, k, ours, best, b["settings"]["signals"], ours - best))
    return out

