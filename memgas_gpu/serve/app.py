"""The HTTP JSON service of ``memgas serve``: an ASGI app built from the protocol's route
table (:data:`.protocol.ROUTES`; ``/openapi.json`` is generated from the same models,
``/docs`` shows it).

Routes (ids are path segments, percent-encoded: ``%2F`` is a ``/`` inside an id)::

    GET    /healthz                                  alive
    GET    /readyz                                   the memory is open: what it holds
    GET    /metrics                                  Prometheus text
    GET    /openapi.json, /docs                      the API's schema, and a page of it
    GET    /v1/conversations                         the caller's conversations (paged)
    GET    /v1/conversations/{cid}                   one conversation: sessions, dates
    DELETE /v1/conversations/{cid}                   forget the conversation
    POST   /v1/conversations/{cid}/sessions          add one session, or {"sessions": [...]}
    GET    /v1/conversations/{cid}/sessions          its sessions (paged)
    GET    /v1/conversations/{cid}/sessions/{sid}    one session
    PUT    /v1/conversations/{cid}/sessions/{sid}    replace a session in its place
    DELETE /v1/conversations/{cid}/sessions/{sid}    remove one session
    POST   /v1/search                                rank sessions for questions
    POST   /v1/compact                               compact the memory now

Every answer is JSON of the route's answer model; every error (the app's own 404, 405,
400 included) is ``{"error": {"code", "message"}}`` (:data:`.protocol.ERRORS`), the
message naming the field; no answer holds a traceback.  With keys (:mod:`.tenants`)
every ``/v1`` route needs ``Authorization: Bearer KEY`` and sees only its tenant's
conversations.  One access-log line per request goes to the ``memgas_gpu.serve.access``
logger (method, route, status, milliseconds, tenant: never a key or an id).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from typing import Optional
from urllib.parse import parse_qsl, unquote

from pydantic import ValidationError

from .metrics import Metrics
from .protocol import (ROUTES, ApiError, Conflict, Limits, NotFound, SearchIn, SessionIn,
                       SessionsIn, check_id, error_of, openapi, validation_error)
from .tenants import owns, qualify, unqualify

__all__ = ["create_app", "ServeApp"]

log = logging.getLogger("memgas_gpu.serve")
access = logging.getLogger("memgas_gpu.serve.access")

#: (path segments, route) of every route; ``{cid}`` / ``{sid}`` match one segment
_TABLE = [(tuple(r.path.strip("/").split("/")), r) for r in ROUTES]
_DOCS = """<!DOCTYPE html>
<html><head><title>memgas serve: API</title><meta charset="utf-8">
<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css">
</head><body><div id="swagger-ui"></div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui"});</script>
<noscript>The schema of this API is at <a href="/openapi.json">/openapi.json</a>.</noscript>
</body></html>
"""


class _Disconnected(Exception):
    """The client hung up before its request was read."""


def _match(segments: list) -> tuple[dict, Optional[str]]:
    """``({method: (route, params)}, pattern)`` of the routes matching ``segments``."""
    found, pattern = {}, None
    for pat, r in _TABLE:
        if len(pat) != len(segments):
            continue
        params = {}
        for p, s in zip(pat, segments):
            if p in ("{cid}", "{sid}"):
                params[p[1:-1]] = s
            elif p != s:
                break
        else:
            found[r.method] = (r, params)
            pattern = r.path
    return found, pattern


def _segments(scope) -> list:
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    raw = raw.split(b"?", 1)[0]
    parts = raw.decode("latin-1").split("/")[1:]
    try:
        return [unquote(p, errors="strict") for p in parts]
    except UnicodeDecodeError:
        raise ApiError("bad_request", "the path is not valid percent-encoded UTF-8") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class _Answer:
    """An answer: status, body bytes, content type, extra headers."""

    __slots__ = ("status", "body", "media", "headers")

    def __init__(self, status: int, body: bytes, media: str = "application/json",
                 headers: Optional[list] = None) -> None:
        self.status, self.body, self.media = status, body, media
        self.headers = headers or []


def _json(status: int, model) -> _Answer:
    return _Answer(status, model.model_dump_json().encode("utf-8"))


def _error(e: ApiError) -> _Answer:
    a = _Answer(e.status, json.dumps(e.body(), ensure_ascii=False).encode("utf-8"))
    if e.code == "unauthorized":
        a.headers.append((b"www-authenticate", b"Bearer"))
    if e.code in ("timeout", "too_large", "headers_too_large", "bad_request"):
        a.headers.append((b"connection", b"close"))  # the rest of the request is unread
    return a


def _cursor(value: Optional[str], what: str, kind: type):
    """The position a cursor of ``what`` holds (a ``kind``: the last conversation id of
    the page before; for sessions ``[offset, last session id]``), or None without
    one."""
    if value is None:
        return None
    try:
        got = json.loads(base64.urlsafe_b64decode(value.encode("ascii") + b"==="))["a"]
    except (ValueError, KeyError, TypeError, UnicodeError):
        got = None
    ok = (type(got) is kind if kind is str else  # sessions: [offset, last id, next id]
          isinstance(got, list) and len(got) == 3 and type(got[0]) is int
          and got[0] > 0 and type(got[1]) is str and type(got[2]) is str)
    if not ok:
        raise ApiError("invalid_value", f"cursor: {value[:40]!r} is not a cursor of "
                                        f"{what} (give the next_cursor of the previous "
                                        "page)")
    return got


def _next(after) -> str:
    raw = json.dumps({"a": after}, ensure_ascii=False).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _not_found(cid: str, sid: Optional[str] = None) -> ApiError:
    if sid is None:
        return ApiError("not_found", f"no conversation {cid!r}")
    return ApiError("not_found", f"conversation {cid!r} has no session {sid!r}")


class _Call:
    """One request as the handlers see it."""

    __slots__ = ("scope", "receive", "tenant", "query", "headers")

    def __init__(self, scope, receive, headers: dict) -> None:
        self.scope, self.receive, self.headers = scope, receive, headers
        self.tenant: Optional[str] = None
        self.query: dict = {}


class ServeApp:
    """The ASGI app (see the module docstring); ``app.closing = True`` makes
    ``/v1`` routes and the probes answer 503 (set while shutting down)."""

    def __init__(self, backend, keys, limits: Limits, metrics: Metrics,
                 version: str) -> None:
        self.backend, self.keys, self.limits = backend, keys, limits
        self.counters = metrics
        self.closing = False
        self._openapi = json.dumps(openapi(version, limits)).encode("utf-8")

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":  # nothing to start or stop
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        t0 = time.perf_counter()
        route, tenant = "unmatched", None
        call = None
        try:
            headers = self._headers(scope)
            call = _Call(scope, receive, headers)
            segments = _segments(scope)
            found, pattern = _match(segments)
            method = scope["method"]
            if not found and scope["path"] in ("/openapi.json", "/docs"):
                route = scope["path"]
                answer = self._meta(method, scope["path"])
            else:
                if not found:
                    raise ApiError("no_route", f"no route {_shown_path(scope)!r} (the "
                                                "routes are at /openapi.json and /docs)")
                route = pattern
                look = "GET" if method == "HEAD" else method
                if look not in found:
                    raise ApiError("method_not_allowed",
                                   f"{pattern} takes {', '.join(sorted(found))}, not "
                                   f"{method[:20]}")
                r, params = found[look]
                for k, v in params.items():
                    check_id(v, "conversation id" if k == "cid" else "session id")
                if self.closing and r.name != "healthz":
                    raise ApiError("unavailable", "the server is shutting down")
                if r.auth:
                    call.tenant = tenant = self._tenant(headers)
                call.query = self._query(scope, r)
                answer = await getattr(self, r.name)(call, **params)
        except ApiError as e:
            answer = _error(e)
        except _Disconnected:
            answer = None
        except Exception:  # noqa: BLE001 - a bug: logged here, never sent
            log.exception("%s %s failed", scope.get("method"), route)
            answer = _error(ApiError("internal", "internal error (the server logged it)"))
        seconds = time.perf_counter() - t0
        status = answer.status if answer is not None else 499  # nginx: client closed
        self.counters.observe(scope.get("method", "?")[:16], route, status, seconds)
        if access.isEnabledFor(logging.INFO):
            access.info("%s %s %d %.1fms tenant=%s", scope.get("method", "?")[:16], route,
                        status, seconds * 1e3, "-" if tenant is None else tenant)
        if answer is not None:
            await self._send(send, scope, answer)

    async def _send(self, send, scope, a: _Answer) -> None:
        body = b"" if scope.get("method") == "HEAD" else a.body
        headers = [(b"content-type", (a.media + "; charset=utf-8"
                                      if a.media == "text/html" else a.media).encode()),
                   (b"content-length", str(len(a.body)).encode()), *a.headers]
        try:
            await send({"type": "http.response.start", "status": a.status,
                        "headers": headers})
            await send({"type": "http.response.body", "body": body})
        except OSError:  # the client hung up meanwhile
            pass

    def _headers(self, scope) -> dict:
        raw = scope.get("headers") or []
        lim = self.limits
        if len(raw) > lim.max_headers:
            raise ApiError("headers_too_large", f"the request has {len(raw)} header lines, "
                                                f"more than the server takes "
                                                f"({lim.max_headers})")
        size = sum(len(k) + len(v) + 4 for k, v in raw)
        if size > lim.max_header_bytes:
            raise ApiError("headers_too_large", f"the request's headers take {size} bytes, "
                                                f"more than the server takes "
                                                f"({lim.max_header_bytes})")
        out: dict = {}
        for k, v in raw:
            out.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        return out

    def _query(self, scope, r) -> dict:
        qs = scope.get("query_string") or b""
        if not qs:
            return {}
        try:
            pairs = parse_qsl(qs.decode("ascii"), keep_blank_values=True,
                              strict_parsing=True, errors="strict")
        except (ValueError, UnicodeError):
            raise ApiError("bad_request", "the query string is not valid "
                                          "percent-encoded UTF-8") from None
        out: dict = {}
        for k, v in pairs:
            if k not in r.query:
                takes = f"takes {', '.join(r.query)}" if r.query else "takes none"
                raise ApiError("invalid_value", f"unknown query parameter {k[:40]!r} "
                                                f"({r.path} {takes})")
            if k in out:
                raise ApiError("invalid_value", f"query parameter {k!r} given twice")
            out[k] = v
        if "limit" in out:
            v = out["limit"]
            if not v.isdigit() or not 1 <= int(v) <= self.limits.max_page:
                raise ApiError("invalid_value", f"limit must be an integer from 1 to "
                                                f"{self.limits.max_page}, got {v[:20]!r}")
            out["limit"] = int(v)
        return out

    def _tenant(self, headers: dict) -> Optional[str]:
        if self.keys is None:
            return None
        auth = headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if not auth:
            raise ApiError("unauthorized", "this server needs a key: send the header "
                                           "'Authorization: Bearer KEY'")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError("unauthorized", "the Authorization header must be 'Bearer KEY'")
        tenant = self.keys.tenant(key.strip())
        if tenant is None:
            raise ApiError("unauthorized", "the key is not one of this server's keys")
        return tenant

    async def _chunk(self, receive, deadline: float) -> dict:
        left = deadline - time.monotonic()
        try:
            msg = await asyncio.wait_for(receive(), timeout=max(left, 0.0))
        except asyncio.TimeoutError:
            raise ApiError("timeout", f"the body was not sent within "
                                      f"{self.limits.body_timeout_s:g} s") from None
        if msg["type"] == "http.disconnect":
            raise _Disconnected()
        return msg

    async def _body(self, call: _Call, model):
        """The request body as ``model`` (one validation), within the body limits."""
        limit = self.limits.max_body_bytes
        n = call.headers.get("content-length")
        if n is not None:
            if not n.strip().isdigit():
                raise ApiError("bad_request", "the Content-Length header is not a number")
            if int(n) > limit:
                raise ApiError("too_large", f"the body has {int(n)} bytes, more than the "
                                            f"server takes ({limit})")
        deadline = time.monotonic() + self.limits.body_timeout_s
        buf = bytearray()
        while True:
            msg = await self._chunk(call.receive, deadline)
            buf += msg.get("body", b"")
            if len(buf) > limit:
                raise ApiError("too_large", f"the body is larger than the server takes "
                                            f"({limit} bytes)")
            if not msg.get("more_body", False):
                break
        if not buf.strip():
            raise ApiError("bad_request", "the body is empty: send a JSON object")
        try:
            data = json.loads(bytes(buf), parse_constant=_no_constant)
        except RecursionError:
            raise ApiError("bad_request", "the body is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError("bad_request", f"the body is not JSON ({str(e)[:200]})") from None
        if model is SessionIn and isinstance(data, dict) and "sessions" in data:
            model = SessionsIn
        try:
            return model.model_validate(data)
        except ValidationError as e:
            raise validation_error(e) from None

    def _meta(self, method: str, path: str) -> _Answer:
        if method not in ("GET", "HEAD"):
            raise ApiError("method_not_allowed", f"{path} takes GET, not {method[:20]}")
        if path == "/openapi.json":
            return _Answer(200, self._openapi)
        return _Answer(200, _DOCS.encode("utf-8"), "text/html")

    # ------------------------------------------------------------------ service routes
    async def healthz(self, call) -> _Answer:
        from .protocol import HealthOut

        if self.closing:
            raise ApiError("unavailable", "the server is shutting down")
        return _json(200, HealthOut(status="ok"))

    async def readyz(self, call) -> _Answer:
        from .protocol import ReadyOut

        return _json(200, ReadyOut(status="ready", **await self.backend.ready()))

    async def metrics(self, call) -> _Answer:
        text = self.counters.render(await self.backend.stats())
        return _Answer(200, text.encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8")

    async def compact(self, call) -> _Answer:
        from .protocol import CompactedOut

        return _json(200, CompactedOut(dropped=await self.backend.compact()))

    # ------------------------------------------------------------------ conversations
    async def list_conversations(self, call) -> _Answer:
        from .protocol import ConversationOut, ConversationsPage

        t = call.tenant
        after = _cursor(call.query.get("cursor"), "conversations", str)
        limit = call.query.get("limit", self.limits.default_page)
        mine = sorted((unqualify(t, c), n, a, b)
                      for c, n, a, b in await self.backend.conversations() if owns(t, c))
        if after is not None:
            mine = [x for x in mine if x[0] > after]
        page = mine[:limit]
        return _json(200, ConversationsPage(
            conversations=[ConversationOut(id=c, sessions=n, first_date=a, last_date=b)
                           for c, n, a, b in page],
            next_cursor=_next(page[-1][0]) if len(mine) > limit else None))

    async def get_conversation(self, call, cid) -> _Answer:
        from .protocol import ConversationOut

        try:
            n, a, b = await self.backend.conversation(qualify(call.tenant, cid))
        except NotFound:
            raise _not_found(cid) from None
        return _json(200, ConversationOut(id=cid, sessions=n, first_date=a, last_date=b))

    async def forget(self, call, cid) -> _Answer:
        from .protocol import ForgottenOut

        try:
            await self.backend.forget(qualify(call.tenant, cid))
        except NotFound:
            raise _not_found(cid) from None
        except ValueError as e:  # Conflict: it holds a dataset's evaluation questions
            raise ApiError("conflict",
                           str(e).replace(qualify(call.tenant, cid), cid)) from None
        return _json(200, ForgottenOut(forgotten=cid))

    # ------------------------------------------------------------------ sessions
    async def add_sessions(self, call, cid) -> _Answer:
        from .protocol import AddedOut, AddedSession

        body = await self._body(call, SessionIn)
        items = list(body.sessions) if isinstance(body, SessionsIn) else [body]
        if len(items) > self.limits.max_sessions:
            raise ApiError("invalid_value", f"sessions: {len(items)} sessions, more than "
                                            f"this server adds in one request "
                                            f"({self.limits.max_sessions}; memgas serve "
                                            "--max-sessions)")
        try:
            added = await self.backend.add_sessions(qualify(call.tenant, cid), items)
        except Conflict as e:
            raise ApiError("conflict", f"conversation {cid!r} {e}") from None
        except (TypeError, ValueError) as e:
            raise error_of(e) from None
        return _json(201, AddedOut(conversation_id=cid,
                                   added=[AddedSession(**a) for a in added]))

    async def list_sessions(self, call, cid) -> _Answer:
        from .protocol import SessionInfo, SessionsPage

        after = _cursor(call.query.get("cursor"), "sessions", list)
        limit = call.query.get("limit", self.limits.default_page)
        try:
            got = await self.backend.sessions(qualify(call.tenant, cid))
        except NotFound:
            raise _not_found(cid) from None
        offset = 0
        if after is not None:  # writes between two pages shift the positions: the next
            offset, last, following = after  # page starts with the session that came
            ids = [s["id"] for s in got]     # next, else after the last one shown
            if not (offset < len(ids) and ids[offset] == following):
                if following in ids:
                    offset = ids.index(following)
                elif last in ids:
                    offset = ids.index(last) + 1
                else:  # both removed: from where they were
                    offset = min(offset - 1, len(ids))
        page = got[offset:offset + limit]
        end = offset + len(page)
        return _json(200, SessionsPage(
            conversation_id=cid, sessions=[SessionInfo(**s) for s in page],
            next_cursor=_next([end, page[-1]["id"], got[end]["id"]]) if len(got) > end
            else None))

    async def get_session(self, call, cid, sid) -> _Answer:
        from .protocol import SessionOut

        try:
            got = await self.backend.get_session(qualify(call.tenant, cid), sid)
        except NotFound as e:
            raise _not_found(cid, sid if e.what == "session" else None) from None
        return _json(200, SessionOut(**got))

    async def replace_session(self, call, cid, sid) -> _Answer:
        from .protocol import AddedSession, ReplacedOut

        body = await self._body(call, SessionIn)
        if isinstance(body, SessionsIn):
            raise ApiError("invalid_value", "sessions: PUT replaces one session (send it "
                                            "as the body)")
        if body.id != sid:
            raise ApiError("invalid_value", f"id: {body.id!r} is not the session of the "
                                            f"path ({sid!r}); to rename, remove and add")
        try:
            got = await self.backend.replace_session(qualify(call.tenant, cid), body)
        except NotFound as e:
            raise _not_found(cid, sid if e.what == "session" else None) from None
        except (TypeError, ValueError) as e:
            raise error_of(e) from None
        return _json(200, ReplacedOut(conversation_id=cid, replaced=AddedSession(**got)))

    async def remove_session(self, call, cid, sid) -> _Answer:
        from .protocol import RemovedOut

        try:
            await self.backend.remove_session(qualify(call.tenant, cid), sid)
        except NotFound as e:
            raise _not_found(cid, sid if e.what == "session" else None) from None
        return _json(200, RemovedOut(conversation_id=cid, removed=sid))

    # ------------------------------------------------------------------ search
    async def search(self, call) -> _Answer:
        from .protocol import SearchOut, SearchResultOut

        body: SearchIn = await self._body(call, SearchIn)
        if len(body.questions) > self.limits.max_questions:
            raise ApiError("invalid_value", f"questions: {len(body.questions)} questions, "
                                            f"more than this server answers in one search "
                                            f"({self.limits.max_questions}; memgas serve "
                                            "--max-questions)")
        t = call.tenant
        asked = body.conversation_id
        cids = ([qualify(t, c) for c in asked] if isinstance(asked, list)
                else qualify(t, asked))
        try:
            request = self.backend.request(cids, list(body.questions), body.kwargs())
        except (TypeError, ValueError) as e:
            raise error_of(e) from None
        results = await self.backend.search(request, t)
        out = []
        for r in results:
            d = r.to_dict()
            d["conversation_id"] = unqualify(t, d["conversation_id"])
            out.append(SearchResultOut.model_validate(d))
        # a non-finite score is refused by the model (a bug: logged, answered 500)
        return _json(200, SearchOut(results=out))


def _shown_path(scope) -> str:
    p = scope.get("path", "")
    return p if len(p) <= 200 else p[:200] + "…"


def create_app(backend, keys=None, limits: Optional[Limits] = None,
               metrics: Optional[Metrics] = None, *, version: str = "") -> ServeApp:
    """The ASGI app over ``backend`` (a :class:`~memgas_gpu.serve.LocalBackend` or the
    Ray Serve one).

    Args:
        keys: a :class:`~memgas_gpu.serve.KeyRing` (tenants), or None: no keys, the
            memory's own ids.
        limits: what one request may ask (:class:`~.protocol.Limits`; default: its
            defaults).
        metrics: the request counters (default: new ones).
        version: the API version shown in ``/openapi.json`` (default: the package's).
    """
    if not version:
        from .. import __version__ as version
    return ServeApp(backend, keys, limits or Limits(), metrics or Metrics(), version)

