"""``mg.Client``: a memory served by ``memgas serve``, with the memory methods and result
types of :class:`~memgas_gpu.MemoryIndex`, so moving from an in-process memory to a
served one is one line::

    mem = mg.MemoryIndex.open("memory/")          # in this process
    mem = mg.Client("http://127.0.0.1:8000")       # served

A thin client: it imports neither torch nor transformers nor numpy (only httpx,
pydantic and the torch-free modules of this package: :class:`~memgas_gpu.Session`,
:class:`~memgas_gpu.retrieve.results.SearchResult`,
:class:`~memgas_gpu.memory.meta.ConversationMeta` and the protocol).  Beside the package
it needs httpx and pydantic, nothing else: ``pip install "memgas_gpu[client]"``.

Paths, methods and answers come from the protocol's route table (:data:`.protocol.ROUTES`,
one table for the server and this client); every answer is checked against its model.
Errors:

* the server's error answers come back as the memory's own exceptions, through the
  protocol's table (:data:`.protocol.CLIENT_EXCEPTIONS`): KeyError for an unknown
  conversation or session, TypeError / ValueError for bad input (ValueError for a
  session id already taken too); any other error answer is a :class:`ServerError`;
* an answer that is not a memgas answer (another server's 200, an HTML page, a proxy's
  error page, a redirect) is a :class:`ProtocolError`;
* no answer at all (connection refused, DNS, a reset, a timeout) is a
  :class:`ClientConnectionError` (a :class:`ConnectionError`; :class:`ClientTimeout`, also
  a :class:`TimeoutError`, for a timeout).

All three are :class:`ClientError` (a :class:`~memgas_gpu.MemgasError`); their messages
name the URL, never the key.
"""
from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence
from urllib.parse import quote, urlsplit, urlunsplit

from ..errors import MemgasError

_INSTALL = 'pip install "memgas_gpu[client]"'
try:
    from .protocol import CLIENT_EXCEPTIONS, ROUTES, ErrorOut, session_body
except ModuleNotFoundError as e:  # the protocol's models are pydantic's
    if e.name != "pydantic":
        raise
    raise ImportError(f"mg.Client needs pydantic: {_INSTALL}") from None

if TYPE_CHECKING:  # annotations only: the data model is imported where it is used
    from ..data.model import Session
    from ..memory.meta import ConversationMeta

__all__ = ["Client", "ClientError", "ClientConnectionError", "ClientTimeout",
           "ProtocolError", "ServerError", "ENV_KEY"]

#: the environment variable :class:`Client` reads its key from when given none
ENV_KEY = "MEMGAS_API_KEY"
#: the routes by handler name
_ROUTES = {r.name: r for r in ROUTES}
#: a key: printable ASCII without spaces (what an HTTP header can carry as it is)
_KEY = re.compile(r"[\x21-\x7e]+")


class ClientError(MemgasError):
    """Base of :class:`Client`'s own errors: ``url`` (of the request; never the key)."""

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class ClientConnectionError(ClientError, ConnectionError):
    """No answer from the server: connection refused, a name that does not resolve, a
    connection reset or closed before the answer."""


class ClientTimeout(ClientConnectionError, TimeoutError):
    """No answer within the client's ``timeout``."""


class ProtocolError(ClientError):
    """An answer that is not a memgas answer (another server, an HTML page, a proxy's
    page, a redirect, a body of the wrong shape): ``url``, ``status`` (HTTP)."""

    def __init__(self, message: str, url: str = "", status: int = 0) -> None:
        super().__init__(message, url)
        self.status = status


class ServerError(ClientError):
    """An error answer of the server that is not one of the memory's exceptions:
    ``status`` (HTTP), ``code`` (:data:`.protocol.ERRORS`) and the server's
    ``message`` (no key, a body over the bound, the server failing...)."""

    def __init__(self, status: int, code: str, message: str, url: str = "") -> None:
        super().__init__(f"{message} (HTTP {status}, {code})", url)
        self.status, self.code, self.message = status, code, message


