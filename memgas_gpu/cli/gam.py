"""``memgas gam DATA --method gam|gam_no_tan|... --segmentation semantic|tokens256|...``:
build GAM memory of a dataset and report evidence-turn recall (k = 5, 10, 20)."""
from __future__ import annotations

import json

import click

from .. import __version__
from .._io import atomic_write
from ..gam.params import SEGMENTATIONS, GamParams  # these two modules import no tensor code
from ..gam.presets import METHODS
from ._common import (TEXT_SOURCES, PathArg, check_encoder, check_out_file, check_runtime,
                      dataset_options, info, load, quiet_option, setting_type,
                      text_source_callback)


@click.command("gam")
@click.argument("data", type=PathArg(exists=True))
@click.option("--method", "methods", multiple=True, default=("gam",), show_default=True,
              type=click.Choice(METHODS + ("all",)),
              help="GAM, an ablation or a flat utterance baseline (repeat; 'all').")
@click.option("--segmentation", default=GamParams.segmentation, show_default=True,
              help=f"Topic segmentation: {', '.join(SEGMENTATIONS)} (any tokens<N>/turns<N>).")
@click.option("--theta", type=setting_type(GamParams, "theta"), default=None,
              help=f"Semantic boundary threshold on 1 - cos [default: {GamParams.theta}].")
@click.option("--anchors", type=setting_type(GamParams, "anchors"), default=None,
              help=f"Anchor topics [default: {GamParams.anchors}].")
@click.option("--noise", type=setting_type(GamParams, "noise"), default=GamParams.noise,
              show_default=True, help="Share of topic boundaries moved at random (robustness).")
@click.option("--seed", type=setting_type(GamParams, "noise_seed"), default=GamParams.noise_seed,
              show_default=True, help="Noise seed.")
@click.option("--summaries", default=GamParams.summaries, show_default=True,
              callback=text_source_callback("raw", *TEXT_SOURCES),
              help="c_sum source: offline (extractive, per topic), raw, or a .jsonl file.")
@click.option("--encoder", default=None, metavar="MODEL", callback=check_encoder,
              help="Encoder model: a Hugging Face name or a local folder [default: the "
                   "bundled all-MiniLM-L6-v2].")
@click.option("--store", type=PathArg(file_okay=False), default=None,
              help="Embedding store folder (encode each text once, across runs).")
@click.option("--device", default=None, help="cpu, cuda … [default: auto].")
@click.option("--out", type=PathArg(dir_okay=False), default=None,
              help="Write the metrics (JSON: method → metrics.turn, as fractions) here.")
@dataset_options
@quiet_option
def gam(data, methods, segmentation, theta, anchors, noise, seed, summaries, encoder, store,
        device, out, fmt, empty_sessions, user_only, conversations, exclude_conversations):
    """Build GAM memory of DATA and print evidence-turn recall per method."""
    from ..encode import EmbeddingStore, Encoder
    from ..eval.turns import evaluate_turns
    from ..gam import GamIndex, build_events, preset
    from ..gam.boundary import parse_segmentation

    try:
        parse_segmentation(segmentation)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--segmentation") from None
    device = check_runtime(device)
    check_out_file(out)
    methods = METHODS if "all" in methods else tuple(dict.fromkeys(methods))
    ds = load(data, fmt, empty_sessions, user_only, conversations, exclude_conversations)
    enc = Encoder(encoder, device=device)
    st = EmbeddingStore(store, enc.fingerprint) if store else None
    info(f"building GAM memory of {len(ds)} conversations with {enc.name} on {enc.device}")
    ev = build_events(ds, enc, store=st, progress=True)
    kw = {"segmentation": segmentation, "noise": noise, "noise_seed": seed,
          "summaries": summaries}
    if theta is not None:
        kw["theta"] = theta
    if anchors is not None:
        kw["anchors"] = anchors
    base = GamParams(**kw)
    built: dict = {}
    results = {}
    click.echo("evidence-turn recall per method, in % (as memgas eval):")
    for m in methods:
        p = preset(m, base)
        key = (p.segmentation,)
        if key not in built:
            built[key] = GamIndex.build(ds, enc, p, store=st, events=ev)
        idx = built[key]
        tr = idx.retrieve(method=m if m.startswith("flat_") else "gam", params=p)
        gold = [idx.questions[i].evidence_turn_ids for i in tr.question_index.tolist()]
        res = evaluate_turns(tr.rankings, tr.turn_ids, gold)
        results[m] = {"metrics": {"turn": res}, "topics": len(idx.topics),
                      "edges": int(idx.topics.src.numel())}
        shown = " ".join(f"{k}={100 * v:.2f}" for k, v in res.items()
                         if k.startswith("recall") and k.endswith(("@5", "@10", "@20")))
        click.echo(f"{m:12s} topics={len(idx.topics):5d} n={res['n']} {shown}")
    if out:
        with atomic_write(out) as f:
            json.dump({"memgas_gpu": __version__, "data": str(data),
                       "encoder": enc.describe(), "params": {**base.__dict__},
                       "results": results}, f, indent=1, default=str)
        info(f"wrote {out}")
