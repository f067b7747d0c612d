"""LLM summaries (U) and keywords (K): a source for ``expand_dataset`` and JSONL files.

:class:`LLMSource` plugs into :func:`memgas_gpu.expand.expand_dataset` (and so into
``MemoryIndex.build``); :func:`write_expansion_files` writes the MemGAS-style files
that ``memgas index --summaries FILE --keywords FILE`` reads. Work is done once per
distinct session (:attr:`Session.key`; identical prompts are sent once).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence, Union

from .._io import atomic_write
from ..data.model import Conversation, Dataset, Session
from ..expand.sources import reference_key
from .client import ChatClient, ChatRequest
from .prompts import expansion_prompt, prompts_fingerprint

__all__ = ["LLMSource", "dialogue_style", "expansion_paths", "write_expansion_files"]

_KINDS = ("summary", "keywords")


def dialogue_style(ds_or_format: Union[Dataset, str]) -> str:
    """``"user-user"`` for LoCoMo (two people talking), else ``"user-ai"``."""
    fmt = ds_or_format if isinstance(ds_or_format, str) else ds_or_format.format
    return "user-user" if fmt.startswith("locomo") else "user-ai"


def _label(kind: str, s: Session) -> str:
    return f"{kind} of session {s.id!r}"


class LLMSource:
    """Summaries and keywords from a chat model, with the paper's prompts.

    Args:
        client: the :class:`ChatClient` (its cache makes reruns free).
        dialogue: ``"user-ai"`` (default) or ``"user-user"`` (LoCoMo); see
            :func:`dialogue_style`.

    The object satisfies the ``TextSource`` protocol of :mod:`memgas_gpu.expand.sources`.
    """

    name = "llm"

    def __init__(self, client: ChatClient, dialogue: str = "user-ai") -> None:
        expansion_prompt("summary", [], dialogue)  # validates the style
        self.client = client
        self.dialogue = dialogue

    def config(self) -> dict:
        return {"method": self.name, **self.client.config.describe(),
                "dialogue": self.dialogue, "prompts": prompts_fingerprint()}

    def request(self, kind: str, session: Session) -> ChatRequest:
        """The request for one session's summary or keywords."""
        return ChatRequest.user(expansion_prompt(kind, session.turns, self.dialogue),
                                _label(kind, session))

    def generate(self, kind: str, sessions: Sequence[Session],
                 conversations: Sequence[Conversation] = ()) -> list[str]:
        """One summary (``kind="summary"``) or keyword list (``"keywords"``) per session."""
        if kind not in _KINDS:
            raise ValueError(f"unknown kind {kind!r}: use 'summary' or 'keywords'")
        return self.client.map([self.request(kind, s) for s in sessions], desc=kind)

    def generate_both(self, sessions: Sequence[Session]) -> tuple[list[str], list[str]]:
        """Summaries and keywords in one batch (both kinds share the concurrency)."""
        reqs = [self.request(k, s) for k in _KINDS for s in sessions]
        out = self.client.map(reqs, desc="summaries+keywords")
        return out[:len(sessions)], out[len(sessions):]


def expansion_paths(out: Union[str, os.PathLike]) -> tuple[Path, Path]:
    """Where :func:`write_expansion_files` writes.

    ``out`` names a folder (existing, or ending in ``/``) → ``out/summary_level.jsonl``
    and ``out/keyword_level.jsonl``; otherwise a prefix → ``<out>-summary_level.jsonl``
    and ``<out>-keyword_level.jsonl`` (the reference's file names).
    """
    s = str(out)
    p = Path(out)
    if p.is_dir() or s.endswith(("/", os.sep)):
        return p / "summary_level.jsonl", p / "keyword_level.jsonl"
    return Path(f"{s}-summary_level.jsonl"), Path(f"{s}-keyword_level.jsonl")


def _keyed_entries(ds: Dataset) -> list[tuple[str, Session]]:
    """(key, session) per line: the session id for LongMemEval (plus a
    ``convid-…-sessid-…`` key where one id has two different contents), else the
    reference key of every (conversation, session)."""
    if ds.format != "longmemeval":
        return [(reference_key(c.id, s.id), s) for c in ds for s in c.sessions]
    first: dict[str, tuple] = {}
    unique: dict[str, Session] = {}  # one line per key: sessions recur in many haystacks
    for c in ds:
        for s in c.sessions:
            turns = first.setdefault(s.id, s.turns)
            same = turns is s.turns or turns == s.turns
            unique.setdefault(s.id if same else reference_key(c.id, s.id), s)
    return list(unique.items())


def write_expansion_files(ds: Dataset, source: LLMSource,
                          out: Union[str, os.PathLike]) -> tuple[Path, Path]:
    """Generate summaries and keywords for every distinct session of ``ds`` and write
    them as MemGAS JSONL (``{"<key>": "<text>"}`` per line), atomically.

    Keys: the session id for LongMemEval, ``convid-<conversation>-sessid-<session>``
    for LoCoMo and Long-MT-Bench+ (what :class:`~memgas_gpu.expand.JsonlSource` reads).

    Returns:
        The summary and keyword file paths (see :func:`expansion_paths`).
    """
    sessions = ds.distinct_sessions()
    summaries, keywords = source.generate_both(sessions)
    by_key = {s.key: i for i, s in enumerate(sessions)}
    entries = _keyed_entries(ds)
    paths = expansion_paths(out)
    for path, texts in zip(paths, (summaries, keywords)):
        with atomic_write(path, "w", encoding="utf-8") as f:
            for key, s in entries:
                f.write(json.dumps({key: texts[by_key[s.key]]}, ensure_ascii=False,
                                   allow_nan=False) + "\n")
    return paths
