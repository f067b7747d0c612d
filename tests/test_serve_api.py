"""The HTTP API as platforms expect it, over real HTTP (uvicorn in a thread, httpx):
the OpenAPI document (checked by openapi-spec-validator, and every answer of the
server checked against it by jsonschema: independent validators, not our models),
pagination against the memory's own listing, a conversation's summary, a session
replaced in its place (against a memory built with the new session where the old one
was), the probes, JSON errors for everything the framework used to answer itself,
bad input that once reached a 500 or a dead end, count limits, compaction (the removed
text gone from every file of the folder, by a byte scan) and the access log."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
from pathlib import Path

import httpx
import jsonschema
import pytest

from memgas_gpu import Session
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.serve import Batcher, LocalBackend, create_app
from memgas_gpu.serve.protocol import ROUTES, Limits, openapi
from memgas_gpu.serve.tenants import parse_keys

from _memory_model import tiny_encoder
from _serve import CONVERSATIONS, assert_same, populate, running, sessions_of

ROOT = Path(__file__).resolve().parents[1]
KEY = "api-test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def encoder():
    return tiny_encoder()


@contextlib.contextmanager
def _server(folder, encoder, keys=None, limits=None, compact_after_s=None):
    mem = MemoryIndex.open(folder, encoder=encoder)
    backend = LocalBackend(mem, Batcher(mem, 16, 5), compact_after_s=compact_after_s)
    app = create_app(backend, parse_keys(json.dumps(keys), "test") if keys else None,
                     limits=limits)
    try:
        with running(app) as url:
            yield url, mem
    finally:
        asyncio.run(backend.close())


@pytest.fixture(scope="module")
def server(tmp_path_factory, encoder):
    with _server(tmp_path_factory.mktemp("api") / "mem", encoder,
                 limits=Limits(max_questions=8, max_sessions=4, max_page=50,
                               default_page=3)) as (url, mem):
        populate(mem)
        yield url, mem


# ------------------------------------------------------------------ the schema
def _validator(doc: dict, name: str):
    """A jsonschema validator of component ``name`` of the OpenAPI document."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema)


def _answer_schema(doc: dict, method: str, path: str, status: int) -> str:
    op = doc["paths"][path][method.lower()]
    ref = op["responses"][str(status)]["content"]["application/json"]["schema"]["$ref"]
    return ref.rsplit("/", 1)[1]


def test_openapi_lists_every_route_with_its_schemas(server):
    from openapi_spec_validator import validate

    url, _ = server
    doc = httpx.get(f"{url}/openapi.json").json()
    validate(doc)  # a valid OpenAPI 3.1 document
    assert doc == json.loads(json.dumps(openapi(doc["info"]["version"], Limits(
        max_questions=8, max_sessions=4, max_page=50, default_page=3))))
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == {(r.method, r.path) for r in ROUTES}
    for r in ROUTES:
        op = doc["paths"][r.path][r.method.lower()]
        assert "default" in op["responses"]  # the error answer
        ok = op["responses"][str(r.status)]["content"]
        assert ("text/plain" if r.answer is None else "application/json") in ok
        assert ("requestBody" in op) == (r.body is not None), r.path
        params = {p["name"] for p in op.get("parameters", [])}
        assert params == set(re.findall(r"\{(\w+)\}", r.path)) | set(r.query), r.path
    page = httpx.get(f"{url}/docs")
    assert page.status_code == 200 and "/openapi.json" in page.text
    assert page.headers["content-type"].startswith("text/html")


