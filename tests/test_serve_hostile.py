"""``memgas serve`` against hostile clients, over real sockets: a real uvicorn server
with the configuration ``memgas serve`` runs (:func:`memgas_gpu.serve.http.uvicorn_config`)
in a thread, the app over a small memory.  Each limit has a bound: half-open sockets
dropped in time while ``/healthz`` keeps answering, a 64 MB header refused with 431
without growing the server, too many headers, an idle keep-alive connection, a body
sent half, a client hanging up, too many connections, and a second server on a held
folder refused in about a second without importing torch."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.serve import Batcher, LocalBackend, create_app
from memgas_gpu.serve.http import uvicorn_config
from memgas_gpu.serve.metrics import Metrics
from memgas_gpu.serve.protocol import ERRORS, Limits

ROOT = Path(__file__).resolve().parents[1]
#: seconds of slack on every time bound (a loaded CI machine)
SLACK = 1.5


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list = []

    def emit(self, record) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_enc):
    """``(backend, folder)``: a small memory opened for writing (its folder locked)."""
    import asyncio

    folder = tmp_path_factory.mktemp("hostile") / "mem"
    mem = MemoryIndex.open(folder, encoder=tiny_enc)
    backend = LocalBackend(mem, Batcher(mem, 8, 2))
    yield backend, folder
    asyncio.run(backend.close())


@contextlib.contextmanager
def server(backend, metrics=None, **limits):
    """The app over ``backend`` under ``Limits(**limits)``, served by uvicorn as
    ``memgas serve`` configures it; yields ``(port, log records)``."""
    import uvicorn

    lim = Limits(**limits)
    records = _Records()
    loggers = [logging.getLogger(n) for n in ("memgas_gpu.serve", "uvicorn")]
    for lg in loggers:
        lg.addHandler(records)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    app = create_app(backend, limits=lim, metrics=metrics)
    srv = uvicorn.Server(uvicorn_config(app, lim, log_config=None,
                                        timeout_graceful_shutdown=5))
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and t.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1], records.records
    finally:
        srv.should_exit = True
        t.join(15)
        sock.close()
        for lg in loggers:
            lg.removeHandler(records)
        assert not t.is_alive(), "the server did not stop"


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_to_eof(s: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What ``s`` receives until the server closes it (``eof`` True) or ``timeout``."""
    data, deadline = b"", time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return data, False
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk


def read_answer(s: socket.socket, timeout: float = 5.0) -> bytes:
    """One whole answer (by its Content-Length) from ``s``, or what came until the
    server closed it or ``timeout``."""
    raw, deadline = b"", time.monotonic() + timeout
    while True:
        head, sep, body = raw.partition(b"\r\n\r\n")
        if sep and len(body) >= int(parse(raw)[1].get("content-length", 0)):
            return raw
        left = deadline - time.monotonic()
        if left <= 0:
            return raw
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            return raw
        if not chunk:
            return raw
        raw += chunk


def parse(raw: bytes) -> tuple[int, dict, bytes]:
    """``(status, headers, body)`` of one HTTP answer."""
    assert raw, "no answer: the server sent nothing"
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(":") for line in lines[1:])}
    return status, headers, body[:int(headers.get("content-length", len(body)))]


def assert_error(status: int, headers: dict, body: bytes, code: str) -> None:
    """A JSON error answer of the protocol with ``code``."""
    assert status == ERRORS[code][0], (status, body)
    assert headers["content-type"].startswith("application/json"), headers
    err = json.loads(body)["error"]
    assert set(err) == {"code", "message"} and err["code"] == code, err
    assert "\n" not in err["message"] and "Traceback" not in err["message"]


def healthz_seconds(port: int) -> float:
    t0 = time.monotonic()
    r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ---------------------------------------------------------------------- 1: half-open
