"""``memgas search IDX --conversation ID "question" [...]``: ask an index new questions."""
from __future__ import annotations

import json

import click

from .._display import safe_json, safe_text
from ..retrieve.presets import METHODS
from ._common import (DEFAULT_METHOD, PathArg, check_runtime, clean_queries,
                      date_callback, quiet_option, settings_callback)
from .eval import check_settings


def _queries(ctx, param, value):
    """QUERIES: each holds some text (an empty one was a traceback naming
    ``queries[0]``)."""
    blank = [i for i, q in enumerate(value, 1) if not q.strip()]
    if blank:
        raise click.BadParameter(f"question {blank[0]} is empty: there is nothing to search "
                                 "for", param=param)
    return value


@click.command("search")
@click.argument("index_dir", type=PathArg(exists=True, file_okay=False))
@click.argument("queries", nargs=-1, required=True, callback=_queries)
@click.option("--conversation", "conversation", required=True,
              help="Conversation id to search (`memgas stats IDX` lists them).")
@click.option("--k", type=click.IntRange(1), default=5, show_default=True,
              help="Sessions returned per question.")
@click.option("--method", type=click.Choice(METHODS), default=DEFAULT_METHOD,
              show_default=True, help="Retrieval method.")
@click.option("--evidence", type=click.IntRange(0), default=2, show_default=True,
              help="Best-matching turns shown per session.")
@click.option("--set", "set_specs", multiple=True, metavar="KEY=VALUE",
              callback=settings_callback, help="Any read-path setting (repeat), e.g. --set time_beta=0.")
@click.option("--date", "question_date", default=None, callback=date_callback,
              help="When the questions are asked (anchors 'last week' for the time cue; a "
                   "date python-dateutil reads, e.g. 2024-05-01).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per question.")
@click.option("--device", default=None, help="cpu or cuda (default: cuda if available).")
@quiet_option
def search(index_dir, queries, conversation, k, method, evidence, set_specs, question_date,
           as_json, device) -> None:
    """Rank the sessions of one conversation for new QUERIES (encoded with the index's
    own encoder)."""
    from ..retrieve import MemoryIndex

    device = check_runtime(device)
    settings = set_specs
    check_settings([method], settings, settings)
    queries = clean_queries(queries)
    idx = MemoryIndex.load(index_dir)
    if conversation not in {c.id for c in idx.conversations}:
        ids = [c.id for c in idx.conversations]
        shown = ", ".join(map(safe_text, ids[:8])) + (", …" if len(ids) > 8 else "")
        raise click.BadParameter(f"no conversation {conversation!r} in {index_dir} (it has "
                                 f"{len(ids)}: {shown})", param_hint="--conversation")
    results = idx.search(conversation, list(queries), k=k, method=method, evidence=evidence,
                         device=device, question_date=question_date, **settings)
    for q, r in zip(queries, results):
        if as_json:
            click.echo(safe_json(json.dumps({"query": q, **r.to_dict()},
                                            ensure_ascii=False, allow_nan=False)))
            continue
        click.echo(f"? {safe_text(q)}")
        for rank, (sid, sc, ev) in enumerate(zip(r.session_ids, r.scores, r.evidence), 1):
            click.echo(f"  {rank}. {safe_text(sid)}  {sc:.4f}")
            for t, text, s in ev:
                one = " ".join((text or "").split())
                click.echo(f"       turn {t} ({s:.3f}): {safe_text(one[:160])}")
