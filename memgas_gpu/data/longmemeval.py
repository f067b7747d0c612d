"""LongMemEval (``longmemeval_s/m/oracle.json``), loaded incrementally.

``longmemeval_m.json`` is ~2.7 GB; ``json.load`` of it needs far more memory than a
24 GB machine has.  We stream one instance at a time with ijson and intern every
session by ``(id, content)``: the same session recurs in many haystacks and is then
one shared :class:`Session` object (and one unit of downstream work).

Reference semantics (MemGAS ``dataprocess.py``): messages render as
``[role]: content``, merged in pairs; session ids drop the ``answer_`` prefix; ids
ending in ``_abs`` are abstention questions.  Gold sessions come from the
instance's ``answer_session_ids`` (prefix dropped, de-duplicated, order kept);
when that field is absent they are derived from ``has_answer`` flags, as the
reference does.  Evidence turns are the messages flagged ``has_answer``
(``"session_id:message_index"``, indices after the ``user_only`` filter).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import IO, Callable, Iterator, Optional

from ..errors import DataFormatError
from ..progress import Progress
from .formats import DatasetFormat, LoadOptions, first_char, open_json, register_format
from .model import Conversation, Question, Session, first_lengths, pair_messages
from ._validate import RecordContext, as_text, one_line

__all__ = ["iter_longmemeval", "load_longmemeval", "strip_answer_prefix", "SessionInterner"]

log = logging.getLogger("memgas_gpu.data")


def strip_answer_prefix(session_id: str) -> str:
    return session_id[len("answer_"):] if session_id.startswith("answer_") else session_id


class SessionInterner:
    """Share session content across conversations.

    One ``turns`` tuple per distinct (id, content), and one ``Session`` object per
    distinct (id, date, content): haystacks may date the same session differently.
    """

    def __init__(self) -> None:
        self._turns: dict[tuple[str, str], tuple[str, ...]] = {}
        self._sessions: dict[tuple[str, str, int], Session] = {}
        self._strings: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._turns)

    def intern(self, session: Session) -> Session:
        turns = self._turns.setdefault((session.id, session.content_key), session.turns)
        key = (session.id, session.date, id(turns))
        found = self._sessions.get(key)
        if found is None:
            found = self._sessions[key] = Session(session.id, session.date, turns,
                                                  session.first_lengths)
        return found

    def string(self, s: str) -> str:
        return self._strings.setdefault(s, s)


def _parse_session(ctx: RecordContext, raw, index: int, sid: str, date: str,
                   interner: SessionInterner, empty_sessions: str
                   ) -> tuple[Optional[Session], list[int]]:
    """Parse one session; returns (session or None if dropped, has_answer message
    indices)."""
    field = f"haystack_sessions[{index}]"
    if not isinstance(raw, list):
        raise ctx.error(f"expected a list of messages, got {type(raw).__name__}", field)
    messages, flagged = [], []
    for j, msg in enumerate(raw):
        mfield = f"{field}[{j}]"
        role = ctx.get(msg, "role", str, field=f"{mfield}.role")
        content = ctx.get(msg, "content", str, field=f"{mfield}.content")
        messages.append(f"[{role}]: {content}")
        if msg.get("has_answer", False):
            flagged.append(j)
    if not messages:
        if empty_sessions == "error":
            raise ctx.error(f"empty session {sid!r} (pass empty_sessions='keep' or 'drop' "
                            "to accept it)", field)
        if empty_sessions == "drop":
            return None, flagged
    return interner.intern(Session(sid, date, pair_messages(messages),
                                   first_lengths(messages))), flagged


def parse_instance(ctx: RecordContext, inst, interner: SessionInterner,
                   empty_sessions: str = "error", user_only: bool = False) -> Conversation:
    """One LongMemEval instance → one Conversation with one Question."""
    if not isinstance(inst, dict):
        raise ctx.error(f"expected an object, got {type(inst).__name__}")
    qid = ctx.get(inst, "question_id", str)
    ctx.record_id = qid
    ids = ctx.get(inst, "haystack_session_ids", list)
    dates = ctx.get(inst, "haystack_dates", list, optional=True, default=None)
    sessions_raw = ctx.get(inst, "haystack_sessions", list)
    if len(ids) != len(sessions_raw):
        raise ctx.error(f"{len(ids)} ids but {len(sessions_raw)} sessions", "haystack_session_ids")
    if dates is not None and len(dates) != len(ids):
        raise ctx.error(f"{len(dates)} dates but {len(ids)} sessions", "haystack_dates")
    sessions: list[Session] = []
    by_id: dict[str, tuple[int, Session]] = {}
    derived_gold: list[str] = []
    gold_turns: list[str] = []
    for i, raw in enumerate(sessions_raw):
        rid = ids[i]
        if not isinstance(rid, str):
            raise ctx.error(f"expected a string, got {type(rid).__name__}",
                            f"haystack_session_ids[{i}]")
        sid = interner.string(strip_answer_prefix(rid))
        date = interner.string(as_text(dates[i])) if dates is not None else ""
        if user_only and isinstance(raw, list):
            raw = [m for m in raw if isinstance(m, dict) and m.get("role") == "user"]
        s, flagged = _parse_session(ctx, raw, i, sid, date, interner, empty_sessions)
        if flagged:
            derived_gold.append(sid)
        if s is None:
            continue
        first, prev = by_id.get(sid, (i, None))
        if prev is None:
            by_id[sid] = (i, s)
            sessions.append(s)
            gold_turns += [f"{sid}:{j}" for j in flagged]
        elif prev.turns is s.turns or prev.turns == s.turns:
            # the same session listed twice: one haystack position, so metrics count it once
            log.warning("%s: record %s (id %r): session %r listed twice with the same "
                        "content; the repeat is dropped", ctx.path, ctx.record, qid, sid)
        else:
            raise ctx.error(f"session id {sid!r} used twice with different content "
                            f"(positions {first} and {i}; ids are compared without "
                            "the answer_ prefix)", f"haystack_session_ids[{i}]")
    gold_raw = inst.get("answer_session_ids")
    if gold_raw is None:
        gold = derived_gold
    else:
        if not isinstance(gold_raw, list) or not all(isinstance(g, str) for g in gold_raw):
            raise ctx.error("expected a list of strings", "answer_session_ids")
        gold = [strip_answer_prefix(g) for g in gold_raw]
    question = Question(
        id=qid,
        text=ctx.get(inst, "question", str),
        type=as_text(inst.get("question_type", "")),
        date=as_text(inst.get("question_date", "")),
        answer=as_text(inst.get("answer", "")),
        evidence_session_ids=tuple(dict.fromkeys(gold)),
        is_abstention=qid.endswith("_abs"),
        evidence_turn_ids=tuple(dict.fromkeys(gold_turns)),
    )
    return Conversation(qid, sessions, [question])


def iter_longmemeval(f: IO[bytes], path: str, *, interner: Optional[SessionInterner] = None,
                     empty_sessions: str = "error", user_only: bool = False,
                     on_record: Optional[Callable[[int], None]] = None) -> Iterator[Conversation]:
    """Yield conversations from an open LongMemEval file without loading it whole."""
    import ijson

    interner = interner if interner is not None else SessionInterner()
    index = -1
    try:
        for index, inst in enumerate(ijson.items(f, "item", use_float=True)):
            yield parse_instance(RecordContext(path, index), inst, interner,
                                 empty_sessions, user_only)
            if on_record is not None:
                on_record(f.tell() if hasattr(f, "tell") else index)
    except ijson.JSONError as e:
        raise RecordContext(path, index + 1).error(f"invalid or truncated JSON ({one_line(e)})") \
            from None
    except UnicodeDecodeError as e:  # invalid UTF-8, or a lone surrogate escape
        raise RecordContext(path, index + 1).error(f"not UTF-8 text ({e.reason})") from None


def load_longmemeval(path: Path, opts: LoadOptions) -> list[Conversation]:
    """Every instance of a LongMemEval file, streamed (a progress bar over its bytes)."""
    if first_char(path) != "[":
        raise DataFormatError(str(path), "expected a JSON list of LongMemEval instances")
    bar = Progress(path.stat().st_size, f"load {path.name}", unit="B", unit_scale=True,
                   leave=False, enabled=bool(opts.progress))
    with open_json(path) as f, bar:
        last = [0]

        def tick(pos: int) -> None:
            bar.update(pos - last[0])
            last[0] = pos

        return list(iter_longmemeval(f, str(path), interner=opts.interner,
                                     empty_sessions=opts.empty_sessions,
                                     user_only=opts.user_only, on_record=tick))


register_format(DatasetFormat(
    "longmemeval", load_longmemeval,
    keys=("question_id", "haystack_sessions", "haystack_session_ids", "question_type")))
