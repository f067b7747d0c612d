"""``memgas eval DIR|DATA --method ... --out results.jsonl``."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .._io import atomic_write, nan_to_null
from ..gam.presets import GAM_METHODS  # GAM and its ablations (no tensor code imported)
from ._common import (FiniteFloat, build_index, build_options, dataset_options, load,
                      parse_ks, parse_settings, ray_or_exit)

# kept here (not imported) so `memgas --help` does not import torch; a test checks it
# equals memgas_gpu.retrieve.METHODS
METHODS = ("memgas", "no_gmm", "no_ppr", "no_router", "no_association", "session", "turn",
           "summary", "keyword", "concat", "bm25", "memgas_hybrid")
KS = (1, 3, 5, 10, 30, 50)


@click.command("eval")
@click.argument("source", type=click.Path(exists=True))
@click.option("--method", "methods", multiple=True, default=("memgas",), show_default=True,
              type=click.Choice(METHODS + GAM_METHODS + ("all",)),
              help="Retrieval method (repeat for several; 'all' for every session method). "
                   "GAM methods rank utterances (evidence-turn metrics; need DATA).")
@click.option("--turns", "turn_level", is_flag=True,
              help="Also report evidence-turn recall (k = 5, 10, 20) of the session methods: "
                   "the messages of the ranked sessions, in rank order (needs DATA).")
@click.option("--segmentation", default="semantic", show_default=True,
              help="GAM topic segmentation: semantic, tokens<N>, turns<N>, session.")
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
def eval_cmd(source, methods, turn_level, segmentation, router, temperature, alpha, damping,
             set_specs, signals, ks, out, save_index, **opts) -> None:
    """Evaluate retrieval on an index folder (or a dataset, indexed first)."""
    from ..eval import evaluate, format_table, write_logs
    from ..retrieve import MemoryIndex, resolve, retrieve

    ks = parse_ks(ks)
    settings = {"temperature": temperature, "alpha": alpha, "damping": damping,
                "router": router, "signals": signals}
    settings = {**parse_settings(set_specs),
                **{k: v for k, v in settings.items() if v is not None}}
    src = Path(source)
    gam_methods = [m for m in dict.fromkeys(methods) if m in GAM_METHODS]
    methods = METHODS if "all" in methods else tuple(m for m in dict.fromkeys(methods)
                                                     if m not in GAM_METHODS)
    is_index = (src / "manifest.json").exists()
    if (gam_methods or turn_level) and is_index:
        raise click.BadParameter("GAM methods and --turns need DATA (a dataset file), not an "
                                 "index folder", param_hint="SOURCE")
    dataset = None
    if not is_index:
        dataset = load(source, opts["fmt"], opts["empty_sessions"], opts["user_only"],
                       opts["conversations"], opts["exclude_conversations"])
    results, used = {}, {}
    gam = _gam(dataset, gam_methods, turn_level, segmentation, opts) if (
        gam_methods or turn_level) else None
    for m in gam_methods:
        results[m], used[m] = _gam_method(gam, m, segmentation, dataset, opts, out,
                                          len(gam_methods) + len(methods) > 1)
    if not methods:
        return _write_metrics(out, source, used, ks, results)
    if is_index:
        idx = MemoryIndex.load(src)
    else:
        idx = build_index(source, dataset=dataset, **opts)
        if save_index:
            idx.save(save_index)
    for method in dict.fromkeys(methods):  # refuse bad settings before any work
        resolve(idx, method, **settings)
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
        per_turn = None
        if turn_level:
            from ..eval.turns import evaluate_turns, turn_metrics

            tr = gam.session_turns(r)
            gold = [gam.questions[i].evidence_turn_ids for i in tr.question_index.tolist()]
            per_turn = turn_metrics(tr.rankings, tr.turn_ids, gold)
            results[method]["turn"] = evaluate_turns(tr.rankings, tr.turn_ids, gold)
            click.echo(_turn_line(results[method]["turn"]))
        if out:
            path = Path(out)
            if len(methods) + len(gam_methods) > 1:
                path = path.with_name(f"{path.stem}.{method}{path.suffix or '.jsonl'}")
            write_logs(ev, path, turn_metrics=per_turn)
            click.echo(f"wrote {path}", err=True)
    _write_metrics(out, source, used, ks, results)


def _write_metrics(out, source, used, ks, results) -> None:
    if out:
        mpath = Path(out).with_suffix(".metrics.json")
        with atomic_write(mpath, "w", encoding="utf-8") as f:
            json.dump(nan_to_null({"source": str(source), "params": used, "ks": list(ks),
                                   "methods": results}), f, indent=1, allow_nan=False,
                      default=str)
        click.echo(f"wrote {mpath}", err=True)


def _gam(dataset, gam_methods, turn_level, segmentation, opts):
    """The GAM memory of ``dataset`` (its events also give the turn rankings of the
    session methods)."""
    from ..encode import EmbeddingStore, Encoder
    from ..gam import GamIndex, GamParams
    from ..gam.boundary import parse_segmentation

    try:
        parse_segmentation(segmentation)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--segmentation") from None
    enc = Encoder(opts.get("encoder"), pooling=opts.get("pooling", "mean"),
                  max_length=opts.get("max_length"), device=opts.get("device"))
    st = EmbeddingStore(opts["store"], enc.fingerprint) if opts.get("store") else None
    click.echo(f"building GAM memory of {len(dataset)} conversations", err=True)
    return GamIndex.build(dataset, enc, GamParams(segmentation=segmentation), store=st)


def _gam_method(gam, method, segmentation, dataset, opts, out, several):
    """Evaluate one GAM method at the turn level; returns (summary, settings)."""
    from ..eval.turns import evaluate_turns, turn_metrics
    from ..gam import GamIndex, GamParams, preset

    p = preset(method, GamParams(segmentation=segmentation))
    idx = gam
    if p.segmentation != gam.params.segmentation:  # w/o SSM: sessions as topics
        idx = GamIndex.build(dataset, gam.encoder, p, events=gam.events)
    tr = idx.retrieve(method="gam", params=p)
    gold = [idx.questions[i].evidence_turn_ids for i in tr.question_index.tolist()]
    res = {"turn": evaluate_turns(tr.rankings, tr.turn_ids, gold)}
    click.echo(f"\n== {method} ({len(tr.question_index)} questions; utterance-level)")
    click.echo(_turn_line(res["turn"]))
    if out:
        path = Path(out)
        if several:
            path = path.with_name(f"{path.stem}.{method}{path.suffix or '.jsonl'}")
        per = turn_metrics(tr.rankings, tr.turn_ids, gold)
        _write_turn_logs(idx, tr, per, path)
        click.echo(f"wrote {path}", err=True)
    return res, {k: v for k, v in vars(p).items() if not k.startswith("_")}


def _turn_line(res: dict) -> str:
    shown = "  ".join(f"{k} {100 * v:.2f}" for k, v in res.items()
                      if k.startswith("recall") and k.endswith(("@5", "@10", "@20")))
    return f"   evidence turns (n={res.get('n', 0)}): {shown}"


def _write_turn_logs(idx, tr, per: dict, path) -> None:
    """LongMemEval-harness-style logs of an utterance ranking (``metrics.turn``)."""
    import math

    with atomic_write(path, "w", encoding="utf-8") as f:
        for row, i in enumerate(tr.question_index.tolist()):
            q = idx.questions[i]
            ids = tr.turn_ids[row]
            items = [{"corpus_id": ids[p]} for p in tr.rankings[row].tolist()[:50] if p >= 0]
            rec = {"question_id": q.id, "question_type": q.type, "question": q.text,
                   "answer": q.answer, "question_date": q.date,
                   "answer_session_ids": list(q.evidence_session_ids),
                   "retrieval_results": {"query": q.text, "ranked_items": items, "metrics": {
                       "session": {},
                       "turn": {k: float(v[row]) for k, v in per.items()
                                if not math.isnan(float(v[row]))}}}}
            f.write(json.dumps(rec, ensure_ascii=False, allow_nan=False, default=str) + "\n")


def _settings(params: dict) -> str:
    """One line of the settings a method ran with (and why, for auto signals)."""
    keys = ("signals", "norm", "router", "temperature", "fusion", "alpha", "damping", "graph")
    line = ", ".join(f"{k}={params[k]}" for k in keys if k in params)
    rule = params.get("signals_rule") or {}
    notes = [f"signals=auto: {rule['reason']}"] if "reason" in rule else []
    if "speaker_gamma" in rule:
        notes.append(f"speaker cue {rule['speaker_gamma']}")
    return "; ".join([line] + notes)
