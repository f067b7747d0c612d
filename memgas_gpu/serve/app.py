"""The HTTP JSON service of ``memgas serve`` (a Starlette ASGI app).

Routes (ids are path segments, percent-encoded: ``%2F`` is a ``/`` inside an id)::

    GET    /healthz                                      200 when ready
    GET    /metrics                                      Prometheus text
    GET    /v1/conversations                             the caller's conversations
    POST   /v1/conversations/{cid}/sessions              add one session, or {"sessions": [...]}
    GET    /v1/conversations/{cid}/sessions              list its sessions
    GET    /v1/conversations/{cid}/sessions/{sid}        one session
    DELETE /v1/conversations/{cid}/sessions/{sid}        remove one session
    DELETE /v1/conversations/{cid}                       forget the conversation
    POST   /v1/search                                    rank sessions for questions

Every error is ``{"error": {"code", "message"}}`` (:mod:`.protocol`), the message naming
the field; no answer holds a traceback.  With keys (:mod:`.tenants`) every ``/v1`` route
needs ``Authorization: Bearer KEY`` and sees only its tenant's conversations.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Optional
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .backend import Conflict, NotFound
from .metrics import Metrics
from .protocol import (MAX_BODY_BYTES, ApiError, check_id, error_body, parse_search,
                       parse_sessions)
from .tenants import owns, qualify, unqualify

__all__ = ["create_app", "ROUTES"]

log = logging.getLogger("memgas_gpu.serve")

CID, SID = "{cid}", "{sid}"
#: (method, path segments, handler name); ``{cid}`` / ``{sid}`` match one segment
ROUTES = (
    ("GET", ("healthz",), "healthz"),
    ("GET", ("metrics",), "metrics"),
    ("GET", ("v1", "conversations"), "list_conversations"),
    ("POST", ("v1", "conversations", CID, "sessions"), "add_sessions"),
    ("GET", ("v1", "conversations", CID, "sessions"), "list_sessions"),
    ("GET", ("v1", "conversations", CID, "sessions", SID), "get_session"),
    ("DELETE", ("v1", "conversations", CID, "sessions", SID), "remove_session"),
    ("DELETE", ("v1", "conversations", CID), "forget"),
    ("POST", ("v1", "search"), "search"),
)
_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"]


def _match(segments: list) -> tuple[dict, dict]:
    """``({method: (handler, params)}, pattern)`` of the routes matching ``segments``."""
    found, pattern = {}, None
    for method, pat, name in ROUTES:
        if len(pat) != len(segments):
            continue
        params = {}
        for p, s in zip(pat, segments):
            if p in (CID, SID):
                params[p[1:-1]] = s
            elif p != s:
                break
        else:
            found[method] = (name, params)
            pattern = "/" + "/".join(pat)
    return found, pattern


def _segments(scope) -> list:
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    raw = raw.split(b"?", 1)[0]
    parts = raw.decode("latin-1").split("/")[1:]
    try:
        return [unquote(p, errors="strict") for p in parts]
    except UnicodeDecodeError:
        raise ApiError("bad_request", "the path is not valid percent-encoded UTF-8") from None


def _json(status: int, body) -> Response:
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a non-finite score: a bug, never silently "NaN"
        log.error("an answer held a non-finite number")
        status, text = 500, json.dumps(error_body("internal", "the answer held a "
                                                              "non-finite number"))
    return Response(text, status_code=status, media_type="application/json")


def _error(e: ApiError) -> Response:
    r = _json(e.status, error_body(e.code, e.message))
    if e.code == "unauthorized":
        r.headers["WWW-Authenticate"] = "Bearer"
    return r


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class _Service:
    def __init__(self, backend, keys, max_body_bytes: int, metrics: Metrics) -> None:
        self.backend, self.keys = backend, keys
        self.max_body = max_body_bytes
        self.counters = metrics
        self.closing = False

    # ------------------------------------------------------------------ plumbing
    async def dispatch(self, request: Request) -> Response:
        t0 = time.perf_counter()
        route = "unmatched"
        try:
            segments = _segments(request.scope)
            found, pattern = _match(segments)
            if not found:
                raise ApiError("not_found", f"no route {request.url.path!r} (see the routes "
                                            "in the documentation, docs/serving.md)")
            route = pattern
            if request.method not in found:
                raise ApiError("method_not_allowed",
                               f"{pattern} takes {', '.join(sorted(found))}, not "
                               f"{request.method}")
            name, params = found[request.method]
            for k, v in params.items():
                check_id(v, "conversation id" if k == "cid" else "session id")
            tenant = None
            if segments[0] == "v1":
                if self.closing:
                    raise ApiError("unavailable", "the server is shutting down")
                tenant = self._tenant(request)
            resp = await getattr(self, name)(request, tenant, **params)
        except ApiError as e:
            resp = _error(e)
        except Exception:  # noqa: BLE001 - a bug: logged here, never sent
            log.exception("%s %s failed", request.method, route)
            resp = _error(ApiError("internal", "internal error (the server logged it)"))
        self.counters.observe(request.method, route, resp.status_code, time.perf_counter() - t0)
        return resp

    def _tenant(self, request: Request) -> Optional[str]:
        if self.keys is None:
            return None
        auth = request.headers.get("authorization", "")
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

    async def _body(self, request: Request):
        n = request.headers.get("content-length")
        if n is not None:
            if not n.strip().isdigit():
                raise ApiError("bad_request", "the Content-Length header is not a number")
            if int(n) > self.max_body:
                raise ApiError("too_large", f"the body has {int(n)} bytes, more than the "
                                            f"server takes ({self.max_body})")
        buf = bytearray()
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > self.max_body:
                raise ApiError("too_large", f"the body is larger than the server takes "
                                            f"({self.max_body} bytes)")
        if not buf.strip():
            raise ApiError("bad_request", "the body is empty: send a JSON object")
        try:
            return json.loads(bytes(buf), parse_constant=_no_constant)
        except RecursionError:
            raise ApiError("bad_request", "the body is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError("bad_request", f"the body is not JSON ({str(e)[:200]})") from None

    # ------------------------------------------------------------------ routes
    async def healthz(self, request, tenant) -> Response:
        if self.closing:
            return _json(503, {"status": "shutting down"})
        return _json(200, {"status": "ok"})

    async def metrics(self, request, tenant) -> Response:
        text = self.counters.render(await self.backend.stats())
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def list_conversations(self, request, tenant) -> Response:
        convs = await self.backend.conversations()
        return _json(200, {"conversations": [
            {"id": unqualify(tenant, c), "session_ids": ids, "session_dates": dates}
            for c, ids, dates in convs if owns(tenant, c)]})

    async def add_sessions(self, request, tenant, cid) -> Response:
        items = parse_sessions(await self._body(request))
        try:
            added = await self.backend.add_sessions(qualify(tenant, cid), items)
        except Conflict as e:
            raise ApiError("conflict", f"conversation {cid!r} {e}") from None
        except (TypeError, ValueError) as e:
            raise ApiError.of(e) from None
        return _json(201, {"conversation_id": cid, "added": added})

    async def list_sessions(self, request, tenant, cid) -> Response:
        try:
            got = await self.backend.sessions(qualify(tenant, cid))
        except NotFound:
            raise _not_found(cid) from None
        return _json(200, {"conversation_id": cid, "sessions": got})

    async def get_session(self, request, tenant, cid, sid) -> Response:
        try:
            got = await self.backend.get_session(qualify(tenant, cid), sid)
        except NotFound as e:
            raise _not_found(cid, sid if e.what == "session" else None) from None
        return _json(200, got)

    async def remove_session(self, request, tenant, cid, sid) -> Response:
        try:
            await self.backend.remove_session(qualify(tenant, cid), sid)
        except NotFound as e:
            raise _not_found(cid, sid if e.what == "session" else None) from None
        return _json(200, {"conversation_id": cid, "removed": sid})

    async def forget(self, request, tenant, cid) -> Response:
        try:
            await self.backend.forget(qualify(tenant, cid))
        except NotFound:
            raise _not_found(cid) from None
        except Conflict as e:
            raise ApiError("conflict", str(e).replace(qualify(tenant, cid), cid)) from None
        return _json(200, {"forgotten": cid})

    async def search(self, request, tenant) -> Response:
        args = parse_search(await self._body(request))
        asked = args["conversation_id"]
        args["conversation_id"] = ([qualify(tenant, c) for c in asked]
                                   if isinstance(asked, list) else qualify(tenant, asked))
        try:
            self.backend.check_search(args)
        except (TypeError, ValueError) as e:
            raise ApiError.of(e) from None
        results = await self.backend.search(args)
        out = []
        for r in results:
            d = r.to_dict()
            d["conversation_id"] = unqualify(tenant, d["conversation_id"])
            out.append(d)
        return _json(200, {"results": out})


def _not_found(cid: str, sid: Optional[str] = None) -> ApiError:
    if sid is None:
        return ApiError("not_found", f"no conversation {cid!r}")
    return ApiError("not_found", f"conversation {cid!r} has no session {sid!r}")


def create_app(backend, keys=None, max_body_bytes: int = MAX_BODY_BYTES,
               metrics: Optional[Metrics] = None) -> Starlette:
    """The ASGI app over ``backend`` (a :class:`~memgas_gpu.serve.LocalBackend` or the
    Ray Serve one).

    Args:
        keys: a :class:`~memgas_gpu.serve.KeyRing` (tenants), or None: no keys, the
            memory's own ids.
        max_body_bytes: larger request bodies get 413.
        metrics: the request counters (default: new ones).

    ``app.state.service.closing = True`` makes ``/v1`` routes answer 503 and
    ``/healthz`` 503 (set while shutting down).
    """
    svc = _Service(backend, keys, max_body_bytes, metrics or Metrics())
    app = Starlette(routes=[Route("/{path:path}", svc.dispatch, methods=_METHODS)])
    app.state.service = svc
    return app
