"""``mg.Client``: a memory served by ``memgas serve``, with the methods and result types
of :class:`~memgas_gpu.MemoryIndex`, so moving from an in-process memory to a served
one is one line::

    mem = mg.MemoryIndex.open("memory/")          # in this process
    mem = mg.Client("http://127.0.0.1:8000")       # served

Errors come back as the memory's own types, with the server's message: KeyError for an
unknown conversation or session, TypeError / ValueError for bad input (ValueError for a
session id already taken too); anything else is a :class:`ServerError`.  Needs httpx
(``pip install "memgas_gpu[serve]"``).
"""
from __future__ import annotations

import os
import threading
from typing import Optional, Sequence
from urllib.parse import quote

from ..errors import MemgasError
from .protocol import EXCEPTIONS, session_body

__all__ = ["Client", "ServerError", "ENV_KEY"]

#: the environment variable :class:`Client` reads its key from when given none
ENV_KEY = "MEMGAS_API_KEY"


class ServerError(MemgasError):
    """An answer of the server that is not a result: ``status`` (HTTP), ``code`` and
    the server's message (no key, a body over the bound, the server failing...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} (HTTP {status}, {code})")
        self.status, self.code, self.message = status, code, message


def _seg(x: str, what: str) -> str:
    if not isinstance(x, str) or not x:
        raise TypeError(f"{what} must be a non-empty string, got {x!r:.80}")
    if x in (".", ".."):  # else a dot segment, resolved away by HTTP clients
        return x.replace(".", "%2E")
    return quote(x, safe="")


class Client:
    """A served memory (see the module docstring).

    Args:
        url: the server's URL (the line ``memgas serve`` prints).
        key: the API key (default: ``MEMGAS_API_KEY``; none for a server without keys).
        timeout: seconds per request.
        transport: an httpx transport (tests).

    Thread-safe: many threads may share one client; each thread gets its own
    keep-alive connection (one large shared pool costs the client more per request
    than the server takes to answer).
    """

    def __init__(self, url: str, key: Optional[str] = None, timeout: float = 120.0,
                 transport=None) -> None:
        try:
            import httpx
        except ImportError:
            raise ImportError('mg.Client needs httpx: pip install "memgas_gpu[serve]"') \
                from None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// URL, got {url!r:.80}")
        key = key if key is not None else os.environ.get(ENV_KEY) or None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        kw = {"transport": transport} if transport is not None else {}
        self.url = url.rstrip("/")
        self._make = lambda: httpx.Client(base_url=self.url, headers=headers,
                                          timeout=timeout, **kw)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._clients: list = []

    def __repr__(self) -> str:  # never the key
        return f"Client({self.url!r})"

    # ------------------------------------------------------------------ plumbing
    def _http(self):
        http = getattr(self._local, "http", None)
        if http is None:
            http = self._local.http = self._make()
            with self._lock:
                self._clients.append(http)
        return http

    def _call(self, method: str, path: str, body=None):
        r = self._http().request(method, path, json=body)
        if r.status_code < 400:
            return r.json()
        try:
            err = r.json()["error"]
            code, message = str(err["code"]), str(err["message"])
        except (ValueError, KeyError, TypeError):
            code, message = "http", (r.text[:200] or r.reason_phrase)
        exc = EXCEPTIONS.get(code)
        if exc is not None:
            raise exc(message)
        raise ServerError(r.status_code, code, message)

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            clients, self._clients = self._clients, []
        for c in clients:
            c.close()
        self._local = threading.local()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ the memory
    def add_session(self, conversation_id: str, session, *, summary: Optional[str] = None,
                    keywords: Optional[str] = None, metadata: Optional[dict] = None) -> None:
        """:meth:`MemoryIndex.add_session <memgas_gpu.MemoryIndex.add_session>`:
        append a :class:`~memgas_gpu.Session` (durable on the server when this returns)."""
        from ..data.model import Session

        if not isinstance(session, Session):
            raise TypeError(f"session must be a memgas_gpu.Session, got "
                            f"{type(session).__name__} (Session.from_messages builds one "
                            "from chat messages)")
        path = f"/v1/conversations/{_seg(conversation_id, 'conversation_id')}/sessions"
        self._call("POST", path, session_body(session, summary, keywords, metadata))

    def add_sessions(self, conversation_id: str, sessions: Sequence) -> None:
        """Several sessions in one request (all checked before any is added)."""
        from ..data.model import Session

        bad = [type(s).__name__ for s in sessions if not isinstance(s, Session)]
        if bad:
            raise TypeError(f"sessions must be memgas_gpu.Session objects, got {bad[0]}")
        path = f"/v1/conversations/{_seg(conversation_id, 'conversation_id')}/sessions"
        self._call("POST", path, {"sessions": [session_body(s) for s in sessions]})

    def remove_session(self, conversation_id: str, session_id: str) -> None:
        self._call("DELETE", f"/v1/conversations/{_seg(conversation_id, 'conversation_id')}"
                             f"/sessions/{_seg(session_id, 'session_id')}")

    def forget_conversation(self, conversation_id: str) -> None:
        self._call("DELETE", f"/v1/conversations/{_seg(conversation_id, 'conversation_id')}")

    @property
    def conversations(self) -> list:
        """``ConversationMeta`` of this key's conversations (``.id``, ``.session_ids``,
        ``.session_dates``)."""
        from ..memory.meta import ConversationMeta

        got = self._call("GET", "/v1/conversations")["conversations"]
        return [ConversationMeta(c["id"], c["session_ids"], c["session_dates"]) for c in got]

    def sessions(self, conversation_id: str) -> list:
        """``[{"id", "date", "metadata"}]`` of a conversation's sessions, in order."""
        return self._call("GET", f"/v1/conversations/"
                                 f"{_seg(conversation_id, 'conversation_id')}/sessions")["sessions"]

    def get_session(self, conversation_id: str, session_id: str) -> dict:
        """``{"id", "date", "metadata", "turns"}`` of one session."""
        return self._call("GET", f"/v1/conversations/{_seg(conversation_id, 'conversation_id')}"
                                 f"/sessions/{_seg(session_id, 'session_id')}")

    def search(self, conversation_id, queries: Sequence[str], k: int = 10,
               method: Optional[str] = None, evidence: int = 3,
               question_date: Optional[str] = None, after: Optional[str] = None,
               before: Optional[str] = None, metadata: Optional[dict] = None,
               **settings) -> list:
        """:meth:`MemoryIndex.search <memgas_gpu.MemoryIndex.search>` on the server:
        one :class:`~memgas_gpu.retrieve.SearchResult` per query."""
        from ..retrieve.search import SearchResult

        for name in ("encoder", "device"):
            if name in settings:
                raise TypeError(f"{name}= is the server's (memgas serve --{name}), not a "
                                "search argument of the client")
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings (got one string: wrap it "
                            "in [])")
        body = {"conversation_id": list(conversation_id)
                if isinstance(conversation_id, tuple) else conversation_id,
                "questions": list(queries), "k": k, "method": method, "evidence": evidence,
                "question_date": question_date, "after": after, "before": before,
                "metadata": metadata}
        if settings:
            body["settings"] = settings
        got = self._call("POST", "/v1/search", body)["results"]
        return [SearchResult(r["conversation_id"], r["session_ids"], r["scores"],
                             [[(e["turn"], e["text"], e["score"]) for e in ev]
                              for ev in r["evidence"]]) for r in got]
