"""``memgas eval DIR|DATA --method ... --out results.jsonl``."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .. import __version__
from .._io import atomic_write, nan_to_null
from ..gam.params import GamParams
from ..gam.presets import GAM_METHODS  # GAM and its ablations (no tensor code imported)
from ..retrieve.params import ReadParams
from ..retrieve.presets import METHODS, PRESETS  # the session methods (no torch imported)
from ._common import (DEFAULT_METHOD, PathArg, build_index, build_options,
                      check_out_dir, check_out_file, check_runtime, dataset_options, info,
                      ks_callback, load, ray_or_exit, refuse_dataset_selection,
                      segmentation_callback, setting_type, settings_callback)

KS = (1, 3, 5, 10, 30, 50)


@click.command("eval")
@click.argument("source", type=PathArg(exists=True))
@click.option("--method", "methods", multiple=True, default=(DEFAULT_METHOD,),
              show_default=True, type=click.Choice(METHODS + GAM_METHODS + ("all",)),
              help="Retrieval method (repeat for several; 'all' for every session method). "
                   "GAM methods rank utterances (evidence-turn metrics; need DATA).")
@click.option("--turns", "turn_level", is_flag=True,
              help="Also report evidence-turn recall (k = 5, 10, 20) of the session methods: "
                   "the messages of the ranked sessions, in rank order (needs DATA).")
@click.option("--segmentation", default=GamParams.segmentation, show_default=True,
              callback=segmentation_callback, help="GAM topic segmentation: semantic, tokens<N>, turns<N>, session.")
@click.option("--router", type=setting_type(ReadParams, "router"), default=None,
              help="Router weights: paper's 1/H, the authors' code's 1-H, or uniform "
                   "[default: each method's preset].")
@click.option("--temperature", type=setting_type(ReadParams, "temperature"), default=None,
              help="Router softmax temperature λ [default: preset; memgas "
                   f"{ReadParams.temperature}].")
@click.option("--alpha", type=setting_type(ReadParams, "alpha"), default=None,
              help=f"Seed nodes kept for PageRank [default: preset, {ReadParams.alpha}].")
@click.option("--damping", type=setting_type(ReadParams, "damping"), default=None,
              help=f"Probability of following an edge [default: preset, {ReadParams.damping}].")
@click.option("--set", "set_specs", multiple=True, metavar="KEY=VALUE",
              callback=settings_callback,
              help="Any read-path setting (repeat), e.g. --set time_beta=0 --set fusion=ppr "
                   "(docs/algorithm.md lists them).")
@click.option("--signals", default=None,
              help="Signals ('+'-joined names) replacing the preset's; memgas_hybrid's "
                   "default 'auto' is chosen by a rule that is printed and recorded.")
@click.option("--k", "ks", default=",".join(map(str, KS)), show_default=True,
              callback=ks_callback, help="Metric cut-offs (comma-separated, >= 1).")
@click.option("--out", type=PathArg(dir_okay=False), default=None,
              help="LongMemEval-style retrieval log (JSONL). One method: written to OUT "
                   "exactly; several: one log per method, OUT with the method before its "
                   "suffix (r.jsonl -> r.memgas.jsonl, r.bm25.jsonl). Metrics of all: OUT "
                   "with its suffix replaced by .metrics.json (r.metrics.json).")
@click.option("--save-index", type=PathArg(file_okay=False), default=None,
              help="When SOURCE is a dataset: also save the built index here.")
@dataset_options
@build_options
def eval_cmd(source, methods, turn_level, segmentation, router, temperature, alpha, damping,
             set_specs, signals, ks, out, save_index, **opts) -> None:
    """Evaluate retrieval on an index folder (or a dataset, indexed first)."""
    from ..eval import evaluate, format_table, write_logs
    from ..retrieve import MemoryIndex, resolve, retrieve

    opts["device"] = check_runtime(opts["device"])
    settings = {"temperature": temperature, "alpha": alpha, "damping": damping,
                "router": router, "signals": signals}
    settings = {**set_specs, **{k: v for k, v in settings.items() if v is not None}}
    src = Path(source)
    gam_methods = [m for m in dict.fromkeys(methods) if m in GAM_METHODS]
    methods = METHODS if "all" in methods else tuple(m for m in dict.fromkeys(methods)
                                                     if m not in GAM_METHODS)
    is_index = (src / "manifest.json").exists()
    if is_index:
        refuse_dataset_selection(opts)
    if (gam_methods or turn_level) and is_index:
        raise click.BadParameter("GAM methods and --turns need DATA (a dataset file), not an "
                                 "index folder", param_hint="SOURCE")
    check_settings(methods, settings, set_specs)
    several = len(methods) + len(gam_methods) > 1
    for m in (gam_methods + list(dict.fromkeys(methods))) if out else ():
        check_out_file(log_path(out, m, several))
    check_out_file(metrics_path(out) if out else None)
    if save_index and not is_index:
        check_out_dir(save_index, "--save-index", index=True)
    dataset = None
    if not is_index:
        dataset = load(source, opts["fmt"], opts["empty_sessions"], opts["user_only"],
                       opts["conversations"], opts["exclude_conversations"])
    results, used = {}, {}
    gam = _gam(dataset, gam_methods, turn_level, segmentation, opts) if (
        gam_methods or turn_level) else None
    for m in gam_methods:
        results[m], used[m] = _gam_method(gam, m, segmentation, dataset, opts, out, several)
    if not methods:
        return _write_metrics(out, source, used, ks, results, gam.encoder.describe())
    if is_index:
        idx = MemoryIndex.load(src)
    else:
        idx = build_index(source, dataset=dataset, **opts)
        if save_index:
            idx.save(save_index)
    for method in dict.fromkeys(methods):  # refuse bad settings before any work
        resolve(idx.view(), method, **settings)
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
        click.echo(f"   {settings_line(method, r.params)}")
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
            path = log_path(out, method, several)
            write_logs(ev, path, turn_metrics=per_turn)
            info(f"wrote {path}")
    _write_metrics(out, source, used, ks, results, idx.config.get("encoder"))


def check_settings(methods, settings: dict, from_set: dict) -> None:
    """The read-path settings checked against each method's preset before any work
    (what needs the index, such as ``signals="auto"``, is checked once it is loaded);
    an error names the option that gave the setting."""
    from ..retrieve import SettingsError, resolve

    for method in dict.fromkeys(methods):
        for key, value in [*settings.items(), (None, None)]:  # each alone, then all
            try:
                resolve(None, method, **({key: value} if key else settings))
            except SettingsError as e:
                # (identity first: NaN, the value most worth naming, equals nothing)
                given_by_set = key in from_set and (settings[key] is from_set[key]
                                                    or settings[key] == from_set[key])
                hint = "--set" if key is None or given_by_set else f"--{key}"
                raise click.BadParameter(f"{e} (method {method})", param_hint=hint) from None


def log_path(out, method: str, several: bool) -> Path:
    """Where ``--out`` puts a method's retrieval log: OUT itself for one method, else OUT
    with ``.METHOD`` before its suffix (``r.jsonl`` → ``r.memgas.jsonl``)."""
    path = Path(out)
    if not several:
        return path
    return path.with_name(f"{path.stem}.{method}{path.suffix or '.jsonl'}")


def metrics_path(out) -> Path:
    """Where ``--out`` puts the metrics: its suffix replaced (``r.jsonl`` → ``r.metrics.json``)."""
    return Path(out).with_suffix(".metrics.json")


def _write_metrics(out, source, used, ks, results, encoder) -> None:
    if out:
        mpath = metrics_path(out)
        with atomic_write(mpath, "w", encoding="utf-8") as f:
            json.dump(nan_to_null({"memgas_gpu": __version__, "source": str(source),
                                   "encoder": encoder, "params": used, "ks": list(ks),
                                   "methods": results}), f, indent=1, allow_nan=False,
                      default=str)
        info(f"wrote {mpath}")


def _gam(dataset, gam_methods, turn_level, segmentation, opts):
    """The GAM memory of ``dataset`` (its events also give the turn rankings of the
    session methods)."""
    from ..encode import EmbeddingStore, Encoder
    from ..gam import GamIndex
    from ..gam.boundary import parse_segmentation

    try:
        parse_segmentation(segmentation)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--segmentation") from None
    enc = Encoder(opts.get("encoder"), pooling=opts.get("pooling", "mean"),
                  max_length=opts.get("max_length"), device=opts.get("device"))
    st = EmbeddingStore(opts["store"], enc.fingerprint, dtype=opts.get("store_dtype")) \
        if opts.get("store") else None
    info(f"building GAM memory of {len(dataset)} conversations with {enc.name} on "
         f"{enc.device}")
    return GamIndex.build(dataset, enc, GamParams(segmentation=segmentation), store=st)


def _gam_method(gam, method, segmentation, dataset, opts, out, several):
    """Evaluate one GAM method at the turn level; returns (summary, settings)."""
    from ..eval.turns import evaluate_turns, turn_metrics
    from ..gam import GamIndex, preset

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
        path = log_path(out, method, several)
        per = turn_metrics(tr.rankings, tr.turn_ids, gold)
        _write_turn_logs(idx, tr, per, path)
        info(f"wrote {path}")
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


def settings_line(method: str, params: dict) -> str:
    """One line of the settings a method ran with: every setting that differs from the
    paper's defaults (MemGAS, ``ReadParams()``); then those that differ from the
    method's own preset (``--set`` and the options), and why, when ``signals="auto"``
    chose the signals or the speaker cue was switched off."""
    paper = ReadParams().describe()
    preset = PRESETS[method].describe() if method in PRESETS else paper
    diff = [f"{k}={params[k]}" for k in paper if k in params and params[k] != paper[k]]
    line = "settings: " + (", ".join(diff) if diff else "the paper's defaults")
    changed = [f"{k} {preset[k]} -> {params[k]}" for k in paper if k in params and
               params[k] != preset[k] and not (k == "signals" and preset[k] == "auto")]
    if changed:
        line += f"; changed from the {method} preset: " + ", ".join(changed)
    rule = params.get("signals_rule") or {}
    if "reason" in rule:
        line += f"; signals=auto: {rule['reason']}"
    if "speaker_gamma" in rule:
        line += f"; speaker cue {rule['speaker_gamma']}"
    return line
