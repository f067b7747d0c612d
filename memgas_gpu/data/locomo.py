"""LoCoMo: the official ``locomo10.json`` list layout and flat per-conversation files.

List layout: ``[{sample_id, conversation: {speaker_a, speaker_b, session_N: [...],
session_N_date_time}, qa: [...], session_summary: {session_N_summary}, ...}]``.
Flat layout (the repository's zip): one JSON object per conversation with the
``conversation`` keys, ``qa`` and ``session_N_summary`` at top level; its id is
taken from ``sample_id`` when present, else ``conv-<file stem>`` (``26.json`` →
``conv-26``, the id the list layout uses).

Reference semantics (MemGAS ``dataprocess.py``): messages render as
``[speaker]: text`` (+ ``"\\n The image Caption: {blip_caption}"``), merged in pairs;
sessions in numeric order, only those with content; the answer is
``adversarial_answer`` when present; evidence ``D3:5`` → ``session_3`` and an entry
that does not parse (e.g. ``"D8:6; D9:17"``) is skipped, as the reference does.
Evidence turns (``Question.evidence_turn_ids``): every ``D<n>:<m>`` in an entry (both
parts of ``"D8:6; D9:17"``) → the message with that ``dia_id`` (``"session_<n>:<j>"``,
``j`` its 0-based position; ``m - 1`` when no message carries that ``dia_id``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .formats import DatasetFormat, LoadOptions, json_records, register_format
from .model import Conversation, Question, Session, first_lengths, pair_messages
from ._validate import RecordContext, as_text

__all__ = ["parse_locomo_record", "LOCOMO_CATEGORIES", "locomo_summaries"]

#: LoCoMo's numeric QA categories, named as in the LoCoMo evaluation code.
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                     5: "adversarial"}

_SESSION_KEY = re.compile(r"^session_(\d{1,9})$")
_EVIDENCE = re.compile(r"^D(\d+):(\d+)$")
_DIA = re.compile(r"D(\d+):(\d+)")


def _evidence_turns(item, dia: dict) -> list[str]:
    """``"D3:5"`` → ``["session_3:4"]`` (through the ``dia_id`` map when it knows it)."""
    if not isinstance(item, str):
        return []
    return [dia.get(f"D{int(n)}:{int(m)}", f"session_{int(n)}:{int(m) - 1}")
            for n, m in _DIA.findall(item)]


def _evidence_session(item) -> Optional[str]:
    """``"D3:5"`` → ``"session_3"``; None for entries the reference skips."""
    if not isinstance(item, str):
        return None
    m = _EVIDENCE.match(item.strip())
    return f"session_{int(m.group(1))}" if m else None


def _conversation_part(ctx: RecordContext, rec: dict, flat: bool) -> dict:
    if flat:
        return rec
    return ctx.get(rec, "conversation", dict)


def locomo_summaries(rec: dict, flat: bool) -> dict[str, str]:
    """LoCoMo's own per-session summaries: ``{"session_N": text}``."""
    src = rec if flat else rec.get("session_summary") or {}
    out: dict[str, str] = {}
    if not isinstance(src, dict):
        return out
    for k, v in src.items():
        m = re.match(r"^session_(\d+)_summary$", k)
        if m and isinstance(v, str):
            out[f"session_{int(m.group(1))}"] = v
    return out


