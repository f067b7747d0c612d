"""``memgas stats PATH``: what a dataset file or an index folder holds, and its
conversation ids (what ``memgas search --conversation`` and ``--conversations`` take)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .._display import safe_json, safe_text
from ._common import PathArg, dataset_options, load, quiet_option


@click.command("stats")
@click.argument("path", type=PathArg(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@dataset_options
@quiet_option
def stats(path: str, as_json: bool, fmt: str, empty_sessions: str, user_only: bool,
          conversations, exclude_conversations) -> None:
    """Print conversations (with their ids), sessions, turns, tokens and questions of a
    dataset, or what an index folder holds."""
    if (Path(path) / "manifest.json").exists():
        if conversations or exclude_conversations:
            raise click.UsageError("--conversations / --exclude-conversations select "
                                   "conversations of a dataset, not of an index folder")
        return _index_stats(path, as_json)
    from ..stats import dataset_stats

    ds = load(path, fmt, empty_sessions, user_only, conversations, exclude_conversations)
    st = dataset_stats(ds)
    per = [{"id": c.id, "sessions": len(c.sessions), "questions": len(c.questions)}
           for c in ds]
    if as_json:
        click.echo(safe_json(json.dumps({"path": path, "kind": "dataset",
                                         "format": ds.format, **st.as_dict(),
                                         "conversation_ids": [c["id"] for c in per],
                                         "by_conversation": per}, indent=2,
                                        allow_nan=False, ensure_ascii=False)))
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
    width = _rows(rows)
    click.echo("questions per type:")
    for t, n in st.questions_per_type.items():
        click.echo(f"  {safe_text(t):<{width - 2}}  {n:,}")
    _conversation_table(per)


def _index_stats(path: str, as_json: bool) -> None:
    from ..retrieve import MemoryIndex

    idx = MemoryIndex.load(path)
    counts = [0] * len(idx.conversations)
    for c in idx.q_conv.tolist():
        counts[int(c)] += 1
    per = [{"id": c.id, "sessions": len(c.session_ids), "questions": n}
           for c, n in zip(idx.conversations, counts)]
    cfg = idx.config or {}
    encoder = cfg.get("encoder") or {}
    expansion = cfg.get("expansion") or {}
    summaries = expansion.get("summaries")
    if isinstance(summaries, dict):
        summaries = summaries.get("method")
    doc = {"path": path, "kind": "index", "conversations": len(per),
           "sessions": sum(c["sessions"] for c in per), "questions": len(idx.questions),
           "encoder": encoder.get("model"), "summaries": summaries,
           "conversation_ids": [c["id"] for c in per], "by_conversation": per}
    if as_json:
        click.echo(safe_json(json.dumps(doc, indent=2, allow_nan=False, ensure_ascii=False,
                                        default=str)))
        return
    _rows([("index folder", path), ("encoder", doc["encoder"] or "(not recorded)"),
           ("summaries", doc["summaries"] or "(not recorded)"),
           ("conversations", doc["conversations"]), ("sessions", doc["sessions"]),
           ("questions", doc["questions"])])
    _conversation_table(per)


def _rows(rows) -> int:
    width = max(len(r[0]) for r in rows)
    for k, v in rows:  # values can come from the data (a format, an encoder name)
        click.echo(f"{k:<{width}}  {v:,}" if isinstance(v, int) else
                   f"{k:<{width}}  {safe_text(v)}")
    return width


def _conversation_table(per: list) -> None:
    """One line per conversation: its id (control characters escaped: one row each),
    sessions and questions."""
    if not per:
        return
    ids = [safe_text(c["id"]) for c in per]
    w = max(len("conversation id"), max(map(len, ids)))
    click.echo(f"{'conversation id':<{w}}  {'sessions':>8}  {'questions':>9}")
    for cid, c in zip(ids, per):
        click.echo(f"{cid:<{w}}  {c['sessions']:>8,}  {c['questions']:>9,}")
