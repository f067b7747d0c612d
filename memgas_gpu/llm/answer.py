"""After retrieval: the paper's relevance filter, then answer generation.

For each question of a retrieval log (``memgas eval --out``), the top-k retrieved
sessions — with their summary and keywords when given — go through the filter
prompt (keep only what is relevant to the question, original tokens preserved);
the filtered history and the question date go to the answer prompt. The output is
LongMemEval hypothesis JSONL: ``{"question_id", "hypothesis", ...}`` plus the
``filtered_context`` and the ``retrieved_session_ids`` used.

Difference from the reference script: it repeats the whole filter output once per
retrieved session under each session's date; here the filtered history is given
once (the filter keeps the ``### Session Date`` lines it finds relevant).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from .._io import atomic_write, iter_jsonl
from ..data.model import Conversation, Dataset, Session
from ..errors import DataFormatError
from ..expand.sources import resolve_source
from .client import ChatClient, ChatRequest
from .prompts import answer_prompt, filter_prompt, session_block

__all__ = ["RetrievedQuestion", "load_retrieval_log", "answer_questions",
           "write_hypotheses", "load_hypotheses"]


@dataclass(frozen=True)
class RetrievedQuestion:
    """One line of a retrieval log: the question and its ranked sessions."""

    question_id: str
    question: str
    question_date: str
    conversation_id: Optional[str]
    ranked: tuple  # ((corpus_id, timestamp), ...) best first


def _field(obj: dict, name: str, path, lineno: int, kind=str):
    v = obj.get(name)
    if not isinstance(v, kind):
        raise DataFormatError(str(path), f"expected {kind.__name__}, got "
                              f"{type(v).__name__}", record=f"line {lineno}", field=name)
    return v


def load_retrieval_log(path: Union[str, os.PathLike]) -> list[RetrievedQuestion]:
    """Read a LongMemEval-style retrieval log (one JSON object per line).

    Raises:
        DataFormatError: invalid JSON or a missing field (names the line).
    """
    out = []
    for lineno, obj in iter_jsonl(path):
        qid = _field(obj, "question_id", path, lineno)
        rr = _field(obj, "retrieval_results", path, lineno, dict)
        items = _field(rr, "ranked_items", path, lineno, list)
        ranked = []
        for it in items:
            if not isinstance(it, dict) or not isinstance(it.get("corpus_id"), str):
                raise DataFormatError(str(path), "ranked item without a corpus_id string",
                                      record=f"line {lineno}", record_id=qid)
            ranked.append((it["corpus_id"], str(it.get("timestamp") or "")))
        conv = obj.get("conversation_id")
        out.append(RetrievedQuestion(
            qid, str(obj.get("question") or rr.get("query") or ""),
            str(obj.get("question_date") or ""),
            None if conv is None else str(conv), tuple(ranked)))
    return out


def _locate(ds: Dataset, log: Sequence[RetrievedQuestion], path
            ) -> list[tuple[Conversation, object]]:
    """The conversation and dataset Question of every log entry."""
    convs = {c.id: c for c in ds}
    by_q = {q.id: (c, q) for c in ds for q in c.questions}
    out = []
    for r in log:
        if r.question_id not in by_q:
            raise DataFormatError(str(path), "question not in the dataset (wrong DATA?)",
                                  record_id=r.question_id)
        conv, q = by_q[r.question_id]
        if r.conversation_id is not None and r.conversation_id in convs:
            conv = convs[r.conversation_id]
        out.append((conv, q))
    return out


def _texts(spec, kind: str, needed: list[tuple[Session, Conversation]]) -> dict:
    if spec is None:
        return {}
    src = resolve_source(spec)
    texts = src.generate(kind, [s for s, _ in needed], [c for _, c in needed])
    return {(c.id, s.id): t for (s, c), t in zip(needed, texts)}


def answer_questions(ds: Dataset, log: Sequence[RetrievedQuestion], client: ChatClient,
                     top_k: int = 5, summaries=None, keywords=None, use_filter: bool = True,
                     log_path: str = "retrieval log") -> list[dict]:
    """Filter the top-k sessions of every question, then answer it.

    Args:
        ds: the dataset the log was retrieved from.
        log: from :func:`load_retrieval_log`.
        client: the chat client (cached; a rerun costs nothing).
        top_k: retrieved sessions used per question (default 5).
        summaries: a summary source (JSONL path, ``"source"``, ``"offline"``, an object)
            shown with each session in the filter prompt; None for none.
        keywords: the same for keywords.
        use_filter: False skips the filter (the ablation): the raw blocks are answered.
        log_path: named in errors.

    Returns:
        One record per question: ``question_id``, ``hypothesis``, ``filtered_context``,
        ``retrieved_session_ids``.

    Raises:
        DataFormatError: a question or retrieved session id not in ``ds``.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    located = _locate(ds, log, log_path)
    picks = []
    needed: dict[tuple, tuple[Session, Conversation]] = {}
    for r, (conv, _) in zip(log, located):
        index = {s.id: s for s in conv.sessions}
        chosen = []
        for sid, ts in r.ranked[:top_k]:
            s = index.get(sid)
            if s is None:
                raise DataFormatError(str(log_path), f"retrieved session {sid!r} is not in "
                                      f"conversation {conv.id!r} of the dataset",
                                      record_id=r.question_id)
            chosen.append((s, ts or s.date))
            needed.setdefault((conv.id, sid), (s, conv))
        picks.append(chosen)
    need = list(needed.values())
    summ = _texts(summaries, "summary", need)
    keyw = _texts(keywords, "keywords", need)

    contexts = []
    for r, (conv, q), chosen in zip(log, located, picks):
        blocks = [session_block(ts, s.text, summ.get((conv.id, s.id)),
                                keyw.get((conv.id, s.id))) for s, ts in chosen]
        contexts.append((r.question or q.text, r.question_date or q.date, blocks))
    if use_filter:
        filtered = client.map([ChatRequest.user(filter_prompt(*c), f"filter for question "
                                                f"{r.question_id!r}")
                               for r, c in zip(log, contexts)], desc="filter")
    else:
        filtered = ["".join(c[2]) for c in contexts]
    hyps = client.map([ChatRequest.user(answer_prompt(c[0], c[1], h),
                                        f"answer to question {r.question_id!r}")
                       for r, c, h in zip(log, contexts, filtered)], desc="answer")
    return [{"question_id": r.question_id, "hypothesis": h, "filtered_context": fc,
             "retrieved_session_ids": [s.id for s, _ in chosen]}
            for r, h, fc, chosen in zip(log, hyps, filtered, picks)]


def write_hypotheses(records: Sequence[dict], path: Union[str, os.PathLike]) -> None:
    """LongMemEval hypothesis JSONL, written atomically."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False, allow_nan=False) + "\n")


def load_hypotheses(path: Union[str, os.PathLike]) -> dict[str, str]:
    """``question_id → hypothesis`` from a hypothesis JSONL file.

    Raises:
        DataFormatError: invalid JSON, a missing field, or a repeated question id.
    """
    out: dict[str, str] = {}
    for lineno, obj in iter_jsonl(path):
        qid = _field(obj, "question_id", path, lineno)
        hyp = _field(obj, "hypothesis", path, lineno)
        if qid in out:
            raise DataFormatError(str(path), "repeated question id",
                                  record=f"line {lineno}", record_id=qid)
        out[qid] = hyp
    return out
