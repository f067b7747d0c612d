"""Run ``memgas serve``: bind, try the folder's lock, open the memory, serve it with
uvicorn under the limits of :mod:`.http` until SIGINT/SIGTERM, then close the memory
(its checkpoint).

The one line on stdout is the server's URL, printed once it accepts connections (port 0
picks a free port; the line shows the real one).  Everything else goes to stderr.
"""
from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:  # imported on use: refusing a held folder needs no pydantic
    from .protocol import Limits

__all__ = ["ServeOptions", "serve", "bind", "is_local", "url_of", "Server", "probe_lock",
           "raise_file_limit"]

#: open files kept for the memory, the batcher and Python beside the connections
_SPARE_FILES = 256


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
    """What ``memgas serve`` was asked for (see :func:`serve`).

    Args:
        limits: what one client may ask (:class:`~.protocol.Limits`: sizes, counts,
            timeouts, connections; default: its defaults).
        compact_after_s: seconds after a removal before the memory is compacted (0: at
            once; None: only on ``POST /v1/compact``).
        access_log: one line per request on stderr (the ``memgas_gpu.serve.access``
            logger).
    """

    def __init__(self, folder: str, host: str = "127.0.0.1", port: int = 8000,
                 keys=None, max_batch_size: int = 64, max_wait_ms: float = 5.0,
                 encoder: Optional[str] = None, device: Optional[str] = None,
                 ray: bool = False, replicas: int = 2, ray_address: Optional[str] = None,
                 limits: Optional[Limits] = None, compact_after_s: Optional[float] = 60.0,
                 access_log: bool = True) -> None:
        if limits is None:
            from .protocol import Limits

            limits = Limits()
        self.folder, self.host, self.port, self.keys = folder, host, port, keys
        self.max_batch_size, self.max_wait_ms = max_batch_size, max_wait_ms
        self.encoder, self.device = encoder, device
        self.ray, self.replicas, self.ray_address = ray, replicas, ray_address
        self.limits, self.compact_after_s = limits, compact_after_s
        self.access_log = access_log


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
    return LocalBackend(memory, batcher, encoder=enc, compact_after_s=opts.compact_after_s)


def probe_lock(folder) -> None:
    """Refuse at once a folder that another writer holds: its lock is taken and let go
    (without importing torch), so that a second ``memgas serve`` on a folder is refused
    in well under a second instead of after loading the encoder.  The memory takes the
    lock for good when it opens.

    Raises:
        IndexLockError: another process holds the folder (naming it).
    """
    from ..storage.lock import LOCK_NAME, FolderLock

    if os.path.lexists(os.path.join(folder, LOCK_NAME)):  # else no writer ever held it
        FolderLock(folder, what="the memory is open for writing").acquire().release()


def raise_file_limit(limits: Limits, note: Callable[[str], None]) -> None:
    """Raise this process's open-file limit (the soft one, up to the hard one) so that
    ``limits.max_connections`` sockets fit beside the memory's files."""
    import resource

    want = limits.max_connections + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < want:
        note(f"warning: the open-file limit is {new} (ulimit -Hn), below "
             f"--max-connections {limits.max_connections} + {_SPARE_FILES}: a connection "
             "over it is reset by the system instead of answered 503")


def _access_log(on: bool) -> None:
    """One line per request on stderr from the app's access logger, or none."""
    access = logging.getLogger("memgas_gpu.serve.access")
    if not on:
        access.setLevel(logging.WARNING)
        return
    access.setLevel(logging.INFO)
    if not access.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        access.addHandler(handler)
        access.propagate = False


def serve(opts: ServeOptions, out: Callable[[str], None] = print,
          note: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> None:
    """Serve until SIGINT or SIGTERM; ``out`` gets the URL line once it listens,
    ``note`` the status lines.

    The port is bound first and the folder's lock tried next (a refusal comes before
    torch and the encoder load); then the memory opens and uvicorn serves it under
    ``opts.limits`` (:func:`.http.uvicorn_config`).
    """
    import asyncio

    sock = bind(opts.host, opts.port)
    try:
        if opts.ray:
            from .ray_serve import ray_backend

            raise_file_limit(opts.limits, note)
            backend = ray_backend(opts, note)
        else:
            probe_lock(opts.folder)
            raise_file_limit(opts.limits, note)
            backend = local_backend(opts)
    except BaseException:
        sock.close()
        raise
    from .app import create_app
    from .http import uvicorn_config

    _access_log(opts.access_log)
    app = create_app(backend, opts.keys, limits=opts.limits)
    server = Server(uvicorn_config(app, opts.limits))
    url = url_of(sock)
    server.announce = lambda: out(url)
    try:
        server.run(sockets=[sock])
    finally:
        app.closing = True
        sock.close()
        asyncio.run(backend.close())
        note("memgas serve: stopped; the memory is closed")