def test_half_open_connections_are_dropped_after_the_header_timeout(served):
    backend, _ = served
    timeout = 0.5
    with server(backend, header_timeout_s=timeout) as (port, _):
        t0 = time.monotonic()
        partial = [connect(port) for _ in range(200)]
        for s in partial:
            s.sendall(b"GET /healthz HTT")  # and nothing more
        silent = [connect(port) for _ in range(20)]  # not a byte
        assert healthz_seconds(port) < 1.0  # while they are all open

        sel = selectors.DefaultSelector()
        got = {}
        for s in partial + silent:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            got[s] = b""
        closed_at = {}
        deadline = t0 + timeout + SLACK
        while len(closed_at) < len(got) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.05):
                s = key.fileobj
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    got[s] += chunk
                else:
                    closed_at[s] = time.monotonic() - t0
                    sel.unregister(s)
        sel.close()
        for s in got:
            s.close()
    open_left = len(got) - len(closed_at)
    print(f"{len(closed_at)} of {len(got)} closed at {min(closed_at.values(), default=0):.2f}"
          f"-{max(closed_at.values(), default=0):.2f} s")
    assert open_left == 0, f"{open_left} connections still open after {timeout + SLACK} s"
    assert min(closed_at.values()) >= timeout * 0.8, min(closed_at.values())  # not at once
    for s in partial:
        assert_error(*parse(got[s]), "timeout")
        assert parse(got[s])[1]["connection"] == "close"
    assert all(got[s] == b"" for s in silent)  # nothing asked, nothing answered


# ---------------------------------------------------------------------- 2: huge headers
def _send_huge_header(port: int, out: dict) -> None:
    """Send a header of 64 MB in chunks, stopping once the server answers."""
    s = connect(port)
    chunk = b"a" * 65536
    sent, t0 = 0, time.monotonic()
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        while sent < 64 << 20:
            if select.select([s], [], [], 0)[0]:  # the server answered
                break
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        raw, eof = read_to_eof(s, 5)
        out.update(raw=raw, eof=eof, sent=sent, seconds=time.monotonic() - t0)
    finally:
        s.close()


def test_a_64_mb_header_is_refused_with_431_quickly_and_without_growing(served):
    backend, _ = served
    with server(backend) as (port, _):
        healthz_seconds(port)
        one: dict = {}
        _send_huge_header(port, one)  # once, so that what the server allocates is there
        before = rss_bytes()
        outs = [dict() for _ in range(4)]
        threads = [threading.Thread(target=_send_huge_header, args=(port, o)) for o in outs]
        for t in threads:
            t.start()
        worst = max(healthz_seconds(port) for _ in range(5))  # while they send
        for t in threads:
            t.join(30)
        grown = rss_bytes() - before
        assert healthz_seconds(port) < 1.0
    print(f"431 after {max(o['sent'] for o in outs) / 2**10:.0f} KiB at most, "
          f"{max(o['seconds'] for o in outs):.2f} s; /healthz {worst:.3f} s meanwhile; "
          f"RSS {grown / 2**20:+.1f} MB")
    assert worst < 1.0, worst
    for o in [one] + outs:
        status, headers, body = parse(o["raw"])
        assert_error(status, headers, body, "headers_too_large")
        assert headers["connection"] == "close" and o["eof"]
        assert o["sent"] < 16 << 20, o["sent"]  # answered long before the 64 MB
        assert o["seconds"] < 2.0, o["seconds"]
    assert grown < 8 << 20, f"the server grew by {grown / 2**20:.1f} MB"


def test_a_header_section_over_the_bound_in_one_piece_is_refused_with_431(served):
    # h11 bounds a header section still incomplete; one that came whole in a read is
    # parsed, and the app measures it
    backend, _ = served
    with server(backend, max_header_bytes=4096) as (port, _):
        for size in (5000, 100_000):
            s = connect(port)
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size
                          + b"\r\n\r\n")
                raw, eof = read_to_eof(s, 2 + SLACK)
            finally:
                s.close()
            status, headers, body = parse(raw)
            assert_error(status, headers, body, "headers_too_large")
            assert eof and headers["connection"] == "close"


# ---------------------------------------------------------------------- 3: many headers
def test_150_headers_are_refused_with_431(served):
    backend, _ = served
    with server(backend) as (port, _):
        s = connect(port)
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                      + b"".join(b"X-H%d: 1\r\n" % i for i in range(149)) + b"\r\n")
            raw, eof = read_to_eof(s, 2 + SLACK)
        finally:
            s.close()
        status, headers, body = parse(raw)
        assert_error(status, headers, body, "headers_too_large")
        assert "150 header lines" in json.loads(body)["error"]["message"]
        assert eof and headers["connection"] == "close"
        assert healthz_seconds(port) < 1.0


# ---------------------------------------------------------------------- 4: keep-alive
def _idle_after_one_request(port: int, timeout: float) -> tuple[bytes, bool, float]:
    """One request on a keep-alive connection, its answer read; then what comes (and
    when the server closes it) while the client says nothing."""
    s = connect(port)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert parse(read_answer(s))[0] == 200
        t0 = time.monotonic()
        more, eof = read_to_eof(s, timeout)
        return more, eof, time.monotonic() - t0
    finally:
        s.close()


