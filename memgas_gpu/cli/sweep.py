"""``memgas sweep DATA|DIR --grid KEY=V1,V2 ...``: evaluate a grid of ``memgas_hybrid``
settings in one batched run.

The index is built (or loaded) once; the raw signals (dense similarities, BM25 over
every granularity) are computed once per distinct BM25 setting for all questions, and
every grid point only re-runs the cheap fusion (normalise, route, seed, PageRank).
Prints a ranked table, writes CSV and JSON (atomically), and a leave-one-conversation-
out estimate: for each conversation, the setting that is best on the *other*
conversations, scored on the held-out one.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
from pathlib import Path
from typing import Optional

import click

from .._io import atomic_write, nan_to_null
from ._common import FiniteFloat, build_index, build_options, dataset_options, load

#: grid keys and their value types (HybridParams fields, plus ``stopwords``)
GRID_KEYS = {"signals": str, "norm": str, "temperature": float, "router": str, "alpha": int,
             "damping": float, "fusion": str, "graph": str, "k1": float, "b": float,
             "bm25_method": str, "stopwords": str}
#: accepted ranges of the numeric grid keys (NaN and inf are refused for all)
_GRID_RANGES = {"temperature": FiniteFloat(0, min_open=True), "damping": FiniteFloat(0, 1),
                "k1": FiniteFloat(0), "b": FiniteFloat(0, 1), "alpha": FiniteFloat(1)}
#: signal-set aliases besides ``all``, ``lexical``, ``dense``, ``default``: ``extractive``
#: (:data:`~memgas_gpu.retrieve.hybrid.EXTRACTIVE_SIGNALS`)
_BM25_KEYS = ("k1", "b", "bm25_method", "stopwords")
#: conversations up to which the leave-one-out picks are printed one per line
MAX_LOO_LINES = 12
#: the plain BM25 baseline row: session text, ``bm25s``'s tokenizer defaults (needs DATA)
PLAIN_BM25 = "bm25 (bm25s defaults)"


def signal_set(spec: str) -> tuple:
    """``"bm25_S+dense_Tmax"`` or an alias: ``all``, ``lexical``, ``dense``, ``default``."""
    from ..retrieve.hybrid import DEFAULT_SIGNALS, DENSE_SIGNALS, EXTRACTIVE_SIGNALS, SIGNALS

    aliases = {"all": SIGNALS, "dense": DENSE_SIGNALS, "default": DEFAULT_SIGNALS,
               "extractive": EXTRACTIVE_SIGNALS,
               "lexical": tuple(s for s in SIGNALS if s.startswith("bm25"))}
    if spec in aliases:
        return aliases[spec]
    out = tuple(x for x in spec.split("+") if x)
    bad = [x for x in out if x not in SIGNALS]
    if bad or not out:
        raise click.BadParameter(f"unknown signal(s) {bad} in {spec!r}; use {'+'.join(SIGNALS)} "
                                 f"or one of {sorted(aliases)}")
    return out


def parse_grid(specs) -> dict:
    """``["alpha=15,30", "signals=all;bm25_S"]`` → ``{key: [values]}``; signal sets are
    separated by ``;`` (or ``,``)."""
    grid: dict = {}
    for spec in specs:
        key, sep, vals = spec.partition("=")
        key = key.strip()
        if not sep or key not in GRID_KEYS:
            raise click.BadParameter(f"expected KEY=V1,V2 with KEY in {', '.join(GRID_KEYS)}; "
                                     f"got {spec!r}")
        raw = [v.strip() for v in vals.replace(";", ",").split(",") if v.strip()]
        try:
            values = [signal_set(v) if key == "signals" else
                      (None if key == "stopwords" and v == "none" else GRID_KEYS[key](v))
                      for v in raw]
        except ValueError:
            raise click.BadParameter(f"bad value in {spec!r}") from None
        if not values:
            raise click.BadParameter(f"no values in {spec!r}")
        if key in _GRID_RANGES:
            for v in values:
                why = _GRID_RANGES[key].check(v)
                if why is not None:
                    raise click.BadParameter(f"{key}: {why} in {spec!r}")
        grid[key] = list(dict.fromkeys(values))
    return grid


def _metrics(index, qi, scores, valid, n, ks):
    import torch

    from ..eval import evaluate
    from ..retrieve.search import Retrieval

    scores = scores.float().cpu().masked_fill(~valid, float("-inf"))
    rk = torch.argsort(scores, dim=1, descending=True, stable=True)
    pos = torch.arange(scores.shape[1])[None]
    rk = torch.where(pos < n[:, None], rk, torch.full_like(rk, -1))
    ev = evaluate(index, Retrieval("memgas_hybrid", qi, scores, rk, n), ks=ks)
    return ev


def run_sweep(index, grid: dict, ks=(3, 5, 10), device: Optional[str] = None, dataset=None,
              expansion=None, baselines: bool = False) -> list:
    """Evaluate every point of ``grid`` (see :data:`GRID_KEYS`); returns one dict per point
    with its settings, overall ``recall_all@k``, per type and per conversation."""
    import torch

    from ..retrieve.hybrid import (SIGNALS, HybridParams, _graph, fuse, hybrid_signals,
                                   resolve_signals)
    from ..retrieve.search import _gather_layout

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    qi = torch.arange(len(index.questions))
    conv, start, n, valid, rows = _gather_layout(index, qi)
    scored = torch.tensor([not q.is_abstention for q in index.questions])
    qconv = index.q_conv
    keys = list(grid)
    bm25_axes = [k for k in _BM25_KEYS if k in grid]
    fuse_axes = [k for k in keys if k not in _BM25_KEYS]
    results = []
    own_lexical = index.lexical

    def record(settings, ev):
        pq = ev.per_question
        row = {"settings": settings}
        row.update({f"recall_all@{k}": float(pq[f"recall_all@{k}"][scored].mean()) for k in ks})
        row["by_type"] = {t: {f"recall_all@{k}": s[f"recall_all@{k}"] for k in ks}
                          for t, s in ev.summary["by_type"].items()}
        row["by_conversation"] = {}
        for c, meta in enumerate(index.conversations):
            m = scored & (qconv == c)
            row["by_conversation"][meta.id] = {
                "n": int(m.sum()),
                **{f"recall_all@{k}": float(pq[f"recall_all@{k}"][m].mean()) for k in ks}}
        results.append(row)

    try:
        for bvals in itertools.product(*(grid[k] for k in bm25_axes)):
            bset = dict(zip(bm25_axes, bvals))
            if "stopwords" in bset:
                if dataset is None:
                    raise click.UsageError("a stopwords grid needs DATA (a dataset), "
                                           "not an index")
                from ..lexical import Tokenizer

                index.lexical = relex(index, dataset, expansion,
                                      Tokenizer(stopwords=bset["stopwords"]))
            bp = {k: v for k, v in bset.items() if k != "stopwords"}
            X = hybrid_signals(index, qi, SIGNALS, rows, valid, dev, **bp)
            if baselines:
                for j, name in enumerate(SIGNALS):
                    record({**bset, "signals": name, "baseline": True},
                           _metrics(index, qi, X[:, j], valid, n, ks))
            for fvals in itertools.product(*(grid[k] for k in fuse_axes)):
                fset = dict(zip(fuse_axes, fvals))
                p = resolve_signals(index, HybridParams(**{**fset, **bp}))
                cols = [SIGNALS.index(s) for s in p.signals]
                scores = fuse(index, X[:, cols], valid, conv, start, p, _graph(index, p, dev))
                settings = {**bset, **fset}
                if "signals" in settings:
                    settings["signals"] = "+".join(p.signals)
                record(settings, _metrics(index, qi, scores, valid, n, ks))
    finally:
        index.lexical = own_lexical
    if baselines and dataset is not None:
        # the plain baseline: BM25 over session text with bm25s's own tokenizer
        # defaults (Lucene stopwords, Snowball stemming), k1 1.5, b 0.75
        from ..lexical import Tokenizer

        index.lexical = relex(index, dataset, expansion, Tokenizer())
        try:
            X = hybrid_signals(index, qi, ("bm25_S",), rows, valid, dev)
        finally:
            index.lexical = own_lexical
        record({"signals": PLAIN_BM25, "baseline": True},
               _metrics(index, qi, X[:, 0], valid, n, ks))
    return results


def relex(index, dataset, expansion, tokenizer):
    """The index's lexical index rebuilt from ``dataset`` with another ``tokenizer``
    (same sessions in the same slots, same summaries and keywords, same questions)."""
    from ..lexical import build_lexical

    return build_lexical(dataset, expansion, dataset.distinct_sessions(),
                         [q.text for q in index.questions], tokenizer)


def rank(rows: list, by: str, ks) -> list:
    other = [f"recall_all@{k}" for k in ks if f"recall_all@{k}" != by]
    return sorted(rows, key=lambda r: tuple(-r[m] for m in [by] + other))


def leave_one_out(rows: list, by: str) -> dict:
    """For each conversation: the best setting on the others (question-weighted ``by``),
    and its score on the held-out one."""
    cand = [r for r in rows if not r["settings"].get("baseline")]
    if not cand:
        return {}
    convs = list(cand[0]["by_conversation"])
    out, tot, nq = {}, 0.0, 0
    for c in convs:
        def score(r):
            num = sum(v["n"] * v[by] for k, v in r["by_conversation"].items() if k != c)
            den = sum(v["n"] for k, v in r["by_conversation"].items() if k != c)
            return num / max(den, 1)
        best = max(cand, key=score)
        held = best["by_conversation"][c]
        out[c] = {"settings": best["settings"], "train": score(best), "held_out": held[by],
                  "n": held["n"]}
        tot += held[by] * held["n"]
        nq += held["n"]
    return {"by_conversation": out, by: tot / max(nq, 1), "metric": by}


def gains(rows: list, ks) -> list:
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


def format_gains(g: list) -> str:
    if not g:
        return ""
    w = max(len(x[0]) for x in g)
    lines = [f"{'type':<{w}}  {'k':<3} {'ours':>6}  {'best':>6} {'baseline':<28} {'gain':>6}"]
    for t, k, ours, best, name, d in g:
        mark = "" if d > 1e-9 else ("  (tie)" if abs(d) <= 1e-9 else "  (LOSS)")
        lines.append(f"{t:<{w}}  {k:<3} {ours:6.2f}  {best:6.2f} {name:<28} {d:+6.2f}{mark}")
    return "\n".join(lines)


def _flat(rows: list, ks) -> tuple:
    setting_keys = list(dict.fromkeys(k for r in rows for k in r["settings"]))
    types = list(dict.fromkeys(t for r in rows for t in r["by_type"]))
    head = ["rank"] + setting_keys + [f"recall_all@{k}" for k in ks] + [
        f"{t}:recall_all@{k}" for t in types for k in ks]
    table = []
    for i, r in enumerate(rows, 1):
        table.append([i] + [r["settings"].get(k, "") for k in setting_keys]
                     + [round(100 * r[f"recall_all@{k}"], 2) for k in ks]
                     + [round(100 * r["by_type"].get(t, {}).get(f"recall_all@{k}", float("nan")),
                              2) for t in types for k in ks])
    return head, table


def format_ranked(rows: list, ks, top: int) -> str:
    head, table = _flat(rows[:top], ks)
    keep = [i for i, h in enumerate(head) if ":" not in h]
    cells = [[str(head[i]) for i in keep]] + [[str(r[i]) for i in keep] for r in table]
    widths = [max(len(c[i]) for c in cells) for i in range(len(keep))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(keep))) for c in cells)


@click.command("sweep")
@click.argument("source", type=click.Path(exists=True))
@click.option("--grid", "grid_specs", multiple=True, metavar="KEY=V1,V2",
              help=f"A grid axis (repeat); KEY in {', '.join(GRID_KEYS)}. Signal sets are "
                   "'+'-joined names or all|lexical|dense|default|extractive, separated by ';'.")
@click.option("--k", "ks", default="3,5,10", show_default=True, help="recall_all cut-offs.")
@click.option("--rank-by", default=None, help="Metric to rank by [default: recall_all@<first k>].")
@click.option("--top", type=click.IntRange(1), default=20, show_default=True,
              help="Rows printed.")
@click.option("--baselines", is_flag=True,
              help="Also evaluate every single signal alone and, when SOURCE is a dataset, "
                   "plain BM25 over session text with bm25s's tokenizer defaults.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write <out>.csv and <out>.json (ranked, with per-type and "
                   "per-conversation metrics and the leave-one-out estimate).")
@dataset_options
@build_options
def sweep(source, grid_specs, ks, rank_by, top, baselines, out, **opts) -> None:
    """Evaluate a grid of memgas_hybrid settings on all questions at once."""
    from .eval import _ks

    ks = _ks(ks)
    grid = parse_grid(grid_specs)
    by = rank_by or f"recall_all@{ks[0]}"
    if by not in {f"recall_all@{k}" for k in ks}:
        choices = ", ".join(f"recall_all@{k}" for k in ks)
        raise click.BadParameter(f"--rank-by must be one of {choices}")
    src = Path(source)
    dataset = expansion = None
    if (src / "manifest.json").exists():
        from ..retrieve import MemoryIndex

        idx = MemoryIndex.load(src)
    else:
        if "stopwords" in grid or baselines:  # the raw texts are needed to re-tokenise
            from ..expand import expand_dataset

            dataset = load(source, opts["fmt"], opts["empty_sessions"], opts["user_only"],
                           opts["conversations"], opts["exclude_conversations"])
            expansion = expand_dataset(dataset, summaries=opts["summaries"],
                                       keywords=opts["keywords"])
        idx = build_index(source, dataset=dataset, **opts)
    rows = rank(run_sweep(idx, grid, ks, opts.get("device"), dataset, expansion, baselines),
                by, ks)
    loo = leave_one_out(rows, by) if idx.n_conversations > 1 else {}
    click.echo(f"{len(rows)} settings, {len(idx.questions)} questions; ranked by {by} (%):")
    click.echo(format_ranked(rows, ks, top))
    g = gains(rows, ks) if baselines else []
    if g:
        click.echo("rank 1 against the best baseline, per question type (%):")
        click.echo(format_gains(g))
    if loo:
        picks = sum(not r["settings"].get("baseline") for r in rows) > 1
        per = loo["by_conversation"]
        click.echo(f"leave-one-conversation-out {by}: {100 * loo[by]:.2f}" if picks else
                   "per conversation (one setting, so leave-one-out has nothing to pick):")
        if len(per) > MAX_LOO_LINES:
            click.echo(f"  ({len(per)} conversations: per-conversation results in the JSON)")
        for c, v in per.items() if len(per) <= MAX_LOO_LINES else ():
            click.echo(f"  {c}: held-out {100 * v['held_out']:.2f} (train "
                       f"{100 * v['train']:.2f}) with {v['settings']}" if picks else
                       f"  {c}: {100 * v['held_out']:.2f} ({v['n']} questions)")
    if out:
        head, table = _flat(rows, ks)
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(head)
        w.writerows(table)
        base = Path(out)
        with atomic_write(base.with_suffix(".csv"), "w", encoding="utf-8", newline="") as f:
            f.write(buf.getvalue())
        doc = {"source": str(source), "grid": {k: ["+".join(v) if isinstance(v, tuple)
                                                  else v for v in vals]
                                              for k, vals in grid.items()},
               "rank_by": by, "rows": rows, "leave_one_out": loo,
               "gains": [dict(zip(("type", "k", "ours", "best_baseline", "baseline",
                                   "gain"), x)) for x in g]}
        with atomic_write(base.with_suffix(".json"), "w", encoding="utf-8") as f:
            json.dump(nan_to_null(doc), f, indent=1, allow_nan=False)  # no value: null
        click.echo(f"wrote {base.with_suffix('.csv')} and {base.with_suffix('.json')}", err=True)
