"""``memgas stats PATH``."""
from __future__ import annotations

import json

import click

from ..stats import dataset_stats
from ._common import dataset_options, load


@click.command("stats")
@click.argument("path", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@dataset_options
def stats(path: str, as_json: bool, fmt: str, empty_sessions: str, user_only: bool,
          conversations, exclude_conversations) -> None:
    """Print conversations, sessions, turns, tokens and questions of a dataset."""
    ds = load(path, fmt, empty_sessions, user_only, conversations, exclude_conversations)
    st = dataset_stats(ds)
    if as_json:
        click.echo(json.dumps({"path": path, "format": ds.format, **st.as_dict()}, indent=2,
                              allow_nan=False))
        return
    rows = [
        ("format", ds.format),
        ("conversations", st.conversations),
        ("sessions (total)", st.sessions_total),
        ("sessions (distinct)", st.sessions_distinct),
        ("turns (total)", st.turns_total),
        ("turns (distinct)", st.turns_distinct),
        ("approx. tokens (total)", st.approx_tokens_total),
        ("approx. tokens (distinct)", st.approx_tokens_distinct),
        ("approx. tokens per conversation",
         st.approx_tokens_total // max(st.conversations, 1)),
        ("questions", st.questions),
        ("abstention questions", st.abstentions),
        ("questions without evidence", st.questions_without_evidence),
    ]
    width = max(len(r[0]) for r in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v:,}" if isinstance(v, int) else f"{k:<{width}}  {v}")
    click.echo("questions per type:")
    for t, n in st.questions_per_type.items():
        click.echo(f"  {t:<{width - 2}}  {n:,}")
