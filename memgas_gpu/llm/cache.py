"""A persistent SQLite cache of chat-completion responses.

One row per distinct request, keyed by ``sha256(model + messages + parameters)``
(:func:`request_key`). The database runs in WAL mode and every response is committed
as soon as it arrives, so a run that is killed keeps everything it was answered and a
rerun sends only the requests still missing (a full rerun sends none).

Only the model name, the response text and its token counts are stored: never a
header, a URL or an API key.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from ..errors import MemgasError

__all__ = ["CachedResponse", "ResponseCache", "default_cache_path", "request_key",
           "usage_count", "MAX_TOKEN_COUNT"]

_SCHEMA_VERSION = "1"

#: the largest token count kept; a larger one is not a count (and 2**63 would not even
#: fit SQLite's INTEGER)
MAX_TOKEN_COUNT = 2 ** 53


class CacheError(MemgasError):
    """The cache file cannot be opened or is not a memgas response cache."""


def request_key(model: str, messages: Sequence[dict], params: dict) -> str:
    """The cache key of one request: a SHA-256 of its canonical JSON.

    Args:
        model: model name sent to the endpoint.
        messages: the chat messages (``[{"role": ..., "content": ...}]``).
        params: every other sampling parameter sent (temperature, max_tokens, ...).

    Returns:
        64 hexadecimal characters.
    """
    blob = json.dumps({"model": model, "messages": list(messages), "params": params},
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def usage_count(value) -> int:
    """A token count as a server reported it: a whole number in [0, MAX_TOKEN_COUNT], else
    0 (unknown): negative, fractional, huge, boolean or not a number at all."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 0 <= value <= MAX_TOKEN_COUNT:
        return 0
    return value


def default_cache_path() -> Path:
    """``$MEMGAS_LLM_CACHE``, else ``$XDG_CACHE_HOME/memgas_gpu/llm_cache.sqlite``
    (``~/.cache`` when ``XDG_CACHE_HOME`` is unset)."""
    env = os.environ.get("MEMGAS_LLM_CACHE")
    if env:
        return Path(env)
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "memgas_gpu" / "llm_cache.sqlite"


@dataclass(frozen=True)
class CachedResponse:
    """A stored response: its text and the token counts the endpoint reported."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ResponseCache:
    """SQLite response store, safe to share between processes (WAL, busy timeout).

    Args:
        path: database file (created with its parent folders).

    Raises:
        CacheError: the file exists but is not a SQLite database of this schema.
    """

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # the async client calls from its event-loop thread, possibly not the creator's
            self._db = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # durable across process kills
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, model TEXT, "
                "response TEXT NOT NULL, prompt_tokens INTEGER, completion_tokens INTEGER, "
                "created REAL)")
            row = self._db.execute("SELECT v FROM meta WHERE k='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)",
                                 (_SCHEMA_VERSION,))
            elif row[0] != _SCHEMA_VERSION:
                raise CacheError(f"{self.path}: response cache schema {row[0]!r}, expected "
                                 f"{_SCHEMA_VERSION!r} (use another --cache file)")
        except sqlite3.DatabaseError as e:
            raise CacheError(f"{self.path}: cannot open the response cache ({e})") from None

    def get(self, key: str) -> Optional[CachedResponse]:
        """The stored response for ``key``, or None."""
        row = self._db.execute("SELECT response, prompt_tokens, completion_tokens FROM "
                               "responses WHERE key=?", (key,)).fetchone()
        return None if row is None else CachedResponse(row[0], usage_count(row[1]),
                                                       usage_count(row[2]))

    def put(self, key: str, model: str, response: CachedResponse) -> None:
        """Store one response (committed immediately)."""
        self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                         (key, model, response.text, usage_count(response.prompt_tokens),
                          usage_count(response.completion_tokens), time.time()))

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def __contains__(self, key: str) -> bool:
        return self._db.execute("SELECT 1 FROM responses WHERE key=?",
                                (key,)).fetchone() is not None

    def close(self) -> None:
        """Close the connection (the data is already committed)."""
        self._db.close()

    def __enter__(self) -> "ResponseCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