def test_every_answer_of_the_server_fits_the_schema(server, encoder, tmp_path):
    """A session of calls over every route (successes and errors): each answer body
    validates against the schema the document gives for it."""
    url, _ = server
    doc = httpx.get(f"{url}/openapi.json").json()
    with _server(tmp_path / "m", encoder) as (u, _mem):
        http = httpx.Client(base_url=u)
        s = {"id": "s1", "date": "2024-05-01", "messages": [
            {"role": "user", "content": "I adopted a puppy named Rex."},
            {"role": "assistant", "content": "What breed is he?"}],
            "metadata": {"topic": "pets", "n": 1, "ok": True, "x": None, "f": 0.5}}
        calls = [
            ("GET", "/healthz", "/healthz", None, 200),
            ("GET", "/readyz", "/readyz", None, 200),
            ("POST", "/v1/conversations/{cid}/sessions", "/v1/conversations/a/sessions",
             s, 201),
            ("POST", "/v1/conversations/{cid}/sessions", "/v1/conversations/a/sessions",
             {"sessions": [dict(s, id="s2"), dict(s, id="s3", date="")]}, 201),
            ("GET", "/v1/conversations", "/v1/conversations", None, 200),
            ("GET", "/v1/conversations/{cid}", "/v1/conversations/a", None, 200),
            ("GET", "/v1/conversations/{cid}/sessions", "/v1/conversations/a/sessions",
             None, 200),
            ("GET", "/v1/conversations/{cid}/sessions/{sid}",
             "/v1/conversations/a/sessions/s1", None, 200),
            ("PUT", "/v1/conversations/{cid}/sessions/{sid}",
             "/v1/conversations/a/sessions/s2", dict(s, id="s2", turns=["[user]: hi"],
                                                     messages=None), 200),
            ("POST", "/v1/search", "/v1/search",
             {"conversation_id": "a", "questions": ["What breed is Rex?", "Who?"],
              "k": 2, "after": "2024-01-01", "metadata": {"topic": "pets"}}, 200),
            ("DELETE", "/v1/conversations/{cid}/sessions/{sid}",
             "/v1/conversations/a/sessions/s3", None, 200),
            ("POST", "/v1/compact", "/v1/compact", None, 200),
            ("DELETE", "/v1/conversations/{cid}", "/v1/conversations/a", None, 200),
            ("GET", "/v1/conversations/{cid}", "/v1/conversations/a", None, 404),
            ("POST", "/v1/search", "/v1/search", {"questions": []}, 422),
        ]
        for method, pattern, path, body, status in calls:
            if isinstance(body, dict) and body.get("messages", 1) is None:
                body = {k: v for k, v in body.items() if k != "messages"}
            r = http.request(method, path, json=body)
            assert r.status_code == status, (method, path, r.text)
            name = (_answer_schema(doc, method, pattern, status) if status < 400
                    else "ErrorOut")
            _validator(doc, name).validate(r.json())
        http.close()


def test_the_serving_docs_answers_fit_the_schema(server):
    """Every answer shown in docs/serving.md (a ```json block after a line naming its
    model, ``<!-- answer: Model -->``) validates against the served schema, and every
    answer model of a /v1 route is shown at least once."""
    url, _ = server
    doc = httpx.get(f"{url}/openapi.json").json()
    text = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    shown = re.findall(r"<!-- answer: (\w+) -->\s*```json\n(.*?)```", text, re.S)
    assert len(shown) >= 8
    for name, block in shown:
        _validator(doc, name).validate(json.loads(block))
    wanted = {r.answer.__name__ for r in ROUTES if r.answer is not None
              and r.path.startswith("/v1")}
    assert wanted <= {n for n, _ in shown}, wanted - {n for n, _ in shown}


