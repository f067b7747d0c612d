"""``memgas answer`` (filter + answer generation) and ``memgas qa-eval`` (QA metrics)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .. import __version__
from .._io import atomic_write, nan_to_null
from ._common import (TEXT_SOURCES, PathArg, check_out_file, dataset_options, info, load,
                      quiet_option, text_source_callback)
from .expand import llm_options, make_client, pop_llm_options, report_client


def _evaluate(ds, hyps, judge, source, out) -> None:
    from ..llm import qa_items
    from ..qa_metrics import format_qa_table, qa_report

    try:
        items = qa_items(ds, hyps, judge, source=source)
    finally:
        if judge is not None:
            report_client(judge)
    report = qa_report(items)
    click.echo(format_qa_table(report))
    if out:
        with atomic_write(out, "w", encoding="utf-8") as f:
            json.dump(nan_to_null({"memgas_gpu": __version__, "hypotheses": source,
                                   "judge": None if judge is None
                                   else judge.config.describe(), **report,
                                   "verdicts": {it.question_id: it.verdict for it in items}
                                   if judge is not None else {}}), f, indent=2,
                      allow_nan=False)
        info(f"wrote {out}")


@click.command("answer")
@click.argument("data", type=PathArg(exists=True, dir_okay=False))
@click.option("--retrieval", required=True, type=PathArg(exists=True, dir_okay=False),
              help="Retrieval log from `memgas eval --out`.")
@click.option("--top-k", type=click.IntRange(1), default=5, show_default=True,
              help="Retrieved sessions per question.")
@click.option("--summaries", default=None, metavar="SRC",
              callback=text_source_callback(*TEXT_SOURCES),
              help="Summaries shown with each session: a MemGAS .jsonl file, 'source' or "
                   "'offline' [default: none].")
@click.option("--keywords", default=None, metavar="SRC",
              callback=text_source_callback(*TEXT_SOURCES),
              help="Keywords shown with each session (as --summaries).")
@click.option("--no-filter", is_flag=True,
              help="Answer from the raw top-k sessions (ablation of the relevance filter).")
@click.option("--out", required=True, type=PathArg(dir_okay=False),
              help="Hypothesis JSONL: question_id, hypothesis, filtered_context, "
                   "retrieved_session_ids.")
@click.option("--judge", is_flag=True, help="Also grade the answers with an LLM judge.")
@click.option("--judge-model", default=None, metavar="MODEL",
              help="Judge model [default: --llm-model].")
@click.option("--metrics-out", type=PathArg(dir_okay=False), default=None,
              help="QA metrics JSON [default: OUT with suffix .qa.json].")
@dataset_options
@llm_options()
@quiet_option
def answer(data, retrieval, top_k, summaries, keywords, no_filter, out, judge, judge_model,
           metrics_out, fmt, empty_sessions, user_only, conversations,
           exclude_conversations, **opts) -> None:
    """Answer the questions of a retrieval log from their top-k sessions.

    The paper's pipeline: relevance filter over the retrieved sessions (with their
    summaries and keywords), then a concise answer given the question date. Prints
    token F1, BLEU-4, ROUGE (and judge accuracy with --judge) per question type.
    """
    from ..llm import answer_questions, load_retrieval_log, write_hypotheses

    metrics_out = metrics_out or str(Path(out).with_suffix(".qa.json"))
    check_out_file(out)
    check_out_file(metrics_out, "--metrics-out")
    llm = pop_llm_options(opts)
    client = make_client(llm)
    ds = load(data, fmt, empty_sessions, user_only, conversations, exclude_conversations)
    log = load_retrieval_log(retrieval)
    info(f"answering {len(log)} questions from their top-{top_k} sessions with "
         f"{client.config.model}" + (" (no filter)" if no_filter else ""))
    try:
        records = answer_questions(ds, log, client, top_k=top_k, summaries=summaries,
                                   keywords=keywords, use_filter=not no_filter,
                                   log_path=retrieval)
    finally:
        report_client(client)
    write_hypotheses(records, out)
    info(f"wrote {out}")
    judge_client = None
    if judge:
        judge_client = client if not judge_model else make_client(llm, model=judge_model)
        judge_client.stats = type(client.stats)()  # report the judge's own counts
    hyps = {r["question_id"]: r["hypothesis"] for r in records}
    try:
        _evaluate(ds, hyps, judge_client, str(out), metrics_out)
    finally:
        for c in {id(c): c for c in (client, judge_client) if c is not None}.values():
            c.close()


@click.command("qa-eval")
@click.argument("hypotheses", type=PathArg(exists=True, dir_okay=False))
@click.argument("data", type=PathArg(exists=True, dir_okay=False))
@click.option("--out", type=PathArg(dir_okay=False), default=None,
              help="Write the metrics (overall, per type, verdicts) as JSON.")
@dataset_options
@llm_options(model_flag="--judge-model", required=False)
@quiet_option
def qa_eval(hypotheses, data, out, fmt, empty_sessions, user_only, conversations,
            exclude_conversations, **opts) -> None:
    """Score a hypothesis JSONL against DATA: token F1, EM, BLEU-4, ROUGE-1/2/L, and
    LLM-judge accuracy when --judge-model is given, per question type."""
    from ..llm import load_hypotheses

    check_out_file(out)
    llm = pop_llm_options(opts)
    judge = make_client(llm) if llm["llm_model"] else None
    ds = load(data, fmt, empty_sessions, user_only, conversations, exclude_conversations)
    try:
        _evaluate(ds, load_hypotheses(hypotheses), judge, str(hypotheses), out)
    finally:
        if judge is not None:
            judge.close()
