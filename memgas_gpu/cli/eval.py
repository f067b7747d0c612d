"""``memgas eval DIR|DATA --method ... --out results.jsonl``."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .._io import atomic_write, nan_to_null
from ._common import FiniteFloat, build_index, build_options, dataset_options, ray_or_exit

# kept here (not imported) so `memgas --help` does not import torch; a test checks it
# equals memgas_gpu.retrieve.METHODS
METHODS = ("memgas", "no_gmm", "no_ppr", "no_router", "no_association", "session", "turn",
           "summary", "keyword", "hybrid", "bm25", "memgas_hybrid")
KS = (1, 3, 5, 10, 30, 50)


def _ks(value: str):
    try:
        ks = tuple(sorted({int(x) for x in value.split(",") if x.strip()}))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}")
    if not ks or ks[0] < 1:
        raise click.BadParameter("cut-offs must be positive integers")
    return ks


@click.command("eval")
@click.argument("source", type=click.Path(exists=True))
@click.option("--method", "methods", multiple=True, default=("memgas",), show_default=True,
              type=click.Choice(METHODS + ("all",)),
              help="Retrieval method (repeat for several; 'all' for every one).")
@click.option("--router", type=click.Choice(("inverse", "one_minus")), default="inverse",
              show_default=True, help="Router weights: paper's 1/H or the authors' code's 1-H.")
@click.option("--temperature", type=FiniteFloat(0, min_open=True), default=0.2, show_default=True,
              help="Router softmax temperature λ.")
@click.option("--alpha", type=click.IntRange(1), default=15, show_default=True,
              help="Seed nodes kept for PageRank.")
@click.option("--damping", type=FiniteFloat(0, 1), default=0.1, show_default=True,
              help="Probability of following an edge.")
@click.option("--k", "ks", default=",".join(map(str, KS)), show_default=True,
              help="Metric cut-offs.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="LongMemEval-style retrieval log (JSONL); METHOD is inserted before the "
                   "suffix when several methods run. Metrics go to <out>.metrics.json.")
@click.option("--save-index", type=click.Path(file_okay=False), default=None,
              help="When SOURCE is a dataset: also save the built index here.")
@dataset_options
@build_options
def eval_cmd(source, methods, router, temperature, alpha, damping, ks, out, save_index,
             **opts) -> None:
    """Evaluate retrieval on an index folder (or a dataset, indexed first)."""
    from ..eval import evaluate, format_table, write_logs
    from ..retrieve import MemoryIndex, SearchParams, retrieve

    ks = _ks(ks)
    src = Path(source)
    if (src / "manifest.json").exists():
        idx = MemoryIndex.load(src)
    else:
        idx = build_index(source, **opts)
        if save_index:
            idx.save(save_index)
    if "all" in methods:
        methods = METHODS
    params = SearchParams(temperature=temperature, alpha=alpha, damping=damping, router=router)
    results = {}
    ray_address = opts.get("ray_address")
    if ray_address:
        from ..distributed import retrieve_ray

        ray_or_exit(ray_address)
    for method in dict.fromkeys(methods):
        if ray_address:
            r = retrieve_ray(idx, method=method, params=params, num_tasks=opts["workers"],
                             device=opts.get("device"))
        else:
            r = retrieve(idx, method=method, params=params, device=opts.get("device"))
        ev = evaluate(idx, r, ks=ks)
        results[method] = ev.summary
        click.echo(f"\n== {method} ({len(r.question_index)} questions)")
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
            json.dump(nan_to_null({"source": str(source), "params": vars(params),
                                   "ks": list(ks), "methods": results}), f, indent=1,
                      allow_nan=False)
        click.echo(f"wrote {mpath}", err=True)