def _shown(url: str) -> str:
    """``url`` without a user or password (messages and reprs)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _seg(x: str, what: str) -> str:
    """``x`` as one percent-encoded path segment."""
    if not isinstance(x, str) or not x:
        raise TypeError(f"{what} must be a non-empty string, got {x!r:.80}")
    if x in (".", ".."):  # else a dot segment, resolved away by HTTP clients
        return x.replace(".", "%2E")
    return quote(x, safe="")


def _check_sessions(sessions) -> list:
    from ..data.model import Session

    sessions = [sessions] if isinstance(sessions, Session) else list(sessions)
    for j, s in enumerate(sessions):
        if not isinstance(s, Session):
            raise TypeError(f"sessions[{j}] must be a memgas_gpu.Session, got "
                            f"{type(s).__name__} (Session.from_messages builds one from "
                            "chat messages)")
    return sessions


class Client:
    """A served memory (see the module docstring).

    Args:
        url: the server's URL (the line ``memgas serve`` prints).
        key: the API key (default: ``MEMGAS_API_KEY``; none for a server without keys).
        timeout: seconds per request (connecting, sending, waiting for the answer).
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
            raise ImportError(f"mg.Client needs httpx: {_INSTALL}") from None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// URL, got "
                             f"{_shown(url) if isinstance(url, str) else url!r:.80}")
        key = key if key is not None else os.environ.get(ENV_KEY) or None
        if key is not None and not (isinstance(key, str) and _KEY.fullmatch(key)):
            raise ValueError(f"key must be a string of printable ASCII characters without "
                             f"spaces (got a {type(key).__name__} that is not; the key "
                             "itself is not shown)")
        self._secret = key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        kw = {"transport": transport} if transport is not None else {}
        self.url = url.rstrip("/")
        self._make = lambda: httpx.Client(base_url=self.url, headers=headers,
                                          timeout=timeout, **kw)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._clients: list = []

    def __repr__(self) -> str:  # never the key
        return f"Client({_shown(self.url)!r})"

    # ------------------------------------------------------------------ plumbing
    def _http(self):
        http = getattr(self._local, "http", None)
        if http is None:
            http = self._local.http = self._make()
            with self._lock:
                self._clients.append(http)
        return http

    def _hide(self, text: str) -> str:
        return text.replace(self._secret, "[key]") if self._secret else text

    def _call(self, name: str, cid: Optional[str] = None, sid: Optional[str] = None,
              body=None, params: Optional[dict] = None):
        """The answer of route ``name`` (its model, checked), or the exception of its
        error answer."""
        import httpx

        rt = _ROUTES[name]
        path = rt.path
        if "{cid}" in path:
            path = path.replace("{cid}", _seg(cid, "conversation_id"))
        if "{sid}" in path:
            path = path.replace("{sid}", _seg(sid, "session_id"))
        url = _shown(self.url) + path
        try:
            r = self._http().request(rt.method, path, json=body, params=params)
        except httpx.TimeoutException as e:
            raise ClientTimeout(f"no answer from {url} within the timeout "
                                f"({type(e).__name__})", url) from None
        except (httpx.TransportError, httpx.DecodingError, httpx.TooManyRedirects) as e:
            what = self._hide(str(e))[:200] or type(e).__name__
            if isinstance(e, httpx.DecodingError):
                raise ProtocolError(f"{url} answered a body that does not decode "
                                    f"({what})", url) from None
            raise ClientConnectionError(f"cannot reach {url}: {what}", url) from None
        if 200 <= r.status_code < 300:
            return self._answer(rt.answer, r, url)
        if r.status_code >= 400:
            try:
                err = ErrorOut.model_validate_json(r.content).error
            except ValueError:  # pydantic's ValidationError: not a memgas error answer
                pass
            else:
                exc = CLIENT_EXCEPTIONS.get(err.code)
                if exc is not None:
                    raise exc(err.message)
                raise ServerError(r.status_code, err.code, err.message, url)
        raise ProtocolError(f"{url} answered HTTP {r.status_code} "
                            f"({r.headers.get('content-type') or 'no content type'}), "
                            f"which is not an answer of memgas serve: is it the URL of a "
                            f"memgas server?", url, r.status_code)

    def _answer(self, model, r, url: str):
        try:
            return model.model_validate_json(r.content)
        except ValueError as e:  # pydantic's ValidationError
            errs = e.errors(include_url=False) if hasattr(e, "errors") else []
            why = (f"{'.'.join(map(str, errs[0]['loc'])) or 'body'}: {errs[0]['msg']}"
                   if errs else str(e))
            raise ProtocolError(f"{url} answered HTTP {r.status_code} with a body that is "
                                f"not a memgas answer ({self._hide(why)[:200]}): is it the "
                                "URL of a memgas server?", url, r.status_code) from None

    def _pages(self, name: str, field: str, cid: Optional[str] = None) -> list:
        """Every item of a paged listing, following ``next_cursor``."""
        out, seen, cursor = [], set(), None
        while True:
            page = self._call(name, cid, params={"cursor": cursor} if cursor else None)
            out.extend(getattr(page, field))
            cursor = page.next_cursor
            if cursor is None:
                return out
            if cursor in seen:
                path = _ROUTES[name].path
                if cid is not None:
                    path = path.replace("{cid}", _seg(cid, "conversation_id"))
                url = _shown(self.url) + path
                raise ProtocolError(f"{url} answered the cursor {cursor[:40]!r} twice (a "
                                    "listing that never ends)", url, 200)
            seen.add(cursor)

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

    # ------------------------------------------------------------------ writes
    def add_session(self, conversation_id: str, session: Session, *,
                    summary: Optional[str] = None, keywords: Optional[str] = None,
                    metadata: Optional[dict] = None) -> None:
        """:meth:`MemoryIndex.add_session <memgas_gpu.MemoryIndex.add_session>`:
        append a :class:`~memgas_gpu.Session` (durable on the server when this returns).

        Raises:
            TypeError, ValueError: a malformed argument, or a session id the
                conversation has (nothing changed).
        """
        self.add_sessions(conversation_id, [session], summaries=[summary],
                          keywords=[keywords], metadata=[metadata])

    def add_sessions(self, conversation_id: str, sessions: Sequence[Session], *,
                     summaries: Optional[Sequence] = None,
                     keywords: Optional[Sequence] = None,
                     metadata: Optional[Sequence] = None) -> None:
        """:meth:`MemoryIndex.add_sessions <memgas_gpu.MemoryIndex.add_sessions>`:
        several sessions as one request and one write of the server (all or none).

        Args:
            summaries, keywords, metadata: one per session (None: as ``add_session``).

        Raises:
            TypeError, ValueError: a malformed argument, two sessions of one id, or a
                session id the conversation holds (nothing changed).
        """
        from ..data.model import per_session

        sessions = _check_sessions(sessions)
        per = per_session(len(sessions), summaries=summaries, keywords=keywords,
                          metadata=metadata)
        if not sessions:
            return  # as the memory: nothing to add
        body = {"sessions": [session_body(s, u, k, m) for s, u, k, m in zip(
            sessions, per["summaries"], per["keywords"], per["metadata"])]}
        self._call("add_sessions", conversation_id, body=body)

    def replace_session(self, conversation_id: str, session: Session, *,
                        summary: Optional[str] = None, keywords: Optional[str] = None,
                        metadata: Optional[dict] = None) -> None:
        """:meth:`MemoryIndex.replace_session <memgas_gpu.MemoryIndex.replace_session>`:
        the session of ``session.id`` replaced by ``session``, in its place.

        Raises:
            KeyError: an unknown conversation or session id.
            TypeError, ValueError: a malformed argument (nothing changed).
        """
        (session,) = _check_sessions([session])
        self._call("replace_session", conversation_id, session.id,
                   body=session_body(session, summary, keywords, metadata))

    def remove_session(self, conversation_id: str, session_id: str) -> None:
        """:meth:`MemoryIndex.remove_session <memgas_gpu.MemoryIndex.remove_session>`.

        Raises:
            KeyError: an unknown conversation or session id.
        """
        self._call("remove_session", conversation_id, session_id)

    def forget_conversation(self, conversation_id: str) -> None:
        """:meth:`MemoryIndex.forget_conversation
        <memgas_gpu.MemoryIndex.forget_conversation>`.

        Raises:
            KeyError: an unknown conversation id.
        """
        self._call("forget", conversation_id)

    def compact(self) -> int:
        """:meth:`MemoryIndex.compact <memgas_gpu.MemoryIndex.compact>` on the server:
        the number of stored sessions dropped."""
        return self._call("compact").dropped

    # ------------------------------------------------------------------ what it holds
    @property
    def conversations(self) -> list[ConversationMeta]:
        """:attr:`MemoryIndex.conversations <memgas_gpu.MemoryIndex.conversations>`:
        a :class:`~memgas_gpu.memory.meta.ConversationMeta` (``.id``, ``.session_ids``,
        ``.session_dates``, ``.session_metadata``) per conversation of this key, in id
        order (the memory's: in the order they came).  One request per page of
        conversations, then per conversation; a conversation forgotten meanwhile is left
        out."""
        from ..memory.meta import ConversationMeta

        out = []
        for c in self._pages("list_conversations", "conversations"):
            try:
                got = self.sessions(c.id)
            except KeyError:  # forgotten since its page was listed
                continue
            md = [s["metadata"] for s in got]
            out.append(ConversationMeta(c.id, [s["id"] for s in got],
                                        [s["date"] for s in got],
                                        md if any(md) else None))
        return out

    def conversation(self, conversation_id: str) -> dict:
        """One conversation: ``{"id", "sessions" (how many), "first_date",
        "last_date"}`` (dates ``None`` when none of its sessions has one).

        Raises:
            KeyError: an unknown conversation id.
        """
        return self._call("get_conversation", conversation_id).model_dump()

    def sessions(self, conversation_id: str) -> list:
        """:meth:`MemoryIndex.sessions <memgas_gpu.MemoryIndex.sessions>`:
        ``[{"id", "date", "metadata"}]`` of a conversation's sessions, in order.

        Raises:
            KeyError: an unknown conversation id.
        """
        return [s.model_dump() for s in
                self._pages("list_sessions", "sessions", conversation_id)]

    def get_session(self, conversation_id: str, session_id: str) -> dict:
        """:meth:`MemoryIndex.get_session <memgas_gpu.MemoryIndex.get_session>`:
        ``{"id", "date", "metadata", "turns"}`` of one session.

        Raises:
            KeyError: an unknown conversation or session id.
        """
        return self._call("get_session", conversation_id, session_id).model_dump()

    def search(self, conversation_id, queries: Sequence[str], k: int = 10,
               method: Optional[str] = None, encoder: Any = None, evidence: int = 3,
               device: Optional[str] = None, question_date: Optional[str] = None,
               after: Optional[str] = None, before: Optional[str] = None,
               metadata: Optional[dict] = None, **settings) -> list:
        """:meth:`MemoryIndex.search <memgas_gpu.MemoryIndex.search>` on the server:
        one :class:`~memgas_gpu.retrieve.results.SearchResult` per query, with each
        session's date and metadata.

        ``encoder`` and ``device`` are the server's (``memgas serve --encoder``,
        ``--device``): they are parameters here only so that positional arguments mean
        what they mean to the memory, and must stay None.

        Raises:
            TypeError, ValueError: a malformed argument (the server's message).
        """
        from ..retrieve.results import SearchResult

        for name, value in (("encoder", encoder), ("device", device)):
            if value is not None:
                raise TypeError(f"{name}= is the server's (memgas serve --{name}), not a "
                                "search argument of the client")
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings (got one string: wrap it "
                            "in [])")
        body = {"conversation_id": list(conversation_id)
                if isinstance(conversation_id, (tuple, list)) else conversation_id,
                "questions": list(queries), "k": k, "method": method, "evidence": evidence,
                "question_date": question_date, "after": after, "before": before,
                "metadata": metadata}
        if settings:
            body["settings"] = settings
        got = self._call("search", body=body)
        return [SearchResult(r.conversation_id, list(r.session_ids), list(r.scores),
                             [[(e.turn, e.text, e.score) for e in ev] for ev in r.evidence],
                             list(r.dates), [dict(m) for m in r.metadata])
                for r in got.results]
