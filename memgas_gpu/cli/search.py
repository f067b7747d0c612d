"""``memgas search IDX --conversation ID "question" [...]``: ask an index new questions."""
from __future__ import annotations

import json

import click

from ._common import parse_settings
from .eval import METHODS


@click.command("search")
@click.argument("index_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("queries", nargs=-1, required=True)
@click.option("--conversation", "conversation", required=True,
              help="Conversation id to search (see `memgas stats`).")
@click.option("--k", type=click.IntRange(1), default=5, show_default=True,
              help="Sessions returned per question.")
@click.option("--method", type=click.Choice(METHODS), default="memgas_hybrid",
              show_default=True, help="Retrieval method.")
@click.option("--evidence", type=click.IntRange(0), default=2, show_default=True,
              help="Best-matching turns shown per session.")
@click.option("--set", "set_specs", multiple=True, metavar="KEY=VALUE",
              help="Any read-path setting (repeat), e.g. --set time_beta=0.")
@click.option("--date", "question_date", default=None,
              help="When the questions are asked (anchors 'last week' for the time cue).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per question.")
@click.option("--device", default=None, help="cpu or cuda (default: cuda if available).")
def search(index_dir, queries, conversation, k, method, evidence, set_specs, question_date,
           as_json, device) -> None:
    """Rank the sessions of one conversation for new QUERIES (encoded with the index's
    own encoder)."""
    from ..retrieve import MemoryIndex

    idx = MemoryIndex.load(index_dir)
    if conversation not in {c.id for c in idx.conversations}:
        raise click.BadParameter(f"no conversation {conversation!r} in {index_dir}",
                                 param_hint="--conversation")
    results = idx.search(conversation, list(queries), k=k, method=method, evidence=evidence,
                         device=device, question_date=question_date,
                         **parse_settings(set_specs))
    for q, r in zip(queries, results):
        if as_json:
            click.echo(json.dumps({"query": q, **r.to_dict()}, ensure_ascii=False,
                                  allow_nan=False))
            continue
        click.echo(f"? {q}")
        for rank, (sid, sc, ev) in enumerate(zip(r.session_ids, r.scores, r.evidence), 1):
            click.echo(f"  {rank}. {sid}  {sc:.4f}")
            for t, text, s in ev:
                one = " ".join((text or "").split())
                click.echo(f"       turn {t} ({s:.3f}): {one[:160]}")
