"""The transport of ``memgas serve``: uvicorn's h11 HTTP/1.1 protocol, bounded, so that no
client can hold what others need (:class:`~memgas_gpu.serve.protocol.Limits`).

Before the app sees a request, one connection may take at most:

* ``max_header_bytes`` of request line and headers: more is answered **431** (here
  when the header section is still incomplete at that size, so that no more of it is
  kept; by the app when it came whole in one read);
* ``header_timeout_s`` from the moment it is accepted (or from the end of its previous
  response) to the end of its request's headers: then it is answered **408** if part of
  a request came, or closed without a word if nothing did (a socket opened and left
  half-open, or a trickle of bytes, is dropped);
* ``keep_alive_s`` of idleness between requests: then it is closed;
* one of ``max_connections``: a connection beyond them is answered **503** as soon as it
  is accepted, and closed.

Each answer given here is the protocol's JSON error (``{"error": {"code", "message"}}``)
with ``Connection: close``; a request that is not HTTP/1.1 gets ``bad_request`` (400).
After a 431, 400 or 503 the server stops sending and reads (and drops) what the client
still sends for at most :data:`LINGER_S`, so that the answer reaches a client that is
still writing instead of being lost to a connection reset.  The body's size and time,
the count of header lines and the other counts are the app's (:mod:`.app`).

Use :func:`uvicorn_config` to run an app with these bounds.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from .protocol import ApiError, Limits

__all__ = ["LimitedH11Protocol", "protocol_class", "uvicorn_config", "error_response",
           "LINGER_S"]

log = logging.getLogger("memgas_gpu.serve")

#: seconds a refused connection is read (and dropped) after its answer, at most
LINGER_S = 1.0
#: seconds between two warnings that connections are refused
_WARN_EVERY_S = 60.0
_last_warning = [float("-inf")]


def error_response(code: str, message: str) -> bytes:
    """The bytes of a whole HTTP/1.1 error answer: status of ``code`` (a key of
    :data:`~.protocol.ERRORS`), its JSON error body, ``Connection: close``."""
    e = ApiError(code, message)
    body = json.dumps(e.body()).encode("utf-8")
    head = (f"HTTP/1.1 {e.status} {STATUS_PHRASES[e.status].decode()}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class _Connection(h11.Connection):
    """An h11 server connection that keeps the error it raised (h11 says which status
    the error calls for: 431 for a header section over the bound)."""

    error: Optional[h11.RemoteProtocolError] = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.error = e
            raise


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under :attr:`limits` (see the module docstring).  Made for
    one :class:`Limits` by :func:`protocol_class`."""

    limits: Limits = Limits()

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        lim = self.limits
        self.conn = _Connection(h11.SERVER, max_incomplete_event_size=lim.max_header_bytes)
        self.timeout_keep_alive = lim.keep_alive_s
        # uvicorn's own check answers in plain text: the bound is checked here instead
        self.limit_concurrency = None
        self._inner_app, self.app = self.app, self._bounded_app
        self._header_timer = None
        self._linger = None
        self._answered = False  # an answer of ours was sent: what comes now is dropped

    # ------------------------------------------------------------------ the timer
    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s,
                                                  self._header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self._answered:
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._answer("timeout", "the request's headers were not sent within "
                                    f"{self.limits.header_timeout_s:g} s", linger=False)
        else:  # nothing of a new request came: an idle connection, closed silently
            self.transport.close()

    # ------------------------------------------------------------------ answers of ours
    def _answer(self, code: str, message: str, linger: bool = True) -> None:
        """Send the error answer ``code``, then close (after lingering, with
        ``linger``)."""
        self._answered = True
        self._disarm()
        self._unset_keepalive_if_required()
        self.transport.write(error_response(code, message))
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()  # sent after the answer; reads go on
            self.flow.resume_reading()
            self._linger = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:  # h11 refused the request
        err = getattr(self.conn, "error", None)
        if err is not None and err.error_status_hint == 431:
            self._answer("headers_too_large", "the request line and headers take more "
                                              f"than {self.limits.max_header_bytes} bytes")
        else:
            self._answer("bad_request", "not a valid HTTP/1.1 request")

    async def _bounded_app(self, scope, receive, send) -> None:
        # requests running at once (those of connections gone included), as uvicorn's
        # limit_concurrency counts them
        if len(self.tasks) > self.limits.max_connections:
            e = ApiError("unavailable", "too many requests at once; try again later")
            body = json.dumps(e.body()).encode("utf-8")
            await send({"type": "http.response.start", "status": e.status, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self._inner_app(scope, receive, send)

    # ------------------------------------------------------------------ uvicorn's hooks
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        n = len(self.connections)
        if n > self.limits.max_connections:
            now = time.monotonic()
            if now - _last_warning[0] >= _WARN_EVERY_S:
                _last_warning[0] = now
                log.warning("memgas serve: %d connections open, more than "
                            "--max-connections %d: new ones are answered 503", n - 1,
                            self.limits.max_connections)
            self._answer("unavailable", f"the server has {self.limits.max_connections} "
                                        "connections open, its bound; try again later")
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return  # lingering: dropped
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a new request's headers are in
            self._disarm()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm()  # the next request's headers are due from now
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._answered:
            self.transport.close()
        else:
            super().shutdown()


def protocol_class(limits: Limits) -> type:
    """A :class:`LimitedH11Protocol` subclass bound to ``limits`` (what uvicorn's
    ``Config(http=...)`` takes)."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,), {"limits": limits})


def uvicorn_config(app, limits: Limits = Limits(), **options) -> "uvicorn.Config":
    """The uvicorn configuration of ``memgas serve`` for the ASGI ``app``: the h11
    protocol under ``limits``, no WebSocket, no lifespan, no ``Server`` header and no
    uvicorn access log (the app logs its own), 30 s to finish requests on shutdown,
    uvicorn's warnings only.  ``options`` override or add ``uvicorn.Config`` arguments."""
    kw = dict(http=protocol_class(limits), ws="none", lifespan="off",
              h11_max_incomplete_event_size=limits.max_header_bytes,
              timeout_keep_alive=limits.keep_alive_s,
              limit_concurrency=limits.max_connections, server_header=False,
              access_log=False, timeout_graceful_shutdown=30, log_level="warning")
    kw.update(options)
    return uvicorn.Config(app, **kw)