# ------------------------------------------------------------------ the routes
def test_pages_follow_the_cursor_to_the_memory_listing(server):
    url, mem = server
    http = httpx.Client(base_url=url)
    want = sorted(c.id for c in mem.conversations)
    for limit in (None, 1, 2, 5, 50):
        got, cursor, pages = [], None, 0
        while True:
            q = {k: v for k, v in (("limit", limit), ("cursor", cursor)) if v is not None}
            body = http.get("/v1/conversations", params=q).json()
            assert len(body["conversations"]) <= (limit or 3)
            got += [c["id"] for c in body["conversations"]]
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert got == want and pages == -(-len(want) // (limit or 3))
    for cid in CONVERSATIONS:
        sessions = mem.sessions(cid)
        got, cursor = [], None
        while True:
            body = http.get(f"/v1/conversations/{cid}/sessions",
                            params={"limit": 2, **({"cursor": cursor} if cursor else {})}
                            ).json()
            got += body["sessions"]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert got == sessions
    for q, word in (({"limit": 0}, "limit"), ({"limit": 51}, "limit"),
                    ({"limit": "x"}, "limit"), ({"cursor": "!!"}, "cursor"),
                    ({"cursor": "eyJhIjogMX0"}, "cursor"), ({"page": 2}, "'page'")):
        r = http.get("/v1/conversations", params=q)
        assert r.status_code == 422 and word in r.json()["error"]["message"], (q, r.text)
    assert http.get("/v1/search?x=1").status_code == 405  # the method first
    r = http.post("/v1/search?x=1", json={"conversation_id": "ana", "questions": ["q"]})
    assert r.status_code == 422 and "'x'" in r.json()["error"]["message"]
    http.close()


def test_a_write_between_two_pages_skips_and_repeats_nothing(server):
    """Sessions listed two at a time while sessions before the cursor are removed and
    added: the next page starts after the last session the previous page showed."""
    url, mem = server
    http = httpx.Client(base_url=url)
    cid = "pager"
    r = http.post(f"/v1/conversations/{cid}/sessions", json={"sessions": [
        {"id": f"p{j}", "turns": [f"[user]: page talk {j}"]} for j in range(4)]})
    assert r.status_code == 201
    first = http.get(f"/v1/conversations/{cid}/sessions", params={"limit": 2}).json()
    assert [s["id"] for s in first["sessions"]] == ["p0", "p1"]
    assert http.delete(f"/v1/conversations/{cid}/sessions/p0").status_code == 200
    second = http.get(f"/v1/conversations/{cid}/sessions",
                      params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [s["id"] for s in second["sessions"]] == ["p2", "p3"]
    assert second["next_cursor"] is None
    # the session the cursor names removed too: from where it was
    first = http.get(f"/v1/conversations/{cid}/sessions", params={"limit": 2}).json()
    assert [s["id"] for s in first["sessions"]] == ["p1", "p2"]
    assert http.delete(f"/v1/conversations/{cid}/sessions/p2").status_code == 200
    rest = http.get(f"/v1/conversations/{cid}/sessions",
                    params={"cursor": first["next_cursor"]}).json()
    assert [s["id"] for s in rest["sessions"]] == ["p3"]
    # the session the next page would start with removed
    r = http.post(f"/v1/conversations/{cid}/sessions", json={"sessions": [
        {"id": f"q{j}", "turns": [f"[user]: more talk {j}"]} for j in range(3)]})
    first = http.get(f"/v1/conversations/{cid}/sessions", params={"limit": 2}).json()
    assert [s["id"] for s in first["sessions"]] == ["p1", "p3"]
    assert http.delete(f"/v1/conversations/{cid}/sessions/q0").status_code == 200
    rest = http.get(f"/v1/conversations/{cid}/sessions",
                    params={"cursor": first["next_cursor"]}).json()
    assert [s["id"] for s in rest["sessions"]] == ["q1", "q2"]
    assert http.delete(f"/v1/conversations/{cid}").status_code == 200
    http.close()


def test_a_conversation_summary_and_the_probes_equal_the_memory(server):
    url, mem = server
    for cid in CONVERSATIONS:
        ss = mem.sessions(cid)
        dates = [s["date"] for s in ss if s["date"]]
        assert httpx.get(f"{url}/v1/conversations/{cid}").json() == {
            "id": cid, "sessions": len(ss), "first_date": dates[0], "last_date": dates[-1]}
    ready = httpx.get(f"{url}/readyz").json()
    assert ready["status"] == "ready"
    assert ready["conversations"] == len(mem.conversations)
    assert ready["sessions"] == sum(len(c.session_ids) for c in mem.conversations)
    assert ready["log_bytes"] == mem.storage_stats()["log_bytes_since_checkpoint"] > 0
    head = httpx.head(f"{url}/healthz")
    assert head.status_code == 200 and head.content == b""


def test_put_replaces_a_session_in_its_place(server, encoder, tmp_path):
    url, mem = server
    cid = "dev"
    old = [s for s, _ in sessions_of(CONVERSATIONS.index(cid))]
    new = Session.from_messages(old[1].id, "2023-06-02", [
        {"role": "user", "content": "My cat Miso learned to open the fridge."},
        {"role": "assistant", "content": "Clever cat! Maybe add a child lock."}])
    body = {"id": new.id, "date": new.date, "messages": list(new.messages),
            "metadata": {"topic": "pets"}}
    r = httpx.put(f"{url}/v1/conversations/{cid}/sessions/{new.id}", json=body)
    assert r.status_code == 200 and r.json() == {"conversation_id": cid, "replaced": {
        "id": new.id, "date": new.date, "turns": len(new.turns)}}
    assert [s["id"] for s in mem.sessions(cid)] == [s.id for s in old]  # in its place
    got = httpx.get(f"{url}/v1/conversations/{cid}/sessions/{new.id}").json()
    assert got["turns"] == list(new.turns) and got["metadata"] == {"topic": "pets"}
    # the oracle: a memory built with the new session where the old one was
    twin = MemoryIndex.open(tmp_path / "twin", encoder=encoder)
    mds = [md for _, md in sessions_of(CONVERSATIONS.index(cid))]
    for j, s in enumerate(old):
        twin.add_session(cid, new if j == 1 else s,
                         metadata={"topic": "pets"} if j == 1 else mds[j])
    qs = ["Who opens the fridge?", "When is the violin recital?"]
    served = httpx.post(f"{url}/v1/search", json={"conversation_id": cid, "questions": qs,
                                                   "k": 4}).json()["results"]
    from memgas_gpu.retrieve.results import SearchResult

    assert_same([SearchResult(r["conversation_id"], r["session_ids"], r["scores"],
                              [[(e["turn"], e["text"], e["score"]) for e in ev]
                               for ev in r["evidence"]]) for r in served],
                twin.search(cid, qs, k=4))
    twin.close()
    for path, b, status, word in (
            (f"/v1/conversations/{cid}/sessions/s99", dict(body, id="s99"), 404, "'s99'"),
            (f"/v1/conversations/nobody/sessions/{new.id}", body, 404, "'nobody'"),
            (f"/v1/conversations/{cid}/sessions/s0", body, 422, "path"),
            (f"/v1/conversations/{cid}/sessions/s0", {"sessions": [body]}, 422, "PUT")):
        r = httpx.put(url + path, json=b)
        assert r.status_code == status and word in r.json()["error"]["message"], r.text


# ------------------------------------------------------------------ errors and bad input
def _raw(url: str, request: bytes, then: bytes = b"") -> list:
    """Send raw bytes on one connection (then a second request ``then`` on it); the
    answers' ``(status, body)``."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        out = [_read_answer(s)]
        if then:
            s.sendall(then)
            out.append(_read_answer(s))
    return out


def _read_answer(s) -> tuple:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    status = int(head.split()[1])
    n = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(rest) < n:
        rest += s.recv(65536)
    return status, rest[:n]


def _post(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


BAD = [  # (method, path, body, status, code, words in the message)
    ("TRACE", "/healthz", None, 405, "method_not_allowed", "GET"),
    ("OPTIONS", "/v1/search", None, 405, "method_not_allowed", "POST"),
    ("GET", "/v1/conversations/a%0Ab", None, 422, "invalid_value", "control"),
    ("GET", "/nothing/here", None, 404, "no_route", "/openapi.json"),
    ("POST", "/v1/conversations/c/sessions", {"id": "s\nx", "turns": ["t"]}, 422,
     "invalid_value", "control"),
    ("POST", "/v1/conversations/c/sessions", {"id": "s", "messages": [
        {"role": "user", "content": "hi", "name": "x"}]}, 422, "invalid_value", "'name'"),
    ("POST", "/v1/conversations/c/sessions", {"id": "s", "turns": ["t"],
                                              "date": "yesterday"}, 422, "invalid_value",
     "ISO 8601"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"], "method": ""},
     422, "invalid_value", "method"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"], "settings": []},
     422, "invalid_type", "settings"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"], "after": "1e400"},
     422, "invalid_value", "ISO 8601"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"], "before": "-1"},
     422, "invalid_value", "ISO 8601"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"],
                            "settings": {"k": 3}}, 422, "invalid_value", "settings.k"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"] * 9}, 422,
     "invalid_value", "--max-questions"),
    ("POST", "/v1/conversations/c/sessions", {"sessions": [
        {"id": f"s{j}", "turns": ["t"]} for j in range(5)]}, 422, "invalid_value",
     "--max-sessions"),
    ("POST", "/v1/compact", None, 200, None, None),
]


@pytest.mark.parametrize("method, path, body, status, code, words", BAD,
                         ids=[f"{m} {p} {s} {w}" for m, p, _, s, _, w in BAD])
def test_every_error_is_json_naming_the_field(server, method, path, body, status, code,
                                              words):
    url, mem = server
    before = {c.id: list(c.session_ids) for c in mem.conversations}
    r = httpx.request(method, url + path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    if code is not None:
        err = r.json()["error"]
        assert err["code"] == code and words in err["message"], err
        assert "\n" not in err["message"] and "Traceback" not in err["message"]
        assert {c.id: list(c.session_ids) for c in mem.conversations} == before


def test_lone_surrogates_are_refused_and_the_connection_goes_on(server):
    url, mem = server
    ok = _post("/v1/search", b'{"conversation_id": "ana", "questions": ["Rex?"]}')
    bodies = [
        ("/v1/conversations/ana/sessions",
         b'{"id": "z", "turns": ["t"], "metadata": {"\\udc00": 1}}'),
        ("/v1/conversations/ana/sessions", b'{"id": "z\\ud800", "turns": ["t"]}'),
        ("/v1/search", b'{"conversation_id": "\\udc00", "questions": ["q"]}'),
        ("/v1/search", b'{"conversation_id": "ana", "questions": ["\\udfff"]}'),
        ("/v1/search", b'{"conversation_id": "ana", "questions": ["q"], '
                       b'"metadata": {"a": "\\ud800"}}'),
    ]
    for path, body in bodies:
        (s1, b1), (s2, b2) = _raw(url, _post(path, body), then=ok)
        err = json.loads(b1)["error"]
        assert s1 == 422 and "surrogate" in err["message"], (path, body, b1)
        assert s2 == 200 and json.loads(b2)["results"][0]["session_ids"]
    assert "z" not in mem.sessions("ana")


# ------------------------------------------------------------------ compaction, access log
def _folder_holds(folder: Path, marker: bytes) -> list:
    return [p.name for p in folder.rglob("*") if p.is_file() and marker in p.read_bytes()]


def test_forgetting_over_http_removes_the_text_from_the_folder(tmp_path, encoder):
    """After DELETE of a conversation (or a session), no file of the folder holds its
    text within compact_after seconds (+ the compaction's time): the policy of the
    server; POST /v1/compact does it at once."""
    folder = tmp_path / "mem"
    marker = "zebra-marker-7f3a"
    with _server(folder, encoder, compact_after_s=0.3) as (url, mem):
        for cid in ("keep", "gone"):
            r = httpx.post(f"{url}/v1/conversations/{cid}/sessions", json={"sessions": [
                {"id": f"s{j}", "turns": [f"[user]: {cid} {marker if cid == 'gone' else ''}"
                                          f" talk {j}"]} for j in range(3)]})
            assert r.status_code == 201
        mem.checkpoint()  # the text now in the packs too, not only in the log
        assert _folder_holds(folder, marker.encode())
        assert httpx.delete(f"{url}/v1/conversations/gone").status_code == 200
        deadline = time.monotonic() + 20
        while _folder_holds(folder, marker.encode()):
            assert time.monotonic() < deadline, _folder_holds(folder, marker.encode())
            time.sleep(0.1)
        elapsed = 20 - (deadline - time.monotonic())
        assert elapsed >= 0.25  # not before the delay: removals share one compaction
        assert [c.id for c in mem.conversations] == ["keep"]
    with _server(folder, encoder, compact_after_s=None) as (url, mem):
        r = httpx.post(f"{url}/v1/conversations/keep/sessions",
                       json={"id": "x", "turns": [f"[user]: {marker}"]})
        assert r.status_code == 201
        assert httpx.delete(f"{url}/v1/conversations/keep/sessions/x").status_code == 200
        time.sleep(0.5)
        assert _folder_holds(folder, marker.encode())  # no policy: still there
        assert httpx.post(f"{url}/v1/compact").json() == {"dropped": 1}
        assert not _folder_holds(folder, marker.encode())


def test_one_access_log_line_per_request_without_keys_or_ids(tmp_path, encoder, caplog):
    with _server(tmp_path / "mem", encoder, keys={KEY: "team"}) as (url, _):
        auth = {"Authorization": f"Bearer {KEY}"}
        with caplog.at_level(logging.INFO, logger="memgas_gpu.serve.access"):
            httpx.post(f"{url}/v1/conversations/secret-cid/sessions", headers=auth,
                       json={"id": "s", "turns": ["[user]: hi"]})
            httpx.get(f"{url}/v1/conversations/secret-cid", headers=auth)
            httpx.get(f"{url}/v1/conversations", headers={"Authorization": "Bearer nope"})
            httpx.get(f"{url}/healthz")
    lines = [r.getMessage() for r in caplog.records if r.name == "memgas_gpu.serve.access"]
    assert len(lines) == 4, lines
    assert re.fullmatch(r"POST /v1/conversations/\{cid\}/sessions 201 [\d.]+ms tenant=team",
                        lines[0]), lines[0]
    assert lines[1].startswith("GET /v1/conversations/{cid} 200 ")
    assert lines[2].startswith("GET /v1/conversations 401 ") and lines[2].endswith("=-")
    assert lines[3].startswith("GET /healthz 200 ")
    assert not any(KEY in x or "secret-cid" in x or "nope" in x for x in lines)
