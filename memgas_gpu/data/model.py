"""The one internal data model every source loads into.

``Dataset`` → ``Conversation(id, sessions, questions)`` → ``Session(id, date, turns)``
and ``Question(...)``.  Turn text already follows the reference rules (docs/algorithm.md
"Data"): each message is rendered ``[role]: content`` and consecutive messages are
merged in pairs into one turn, so ``Session.text`` is ``"\\n".join(turns)``.

Sessions are immutable.  A session recurring across haystacks (LongMemEval) keeps
one shared ``turns`` tuple (and one ``Session`` object when its date is the same
too), so memory holds its text once; :attr:`Session.key` ``(id, turns)`` identifies
its content, and downstream work (summaries, encoding, the embedding table) is done
once per distinct key.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence, Union

__all__ = ["Session", "Question", "Conversation", "Dataset", "pair_messages", "first_lengths",
           "per_session",
           "render_message"]


def pair_messages(messages: Sequence[str]) -> tuple[str, ...]:
    """Merge consecutive rendered messages in pairs: ``msg0 + "\\n" + msg1``.

    An odd trailing message stays a turn of its own (the reference's behaviour).
    """
    return tuple(
        "\n".join(messages[i : i + 2]) for i in range(0, len(messages), 2)
    )


def first_lengths(messages: Sequence[str]) -> tuple[int, ...]:
    """Length of each turn's first message (see :attr:`Session.messages`): what it takes,
    beside the turns, to recover the messages (a message may itself contain newlines)."""
    return tuple(len(messages[i]) for i in range(0, len(messages), 2))


#: a rendered message: ``[role]: content`` (role without ``]`` or a newline)
_RENDERED = re.compile(r"\[[^\]\n]+\]: ", re.S)


def per_session(n: int, **values) -> dict:
    """The per-session arguments of a batch of ``n`` sessions (``summaries=``,
    ``keywords=``, ``metadata=`` of ``add_sessions``), each a list of ``n`` (None: ``n``
    Nones), or a ValueError naming the one of another length."""
    out = {}
    for name, got in values.items():
        got = [None] * n if got is None else list(got)
        if len(got) != n:
            raise ValueError(f"{name}: {len(got)} values for {n} sessions")
        out[name] = got
    return out


def render_message(message: Union[Mapping, str], where: str = "message") -> str:
    """One message as the loaders render it: ``{"role": r, "content": c}`` →
    ``"[r]: c"``; a string already in that form is returned as it is.

    Raises:
        TypeError / ValueError: naming ``where`` and what is wrong.
    """
    if isinstance(message, str):
        if not _RENDERED.match(message):
            raise ValueError(f"{where}: a string message must look like '[role]: content', "
                             f"got {message[:40]!r}")
        return message
    if not isinstance(message, Mapping):
        raise TypeError(f"{where}: expected a {{'role', 'content'}} dict or a "
                        f"'[role]: content' string, got {type(message).__name__}")
    for key in ("role", "content"):
        if not isinstance(message.get(key), str):
            got = "missing" if key not in message else type(message[key]).__name__
            raise TypeError(f"{where}: {key!r} must be a string ({got})")
    role = message["role"]
    if not role.strip() or "]" in role or "\n" in role:
        raise ValueError(f"{where}: role {role!r} must be non-empty, without ']' or a newline")
    return f"[{role}]: {message['content']}"


@dataclass(frozen=True, eq=False)
class Session:
    """One chat session.

    Attributes:
        id: session id (LongMemEval's ``answer_`` prefix already dropped).
        date: the session's timestamp string as given by the source ("" if none).
        turns: turn texts (pairs of rendered messages, see :func:`pair_messages`).
        first_lengths: length of each turn's first message (:func:`first_lengths`), so
            that :attr:`messages` can split the turns again; ``()`` when the source has
            no message structure (then every turn is one message).
    """

    id: str
    date: str
    turns: tuple[str, ...]
    first_lengths: tuple[int, ...] = ()

    @property
    def messages(self) -> tuple[str, ...]:
        """The rendered messages (utterances) ``[role]: content``, in order.

        Recovered from :attr:`turns` and :attr:`first_lengths`; a session loaded without
        message structure (``first_lengths == ()``) returns its turns."""
        if not self.first_lengths:
            return self.turns
        out: list[str] = []
        for t, n in zip(self.turns, self.first_lengths):
            out.append(t[:n])
            if n < len(t):
                out.append(t[n + 1:])
        return tuple(out)

    @classmethod
    def from_messages(cls, id: str, date: Union[str, _dt.date],
                      messages: Iterable[Union[Mapping, str]]) -> "Session":
        """A session from chat messages, rendered and paired exactly as the loaders do.

        Args:
            id: session id (unique within its conversation).
            date: when the session took place: a string (any format python-dateutil
                reads, e.g. ``"2024-05-01"`` or LoCoMo's ``"1:56 pm on 8 May, 2023"``;
                ``""`` for none) or a ``datetime.date`` / ``datetime.datetime``.
            messages: in order; each a ``{"role": ..., "content": ...}`` dict (what chat
                APIs and mem0 take; other keys are ignored) or a string already
                rendered ``"[role]: content"`` (what :attr:`messages` returns).

        Raises:
            TypeError / ValueError: one line naming the bad argument or message; no
            message at all is an error too (an empty session has nothing to find).
        """
        if not isinstance(id, str) or not id:
            raise TypeError(f"session id must be a non-empty string, got {id!r}")
        if isinstance(date, _dt.date):
            date = date.isoformat()
        if not isinstance(date, str):
            raise TypeError(f"session {id!r}: date must be a string or a datetime.date, got "
                            f"{type(date).__name__}")
        if isinstance(messages, (str, bytes, Mapping)):
            raise TypeError(f"session {id!r}: messages must be a list of messages, got "
                            f"{type(messages).__name__}")
        rendered = [render_message(m, f"session {id!r}: message {i}")
                    for i, m in enumerate(messages)]
        if not rendered:
            raise ValueError(f"session {id!r}: no messages")
        return cls(id, date, pair_messages(rendered), first_lengths(rendered))

    @property
    def text(self) -> str:
        """The session text S: turns joined by newlines."""
        return "\n".join(self.turns)

    @property
    def key(self) -> tuple:
        """Content identity ``(id, turns)``: equal for the same session in any haystack,
        whatever its date there (cheap to hash: strings cache their hashes)."""
        return (self.id, self.turns)

    @property
    def content_key(self) -> str:
        """A stable hash of (id, turns) used to share/dedupe sessions."""
        h = hashlib.blake2b(digest_size=16)
        h.update(self.id.encode())
        for t in self.turns:
            h.update(b"\x00")
            h.update(t.encode())
        return h.hexdigest()


@dataclass(frozen=True)
class Question:
    """One question asked at the end of a conversation.

    Attributes:
        id: question id (``*_abs`` marks LongMemEval abstention questions).
        text: the question.
        type: question type (LongMemEval ``question_type``; LoCoMo category name).
        date: question date string ("" if none).
        answer: the gold answer as a string.
        evidence_session_ids: ids of the gold sessions (may be empty).
        evidence_turn_ids: the gold messages as ``"session_id:message_index"`` (0-based
            index into :attr:`Session.messages`; LoCoMo ``D3:5`` → ``"session_3:4"``,
            LongMemEval messages flagged ``has_answer``); may be empty.
        is_abstention: True for LongMemEval's abstention questions (``*_abs``), which
            have no gold session and are left out of the retrieval metrics. LoCoMo's
            adversarial questions (category 5) have gold sessions and are counted.
    """

    id: str
    text: str
    type: str = ""
    date: str = ""
    answer: str = ""
    evidence_session_ids: tuple[str, ...] = ()
    is_abstention: bool = False
    evidence_turn_ids: tuple[str, ...] = ()


@dataclass
class Conversation:
    """A history of sessions (in chronological order) and the questions about it."""

    id: str
    sessions: list[Session]
    questions: list[Question] = field(default_factory=list)
    #: summaries shipped with the source (LoCoMo's ``session_summary``), by session id
    source_summaries: dict[str, str] = field(default_factory=dict)

    def session_index(self) -> dict[str, int]:
        """Map session id → position in ``sessions``."""
        return {s.id: i for i, s in enumerate(self.sessions)}


@dataclass
class Dataset:
    """A list of conversations plus where they came from."""

    conversations: list[Conversation]
    format: str = ""
    source: str = ""

    def __len__(self) -> int:
        return len(self.conversations)

    def __iter__(self) -> Iterator[Conversation]:
        return iter(self.conversations)

    def __getitem__(self, i: int) -> Conversation:
        return self.conversations[i]

    def get(self, conversation_id: str) -> Optional[Conversation]:
        for c in self.conversations:
            if c.id == conversation_id:
                return c
        return None

    def select(self, conversations: Optional[Iterable[str]] = None,
               exclude: Optional[Iterable[str]] = None) -> "Dataset":
        """A dataset with only the ``conversations`` ids (all when None), minus ``exclude``.

        Order follows the source. Sessions stay shared objects. Unknown ids raise
        ``ValueError`` naming them and the source, so that a typo never silently
        evaluates the wrong set.
        """
        ids = [c.id for c in self.conversations]
        known = set(ids)
        keep = None if conversations is None else list(dict.fromkeys(conversations))
        drop = list(dict.fromkeys(exclude or ()))
        missing = [i for i in (keep or []) + drop if i not in known]
        if missing:
            shown = ", ".join(ids[:8]) + (", …" if len(ids) > 8 else "")
            raise ValueError(f"{self.source or 'dataset'}: no conversation "
                             f"{', '.join(map(repr, missing))} (it has {len(ids)}: {shown})")
        wanted = known if keep is None else set(keep)
        wanted -= set(drop)
        return Dataset([c for c in self.conversations if c.id in wanted], format=self.format,
                       source=self.source)

    def distinct_sessions(self) -> list[Session]:
        """One Session per distinct content (:attr:`Session.key`), in first-seen order."""
        seen: dict[tuple, Session] = {}
        for c in self.conversations:
            for s in c.sessions:
                seen.setdefault(s.key, s)
        return list(seen.values())

    @property
    def questions(self) -> list[Question]:
        return [q for c in self.conversations for q in c.questions]