def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_s(served):
    backend, _ = served
    with server(backend, keep_alive_s=0.3, header_timeout_s=10) as (port, _):
        more, eof, seconds = _idle_after_one_request(port, 3.0)
    assert eof and more == b"", more  # closed, and nothing sent to an idle client
    assert 0.2 <= seconds < 0.3 + SLACK, seconds
    # the header timeout shorter than the keep-alive: still closed without a word (a
    # stale 408 would be read as the answer to the client's next request)
    with server(backend, keep_alive_s=10, header_timeout_s=0.3) as (port, _):
        more, eof, seconds = _idle_after_one_request(port, 3.0)
    assert eof and more == b"", more
    assert 0.2 <= seconds < 0.3 + SLACK, seconds


# ---------------------------------------------------------------------- 5: half a body
def test_a_body_sent_half_is_answered_408_and_closed(served):
    backend, _ = served
    with server(backend, body_timeout_s=0.5) as (port, _):
        s = connect(port)
        try:
            s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: 100\r\n\r\n" + b"{" * 50)
            t0 = time.monotonic()
            raw, eof = read_to_eof(s, 0.5 + SLACK + 1)
            seconds = time.monotonic() - t0
        finally:
            s.close()
        assert healthz_seconds(port) < 1.0
    assert raw, "no answer"
    status, headers, body = parse(raw)
    assert_error(status, headers, body, "timeout")
    assert eof and headers["connection"] == "close"
    assert 0.4 <= seconds < 0.5 + SLACK, seconds


# ---------------------------------------------------------------------- 6: hang-ups
def test_a_client_hanging_up_mid_body_costs_no_5xx_and_no_traceback(served):
    backend, _ = served
    metrics = Metrics()
    with server(backend, metrics=metrics) as (port, records):
        for n in (1, 10, 100):
            s = connect(port)
            s.sendall(b"POST /v1/conversations/c/sessions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                      + b" " * n)
            time.sleep(0.05)  # the app is reading the body
            s.close()
        s = connect(port)
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Le")  # mid-headers
        s.close()
        deadline = time.monotonic() + 5
        while metrics.render().count('status="499"') == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        assert healthz_seconds(port) < 1.0
    bad = [r for r in records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]
    text = metrics.render()
    assert not [line for line in text.splitlines()
                if line.startswith("memgas_requests_total") and 'status="5' in line], text
    assert 'status="499"' in text  # the hang-ups were seen


# ---------------------------------------------------------------------- 7: connections
def test_connections_over_the_bound_are_answered_503_and_the_server_recovers(served):
    backend, _ = served
    with server(backend, max_connections=5, keep_alive_s=10, header_timeout_s=10) as \
            (port, _):
        held = []
        for _ in range(5):  # the bound: all served
            s = connect(port)
            held.append(s)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert parse(read_answer(s))[0] == 200
        t0 = time.monotonic()
        extra = [connect(port) for _ in range(3)]
        for s in extra:  # answered on arrival, without sending anything
            raw, eof = read_to_eof(s, 1.0 + SLACK)
            s.close()
            assert eof
            status, headers, body = parse(raw)
            assert_error(status, headers, body, "unavailable")
            assert headers["connection"] == "close"
        assert time.monotonic() - t0 < 1.0 + SLACK
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)  # a client's view
        assert_error(r.status_code, dict(r.headers), r.content, "unavailable")
        for s in held:
            s.close()
        deadline = time.monotonic() + 2
        while True:  # the server sees the closes, then serves again
            r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.status_code == 200, r.text
        assert healthz_seconds(port) < 1.0


def test_requests_left_running_by_gone_clients_count_against_the_bound(served,
                                                                       monkeypatch):
    # a client that asks and hangs up, again and again, leaves its requests running:
    # they count as uvicorn's limit_concurrency counts them (answered in JSON)
    import asyncio

    backend, _ = served
    ready = backend.ready

    async def slow_ready():
        await asyncio.sleep(1.5)
        return await ready()

    monkeypatch.setattr(backend, "ready", slow_ready)
    with server(backend, max_connections=2) as (port, _):
        for _ in range(2):
            s = connect(port)
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.2)  # its request is running
            s.close()
        time.sleep(0.2)
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert_error(r.status_code, dict(r.headers), r.content, "unavailable")
        time.sleep(1.5)  # they end
        assert healthz_seconds(port) < 1.0