def parse_locomo_record(ctx: RecordContext, rec, *, flat: bool, default_id: str = "",
                        empty_sessions: str = "error") -> Conversation:
    """One LoCoMo conversation (either layout) → Conversation."""
    if not isinstance(rec, dict):
        raise ctx.error(f"expected an object, got {type(rec).__name__}")
    cid = rec.get("sample_id", default_id)
    if not isinstance(cid, str) or not cid:
        raise ctx.error("missing or empty conversation id", "sample_id")
    ctx.record_id = cid
    conv = _conversation_part(ctx, rec, flat)
    if not flat:
        ctx.get(rec, "session_summary", dict, optional=True)
    keys: dict[int, str] = {}
    for k in conv:
        m = _SESSION_KEY.match(k)
        if m is None:
            continue
        n = int(m.group(1))
        if n in keys:  # session_01 beside session_1: one session id, two contents
            raise ctx.error(f"keys {keys[n]!r} and {k!r} both name session_{n}", k)
        keys[n] = k
    sessions: list[Session] = []
    dia: dict[str, str] = {}  # dia_id -> "session_id:message_index"
    for n in sorted(keys):
        key = keys[n]
        raw = conv[key]
        if not isinstance(raw, list):
            raise ctx.error(f"expected a list of dialogue turns, got {type(raw).__name__}", key)
        messages = []
        for j, d in enumerate(raw):
            speaker = ctx.get(d, "speaker", str, field=f"{key}[{j}].speaker")
            text = ctx.get(d, "text", str, field=f"{key}[{j}].text")
            msg = f"[{speaker}]: {text}"
            if "blip_caption" in d:
                msg += f"\n The image Caption: {d['blip_caption']}"
            messages.append(msg)
            if isinstance(d.get("dia_id"), str):
                dia.setdefault(d["dia_id"].strip(), f"session_{n}:{j}")
        if not messages:
            if empty_sessions == "error":
                raise ctx.error("empty session (pass empty_sessions='keep' or 'drop')", key)
            if empty_sessions == "drop":
                continue
        date = as_text(conv.get(f"{key}_date_time", conv.get(f"session_{n}_date_time", "")))
        sessions.append(Session(f"session_{n}", date, pair_messages(messages),
                                first_lengths(messages)))
    if not sessions:
        raise ctx.error("no sessions found", "conversation" if not flat else "session_1")
    questions = []
    qa = ctx.get(rec, "qa", list, optional=True, default=[])
    for i, q in enumerate(qa):
        qctx = RecordContext(ctx.path, ctx.record, cid)
        qf = f"qa[{i}]"
        text = qctx.get(q, "question", str, field=f"{qf}.question")
        if "adversarial_answer" in q:
            answer = q["adversarial_answer"]
        elif "answer" in q:
            answer = q["answer"]
        else:
            raise qctx.error("missing required field", f"{qf}.answer")
        evidence = qctx.get(q, "evidence", list, field=f"{qf}.evidence", optional=True,
                            default=[])
        gold = [s for s in map(_evidence_session, evidence) if s is not None]
        category = q.get("category")
        if category is not None and not isinstance(category, (int, str)):
            raise qctx.error(f"expected a number or a string, got {type(category).__name__}",
                             f"{qf}.category")
        qtype = LOCOMO_CATEGORIES.get(category, as_text(category))
        questions.append(Question(
            id=f"{cid}_q{i}", text=text, type=qtype, date="", answer=as_text(answer),
            evidence_session_ids=tuple(dict.fromkeys(gold)), is_abstention=False,
            evidence_turn_ids=tuple(dict.fromkeys(
                t for e in evidence for t in _evidence_turns(e, dia))),
        ))
    return Conversation(cid, sessions, questions, source_summaries=locomo_summaries(rec, flat))


def flat_default_id(path: Path) -> str:
    stem = path.stem
    return f"conv-{stem}" if stem.isdigit() else stem


def _list_record(ctx: RecordContext, rec, path: Path, opts: LoadOptions) -> Conversation:
    return parse_locomo_record(ctx, rec, flat=False, empty_sessions=opts.empty_sessions)


def _flat_record(ctx: RecordContext, rec, path: Path, opts: LoadOptions) -> Conversation:
    return parse_locomo_record(ctx, rec, flat=True, default_id=flat_default_id(path),
                               empty_sessions=opts.empty_sessions)


register_format(DatasetFormat("locomo", json_records(_list_record),
                              keys=("sample_id", "conversation", "qa"), as_object="locomo_flat"))
register_format(DatasetFormat("locomo_flat", json_records(_flat_record, one_object=True),
                              keys=("speaker_a", "session_1"), family="locomo"))
