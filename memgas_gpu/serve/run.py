"""Run ``memgas serve``: open the memory, bind, serve with uvicorn until SIGINT/SIGTERM,
then close the memory (its checkpoint).

The one line on stdout is the server's URL, printed once it accepts connections (port 0
picks a free port; the line shows the real one).  Everything else goes to stderr.
"""
from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import sys
import threading
from typing import Callable, Optional

__all__ = ["ServeOptions", "serve", "bind", "is_local", "url_of", "Server"]


def is_local(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (only this machine can
    connect)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    addrs = {i[4][0].split("%")[0] for i in infos}
    return bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    err: Optional[OSError] = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(2048)
            sock.set_inheritable(True)
            return sock
        except OSError as e:
            sock.close()
            err = e
    raise OSError(err.errno if err else 0, f"cannot listen on {host}:{port} "
                                           f"({err.strerror if err else 'no address'})")


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if sock.family == socket.AF_INET6:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, announcing its URL once it listens, and ending on
        SIGINT/SIGTERM without re-raising the signal (so the memory is closed)."""

        announce: Callable[[], None] = staticmethod(lambda: None)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                self.announce()

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            sigs = (signal.SIGINT, signal.SIGTERM)
            old = {s: signal.signal(s, self.handle_exit) for s in sigs}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

    return Server


def Server(config):  # noqa: N802 - a class, made on first use (uvicorn is optional)
    return _server_class()(config)


class ServeOptions:
    """What ``memgas serve`` was asked for (see :func:`serve`)."""

    def __init__(self, folder: str, host: str = "127.0.0.1", port: int = 8000,
                 keys=None, max_batch_size: int = 64, max_wait_ms: float = 5.0,
                 encoder: Optional[str] = None, device: Optional[str] = None,
                 ray: bool = False, replicas: int = 2, ray_address: Optional[str] = None,
                 max_body_bytes: Optional[int] = None) -> None:
        self.folder, self.host, self.port, self.keys = folder, host, port, keys
        self.max_batch_size, self.max_wait_ms = max_batch_size, max_wait_ms
        self.encoder, self.device = encoder, device
        self.ray, self.replicas, self.ray_address = ray, replicas, ray_address
        self.max_body_bytes = max_body_bytes


def local_backend(opts: ServeOptions):
    """The memory opened on ``opts.folder``, its batcher and backend."""
    from ..retrieve import MemoryIndex
    from .backend import LocalBackend
    from .batcher import Batcher

    enc = None
    if opts.encoder is not None:
        from ..encode import Encoder

        enc = Encoder(opts.encoder, device=opts.device or "cpu")
    memory = MemoryIndex.open(opts.folder, encoder=enc)
    try:
        memory.query_encoder(enc)  # loaded (and checked) now, not at the first search
        # the encoder given goes with every call: a memory that records no encoder source
        # (built with a custom one) keeps none of its own after open
        batcher = Batcher(memory, opts.max_batch_size, opts.max_wait_ms, encoder=enc,
                          device=opts.device)
    except BaseException:
        memory.close()
        raise
    return LocalBackend(memory, batcher, encoder=enc)


def serve(opts: ServeOptions, out: Callable[[str], None] = print,
          note: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> None:
    """Serve until SIGINT or SIGTERM; ``out`` gets the URL line once it listens,
    ``note`` the status lines."""
    import asyncio

    import uvicorn

    from .app import create_app
    from .protocol import MAX_BODY_BYTES

    sock = bind(opts.host, opts.port)
    try:
        if opts.ray:
            from .ray_serve import ray_backend

            backend = ray_backend(opts, note)
        else:
            backend = local_backend(opts)
    except BaseException:
        sock.close()
        raise
    app = create_app(backend, opts.keys, max_body_bytes=opts.max_body_bytes or MAX_BODY_BYTES)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=30, server_header=False)
    server = Server(config)
    url = url_of(sock)
    server.announce = lambda: out(url)
    try:
        server.run(sockets=[sock])
    finally:
        app.state.service.closing = True
        sock.close()
        asyncio.run(backend.close())
        note("memgas serve: stopped; the memory is closed")
