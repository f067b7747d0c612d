"""Long-MT-Bench+: ``[{conversation_id, sessions, questions, answers}]``; no evidence.

Each session is already a list of turn strings (the reference passes them through
unchanged); sessions are named ``session_1..N`` and questions ``<id>_q<i>``.
"""
from __future__ import annotations

from pathlib import Path

from .formats import DatasetFormat, LoadOptions, json_records, register_format
from .model import Conversation, Question, Session
from ._validate import RecordContext, as_text

__all__ = ["parse_longmtbench_record"]


def parse_longmtbench_record(ctx: RecordContext, rec, empty_sessions: str = "error"
                             ) -> Conversation:
    if not isinstance(rec, dict):
        raise ctx.error(f"expected an object, got {type(rec).__name__}")
    cid = as_text(ctx.get(rec, "conversation_id", (str, int)))
    ctx.record_id = cid
    raw_sessions = ctx.get(rec, "sessions", list)
    sessions = []
    for i, s in enumerate(raw_sessions):
        f = f"sessions[{i}]"
        if isinstance(s, str):
            s = [s]
        if not isinstance(s, list) or not all(isinstance(t, str) for t in s):
            raise ctx.error("expected a list of turn strings", f)
        if not s:
            if empty_sessions == "error":
                raise ctx.error("empty session (pass empty_sessions='keep' or 'drop')", f)
            if empty_sessions == "drop":
                continue
        sessions.append(Session(f"session_{i + 1}", "", tuple(s)))
    qs = ctx.get(rec, "questions", list)
    answers = ctx.get(rec, "answers", list, optional=True, default=[])
    if answers and len(answers) != len(qs):
        raise ctx.error(f"{len(qs)} questions but {len(answers)} answers", "answers")
    questions = []
    for i, q in enumerate(qs):
        if not isinstance(q, str):
            raise ctx.error(f"expected a string, got {type(q).__name__}", f"questions[{i}]")
        questions.append(Question(id=f"{cid}_q{i}", text=q,
                                  answer=as_text(answers[i]) if answers else ""))
    return Conversation(cid, sessions, questions)


def _record(ctx: RecordContext, rec, path: Path, opts: LoadOptions) -> Conversation:
    return parse_longmtbench_record(ctx, rec, opts.empty_sessions)


register_format(DatasetFormat("longmtbench", json_records(_record),
                              keys=("conversation_id", "questions", "sessions")))
