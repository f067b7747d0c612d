"""``memgas eval DIR|DATA --method ... --out results.jsonl``."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .._io import atomic_write, nan_to_null
from ._common import (FiniteFloat, build_index, build_options, dataset_options, parse_ks,
                      parse_settings, ray_or_exit)

# kept here (not imported) so `memgas --help` does not import torch; a test checks it
# equals memgas_gpu.retrieve.METHODS
METHODS = ("memgas", "no_gmm", "no_ppr", "no_router", "no_association", "session", "turn",
           "summary", "keyword", "concat", "bm25", "memgas_hybrid")
KS = (1, 3, 5, 10, 30, 50)


@click.command("eval")
@click.argument("source", type=click.Path(exists=True))
@click.option("--method", "methods", multiple=True, default=("memgas",), show_default=True,
              type=click.Choice(METHODS + ("all",)),
              help="Retrieval method (repeat for several; 'all' for every one).")
@click.option("--router", type=click.Choice(("inverse", "one_minus", "uniform")), default=None,
              help="Router weights: paper's 1/H, the authors' code's 1-H, or uniform "
                   "[default: each method's preset].")
@click.option("--temperature", type=FiniteFloat(0, min_open=True), default=None,
              help="Router softmax temperature λ [default: preset; memgas 0.2].")
@click.option("--alpha", type=click.IntRange(1), default=None,
              help="Seed nodes kept for PageRank [default: preset, 15].")
@click.option("--damping", type=FiniteFloat(0, 1), default=None,
              help="Probability of following an edge [default: preset, 0.1].")
@click.option("--set", "set_specs", multiple=True, metavar="KEY=VALUE",
              help="Any read-path setting (repeat), e.g. --set time_beta=0 --set fusion=ppr "
                   "(docs/algorithm.md lists them).")
@click.option("--signals", default=None,
              help="Signals ('+'-joined names) replacing the preset's; memgas_hybrid's "
                   "default 'auto' is chosen by a rule that is printed and recorded.")
@click.option("--k", "ks", default=",".join(map(str, KS)), show_default=True,
              help="Metric cut-offs.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="LongMemEval-style retrieval log (JSONL); METHOD is inserted before the "
                   "suffix when several methods run. Metrics go to <out>.metrics.json.")
@click.option("--save-index", type=click.Path(file_okay=False), default=None,
              help="When SOURCE is a dataset: also save the built index here.")
@dataset_options
@build_options
def eval_cmd(source, methods, router, temperature, alpha, damping, set_specs, signals, ks,
             out, save_index, **opts) -> None:
    """Evaluate retrieval on an index folder (or a dataset, indexed first)."""
    from ..eval import evaluate, format_table, write_logs
    from ..retrieve import MemoryIndex, resolve, retrieve

    ks = parse_ks(ks)
    settings = {"temperature": temperature, "alpha": alpha, "damping": damping,
                "router": router, "signals": signals}
    settings = {**parse_settings(set_specs),
                **{k: v for k, v in settings.items() if v is not None}}
    src = Path(source)
    if (src / "manifest.json").exists():
        idx = MemoryIndex.load(src)
    else:
        idx = build_index(source, **opts)
        if save_index:
            idx.save(save_index)
    if "all" in methods:
        methods = METHODS
    for method in dict.fromkeys(methods):  # refuse bad settings before any work
        resolve(idx, method, **settings)
    results, used = {}, {}
    ray_address = opts.get("ray_address")
    if ray_address:
        from ..distributed import retrieve_ray

        ray_or_exit(ray_address)
    for method in dict.fromkeys(methods):
        if ray_address:
            r = retrieve_ray(idx, method=method, num_tasks=opts["workers"],
                             device=opts.get("device"), **settings)
        else:
            r = retrieve(idx, method=method, device=opts.get("device"), **settings)
        ev = evaluate(idx, r, ks=ks)
        results[method] = ev.summary
        used[method] = r.params
        click.echo(f"\n== {method} ({len(r.question_index)} questions)")
        click.echo(f"   {_settings(r.params)}")
        click.echo(format_table(ev, ks=[k for k in (1, 3, 5, 10) if k in ks] or ks[:3]))
        if out:
            path = Path(out)
            if len(methods) > 1:
                path = path.with_name(f"{path.stem}.{method}{path.suffix or '.jsonl'}")
            write_logs(ev, path)
            click.echo(f"wrote {path}", err=True)
    if out:
        mpath = Path(out).with_suffix(".metrics.json")
        with atomic_write(mpath, "w", encoding="utf-8") as f:
            json.dump(nan_to_null({"source": str(source), "params": used, "ks": list(ks),
                                   "methods": results}), f, indent=1, allow_nan=False)
        click.echo(f"wrote {mpath}", err=True)


def _settings(params: dict) -> str:
    """One line of the settings a method ran with (and why, for auto signals)."""
    keys = ("signals", "norm", "router", "temperature", "fusion", "alpha", "damping", "graph")
    line = ", ".join(f"{k}={params[k]}" for k in keys if k in params)
    rule = params.get("signals_rule") or {}
    notes = [f"signals=auto: {rule['reason']}"] if "reason" in rule else []
    if "speaker_gamma" in rule:
        notes.append(f"speaker cue {rule['speaker_gamma']}")
    return "; ".join([line] + notes)
