"""``memgas sweep DATA|DIR --grid KEY=V1,V2 ...``: evaluate a grid of read-path settings
in one batched run (the engine is :mod:`memgas_gpu.eval.sweep`; this module parses and
prints).  Prints a ranked table, writes CSV and JSON (atomically), and a leave-one-
conversation-out estimate: for each conversation, the setting that is best on the
*other* conversations, scored on the held-out one.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import click

from .. import __version__
from .._display import safe_text
from .._io import atomic_write, nan_to_null
from ..retrieve.params import ReadParams
from ..retrieve.presets import METHODS
from ._common import (DEFAULT_METHOD, FiniteFloat, PathArg, build_index, build_options,
                      check_out_file, check_runtime, dataset_options, info, ks_callback, load,
                      refuse_dataset_selection)

#: accepted ranges of the numeric grid keys, from :class:`ReadParams`' field specs (NaN
#: and inf are refused for all)
_GRID_RANGES = {name: FiniteFloat(spec.lo, spec.hi, min_open=spec.lo_open)
                for name, spec in ReadParams.specs().items() if spec.kind in ("int", "real")}

#: conversations up to which the leave-one-out picks are printed one per line
MAX_LOO_LINES = 12


def _bad_grid(message: str) -> click.BadParameter:
    return click.BadParameter(message, param_hint="--grid")


def parse_grid(specs) -> dict:
    """``["alpha=15,30", "signals=all;bm25_S"]`` → ``{key: [values]}``; signal sets are
    separated by ``;`` (or ``,``); non-finite numbers are refused. Errors name
    ``--grid``."""
    import math

    from ..eval.sweep import GRID_KEYS, signal_set
    from ..retrieve import SettingsError

    grid: dict = {}
    for spec in specs:
        key, sep, vals = spec.partition("=")
        key = key.strip()
        if not sep or key not in GRID_KEYS:
            raise _bad_grid(f"expected KEY=V1,V2 with KEY in {', '.join(GRID_KEYS)}; "
                            f"got {spec!r}")
        raw = [v.strip() for v in vals.replace(";", ",").split(",") if v.strip()]
        try:
            values = [signal_set(v) if key == "signals" else
                      (None if key == "stopwords" and v == "none" else GRID_KEYS[key](v))
                      for v in raw]
        except SettingsError as e:
            raise _bad_grid(str(e)) from None
        except ValueError:
            raise _bad_grid(f"bad value in {spec!r}") from None
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise _bad_grid(f"non-finite value in {spec!r}")
        if not values:
            raise _bad_grid(f"no values in {spec!r}")
        if key in _GRID_RANGES:
            for v in values:
                why = _GRID_RANGES[key].check(v)
                if why is not None:
                    raise _bad_grid(f"{key}: {why} in {spec!r}")
        grid[key] = list(dict.fromkeys(values))
    return grid


def check_grid(grid: dict, method: str, is_index: bool) -> None:
    """Every grid value checked as a setting of ``method`` (an unknown ``fusion``,
    ``graph``, ``router``, ``norm``, ``bm25_method`` or stopword list) before anything
    is loaded: it was refused after the index was loaded or built, naming neither the
    option nor the grid."""
    from ..lexical import Tokenizer
    from ..retrieve import SettingsError, resolve

    if "stopwords" in grid:
        if is_index:
            raise _bad_grid("a stopwords axis re-tokenises the texts: it needs the dataset "
                            "(DATA), not an index folder")
        for v in grid["stopwords"]:
            try:
                Tokenizer(stopwords=v)
            except ValueError as e:
                raise _bad_grid(f"stopwords: {e}") from None
    for key, values in grid.items():
        for v in values if key != "stopwords" else ():
            try:
                resolve(None, method, **{key: v})
            except SettingsError as e:
                raise _bad_grid(f"{e} (method {method})") from None


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


def _cell(value) -> str:
    return "-" if isinstance(value, float) and value != value else str(value)


def format_ranked(rows: list, ks, top: int) -> str:
    head, table = _flat(rows[:top], ks)
    keep = [i for i, h in enumerate(head) if ":" not in h]
    # a metric over no question (only abstentions) is NaN: "-", as memgas eval shows it
    cells = [[str(head[i]) for i in keep]] + [[_cell(r[i]) for i in keep] for r in table]
    widths = [max(len(c[i]) for c in cells) for i in range(len(keep))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(keep))) for c in cells)


@click.command("sweep")
@click.argument("source", type=PathArg(exists=True))
@click.option("--grid", "grid_specs", multiple=True, metavar="KEY=V1,V2",
              help="A grid axis (repeat); KEY in signals, norm, temperature, router, alpha, "
                   "damping, fusion, graph, k1, b, bm25_method, stopwords, time_beta, speaker_gamma. "
                   "Signal sets are "
                   "'+'-joined names or all|lexical|dense|default|extractive, separated by ';'.")
@click.option("--method", type=click.Choice(METHODS), default=DEFAULT_METHOD,
              show_default=True,
              help="The preset whose settings the grid varies.")
@click.option("--k", "ks", default="3,5,10", show_default=True, callback=ks_callback,
              help="recall_all cut-offs (comma-separated, >= 1).")
@click.option("--rank-by", default=None, help="Metric to rank by [default: recall_all@<first k>].")
@click.option("--top", type=click.IntRange(1), default=20, show_default=True,
              help="Rows printed.")
@click.option("--baselines", is_flag=True,
              help="Also evaluate every single signal alone and, when SOURCE is a dataset, "
                   "plain BM25 over session text with bm25s's tokenizer defaults.")
@click.option("--out", type=PathArg(dir_okay=False), default=None,
              help="Write <out>.csv and <out>.json (ranked, with per-type and "
                   "per-conversation metrics and the leave-one-out estimate).")
@dataset_options
@build_options
def sweep(source, grid_specs, method, ks, rank_by, top, baselines, out, **opts) -> None:
    """Evaluate a grid of read-path settings on all questions at once."""
    from ..eval.sweep import gains, leave_one_out, rank, run_sweep
    opts["device"] = check_runtime(opts["device"])
    for suffix in (".csv", ".json") if out else ():
        check_out_file(Path(out).with_suffix(suffix))
    grid = parse_grid(grid_specs)
    by = rank_by or f"recall_all@{ks[0]}"
    if by not in {f"recall_all@{k}" for k in ks}:
        choices = ", ".join(f"recall_all@{k}" for k in ks)
        raise click.BadParameter(f"{by!r} is not one of {choices} (the --k cut-offs)",
                                 param_hint="--rank-by")
    src = Path(source)
    is_index = (src / "manifest.json").exists()
    if is_index:
        refuse_dataset_selection(opts)
    check_grid(grid, method, is_index)
    dataset = expansion = None
    if is_index:
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
    rows = rank(run_sweep(idx, grid, ks, opts.get("device"), dataset, expansion, baselines,
                          method=method), by, ks)
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
            c = safe_text(c)  # a conversation id: data
            click.echo(f"  {c}: held-out {100 * v['held_out']:.2f} (train "
                       f"{100 * v['train']:.2f}) with {v['settings']}" if picks else
                       f"  {c}: {100 * v['held_out']:.2f} ({v['n']} questions)")
        skipped = loo.get("skipped") or []
        if skipped:
            shown = ", ".join(map(safe_text, skipped[:3])) + (", …" if len(skipped) > 3 else "")
            click.echo(f"  ({len(skipped)} conversation(s) with only abstention questions, "
                       f"left out as memgas eval leaves those questions out: {shown})")
    if out:
        head, table = _flat(rows, ks)
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(head)
        w.writerows(table)
        base = Path(out)
        with atomic_write(base.with_suffix(".csv"), "w", encoding="utf-8", newline="") as f:
            f.write(buf.getvalue())
        doc = {"memgas_gpu": __version__, "source": str(source),
               "encoder": (idx.config or {}).get("encoder"), "grid": {k: ["+".join(v) if isinstance(v, tuple)
                                                  else v for v in vals]
                                              for k, vals in grid.items()},
               "rank_by": by, "rows": rows, "leave_one_out": loo,
               "gains": [dict(zip(("type", "k", "ours", "best_baseline", "baseline",
                                   "gain"), x)) for x in g]}
        with atomic_write(base.with_suffix(".json"), "w", encoding="utf-8") as f:
            json.dump(nan_to_null(doc), f, indent=1, allow_nan=False)  # no value: null
        info(f"wrote {base.with_suffix('.csv')} and {base.with_suffix('.json')}")
