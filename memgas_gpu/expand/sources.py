"""Where summaries (U) and keywords (K) come from.

A *source* turns the distinct sessions of a dataset into one text per session:

* ``"offline"`` — :class:`~memgas_gpu.expand.offline.OfflineExtractor` (default; no LLM).
* ``"source"`` — summaries shipped with the data (LoCoMo's ``session_summary``).
* a ``.jsonl`` path — MemGAS-style files, one ``{"<key>": "<text>"}`` object per line,
  keyed by session id (LongMemEval) or ``convid-<conversation>-sessid-<session>``
  (LoCoMo / Long-MT-Bench+, as the reference writes them); both keys are tried.
* any object with ``name``, ``config()`` and ``generate(kind, sessions, conversations)``
  — the hook the LLM stage plugs into (``kind`` is ``"summary"`` or ``"keywords"``).

Every choice is recorded by :func:`describe_source` for the index manifest.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol, Sequence, Union

from ..data.model import Conversation, Session
from .._io import iter_jsonl
from ..errors import DataFormatError
from .offline import OfflineExtractor

__all__ = ["TextSource", "JsonlSource", "DatasetSummarySource", "OfflineSource",
           "resolve_source", "describe_source", "reference_key"]


def reference_key(conversation_id: str, session_id: str) -> str:
    """The key the reference's JSONL files use for non-LongMemEval datasets."""
    return f"convid-{conversation_id}-sessid-{session_id}"


class TextSource(Protocol):
    name: str

    def config(self) -> dict: ...

    def generate(self, kind: str, sessions: Sequence[Session],
                 conversations: Sequence[Conversation]) -> list[str]:
        """One text per session; ``conversations[i]`` is a conversation holding
        ``sessions[i]`` (for keys and source data)."""
        ...


class OfflineSource:
    """Offline extractive summaries / TF-IDF keyword phrases (shared corpus IDF)."""

    name = "offline"

    def __init__(self, extractor: Union[OfflineExtractor, None] = None) -> None:
        self.extractor = extractor or OfflineExtractor()
        self._cache: dict[tuple, tuple[list[str], list[str]]] = {}

    def config(self) -> dict:
        return self.extractor.config()

    def generate(self, kind, sessions, conversations):
        key = tuple(id(s.turns) for s in sessions)
        if key not in self._cache:  # summaries and keywords share one corpus pass
            self._cache = {key: self.extractor.expand([s.text for s in sessions])}
        summaries, keywords = self._cache[key]
        return list(summaries if kind == "summary" else keywords)


class DatasetSummarySource:
    """Summaries shipped with the dataset (LoCoMo ``session_summary``)."""

    name = "source"

    def config(self) -> dict:
        return {"method": self.name}

    def generate(self, kind, sessions, conversations):
        out = []
        for s, c in zip(sessions, conversations):
            text = c.source_summaries.get(s.id)
            if text is None:
                raise DataFormatError(
                    c.id, f"no {kind} shipped with the data for session {s.id!r} "
                    "(use --summaries offline or a .jsonl file)")
            out.append(text)
        return out


class JsonlSource:
    """MemGAS-style JSONL: one ``{"<key>": "<text>"}`` object per line."""

    name = "jsonl"

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = Path(path)
        self.table: dict[str, str] = {}
        for _, obj in iter_jsonl(self.path):
            for k, v in obj.items():
                self.table[str(k)] = (v if isinstance(v, str) else
                                      str(v) if isinstance(v, (int, float)) else json.dumps(v))

    def config(self) -> dict:
        return {"method": self.name, "path": str(self.path), "entries": len(self.table)}

    def generate(self, kind, sessions, conversations):
        out = []
        for s, c in zip(sessions, conversations):
            text = self.table.get(reference_key(c.id, s.id), self.table.get(s.id))
            if text is None:
                raise DataFormatError(str(self.path), f"no {kind} for session {s.id!r} of "
                                      f"conversation {c.id!r} (looked up keys "
                                      f"{reference_key(c.id, s.id)!r} and {s.id!r})")
            out.append(text)
        return out


def resolve_source(spec) -> TextSource:
    """``"offline"`` | ``"source"`` | a ``.jsonl`` path | a source object."""
    if not isinstance(spec, (str, os.PathLike)):
        if all(hasattr(spec, a) for a in ("name", "config", "generate")):
            return spec
        raise TypeError(f"not a summary/keyword source: {spec!r}")
    spec = str(spec)
    if spec == "offline":
        return OfflineSource()
    if spec in ("source", "locomo"):
        return DatasetSummarySource()
    if spec.endswith(".jsonl") or Path(spec).exists():
        return JsonlSource(spec)
    raise ValueError(f"unknown summary/keyword source {spec!r}: use 'offline', 'source' "
                     "or a path to a .jsonl file")


def describe_source(src: TextSource) -> dict:
    return {"name": src.name, **src.config()}