# ---------------------------------------------------------------------- 8: held folder
#: runs ``memgas ARGS``, then writes the heavy modules it imported to the file ARGV[1]
_CLI = """
import atexit, sys
out = sys.argv.pop(1)
heavy = ("torch", "numpy", "pydantic", "uvicorn", "transformers")
atexit.register(lambda: open(out, "w").write(
    " ".join(m for m in heavy if m in sys.modules)))
from memgas_gpu.cli.main import main
sys.argv[0] = "memgas"
main()
"""


def run_cli(args: list, tmp_path: Path) -> tuple[subprocess.CompletedProcess, float, str]:
    """``memgas ARGS`` in a process: its result, seconds from start to exit, and the
    heavy modules it imported."""
    record = tmp_path / "imported.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", _CLI, str(record), *args], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - t0
    imported = record.read_text()
    record.unlink()
    return p, seconds, imported


def test_a_second_server_on_a_held_folder_is_refused_at_once(served, tmp_path):
    _, folder = served  # held: the memory is open for writing in this process
    p, seconds, imported = run_cli(["serve", str(folder), "--port", "0"], tmp_path)
    print(f"refused in {seconds:.2f} s")
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert str(folder / ".lock") in lines[0] and f"process {os.getpid()}" in lines[0]
    assert imported == "", f"imported {imported} before refusing"
    assert seconds < 5.0, seconds  # about 0.5 s on an idle machine (see the report)


def test_serve_tries_the_lock_before_opening_the_memory(served, monkeypatch):
    from memgas_gpu.serve import run
    from memgas_gpu.storage.lock import IndexLockError

    _, folder = served

    def never(opts):
        raise AssertionError("the memory was opened before the lock was tried")

    monkeypatch.setattr(run, "local_backend", never)
    with pytest.raises(IndexLockError, match=r"\.lock: the memory is open for writing"):
        run.serve(run.ServeOptions(str(folder), port=0), out=lambda url: None,
                  note=lambda m: None)


def test_the_limit_flags_and_their_help(tmp_path):
    p, _, imported = run_cli(["serve", "--help"], tmp_path)
    assert p.returncode == 0 and imported == "", imported  # --help loads nothing heavy
    lim = Limits()
    flags = {"--max-questions": lim.max_questions, "--max-sessions": lim.max_sessions,
             "--max-body-bytes": lim.max_body_bytes, "--header-timeout": lim.header_timeout_s,
             "--body-timeout": lim.body_timeout_s, "--keep-alive": lim.keep_alive_s,
             "--max-connections": lim.max_connections}
    text = " ".join(p.stdout.split())
    for flag, default in flags.items():  # the help states Limits' own defaults
        after = text[text.index(flag):]
        assert f"[default: {default}" in after[:400], (flag, default)
    from click.testing import CliRunner

    from memgas_gpu.cli.main import cli

    for bad in (["--header-timeout", "0"], ["--keep-alive", "nan"],
                ["--max-connections", "0"], ["--max-body-bytes", "-1"],
                ["--compact-after", "-1"], ["--compact-after", "soon"],
                ["--body-timeout", "-2"]):
        res = CliRunner().invoke(cli, ["serve", str(tmp_path / "m"), *bad])
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and bad[0] in lines[0], res.output
    assert not (tmp_path / "m").exists()


def test_limits_reach_the_server_options():
    from memgas_gpu.serve.run import ServeOptions

    opts = ServeOptions("f")
    assert opts.limits == Limits() and opts.compact_after_s == 60.0 and opts.access_log
    lim = replace(Limits(), max_connections=7)
    cfg = uvicorn_config(object(), lim)
    assert cfg.limit_concurrency == 7 and cfg.http.limits is lim
    assert cfg.timeout_keep_alive == lim.keep_alive_s and not cfg.server_header
    assert cfg.h11_max_incomplete_event_size == lim.max_header_bytes


def test_the_open_file_limit_is_raised_to_fit_the_connections():
    import resource

    from memgas_gpu.serve.run import raise_file_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1000:
        pytest.skip(f"the hard open-file limit is {hard}")
    notes: list = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
        raise_file_limit(Limits(max_connections=500), notes.append)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 500 and notes == []
        if hard != resource.RLIM_INFINITY:  # more than the system allows: said once
            raise_file_limit(Limits(max_connections=hard), notes.append)
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
            assert len(notes) == 1 and "--max-connections" in notes[0], notes
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
