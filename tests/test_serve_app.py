"""``memgas serve``'s HTTP service over real HTTP (uvicorn in a thread, httpx): every
route against the memory it serves (the oracle: a direct ``MemoryIndex.search`` and
listing on that memory), many concurrent clients, one error format, bounded bodies,
and tenants that never see each other's conversations."""
from __future__ import annotations

import json
import os
import threading

import httpx
import pytest

import memgas_gpu as mg
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.serve import Batcher, Client, KeyFileError, LocalBackend, create_app
from memgas_gpu.serve.protocol import Limits
from memgas_gpu.serve.tenants import load_keys, parse_keys

from _memory_model import tiny_encoder
from _serve import CONVERSATIONS, assert_same, populate, running, search_mix, sessions_of

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-fedcba9876543210"
KEYS = {ALICE: "alice", BOB: "bob"}


@pytest.fixture(scope="module")
def encoder():
    return tiny_encoder()


def _served(folder, encoder, keys=None, max_batch_size=16, max_wait_ms=10, **app_kw):
    mem = MemoryIndex.open(folder, encoder=encoder)
    backend = LocalBackend(mem, Batcher(mem, max_batch_size, max_wait_ms))
    return mem, backend, create_app(backend, parse_keys(json.dumps(keys), "test")
                                    if keys else None, **app_kw)


@pytest.fixture(scope="module")
def server(tmp_path_factory, encoder):
    """A server without keys over a memory holding the test conversations."""
    mem, backend, app = _served(tmp_path_factory.mktemp("served") / "mem", encoder)
    with running(app) as url:
        with Client(url) as c:
            populate(c)
        yield url, mem
    import asyncio

    asyncio.run(backend.close())


def _err(r: httpx.Response, status: int, code: str, field: str = "") -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code, body
    msg = body["error"]["message"]
    assert field in msg and "Traceback" not in msg and "\n" not in msg, msg
    return msg


# ------------------------------------------------------------------ routes vs the memory
def test_listings_and_sessions_equal_the_memory(server):
    url, mem = server
    with Client(url) as c:
        got = {m.id: (m.session_ids, m.session_dates) for m in c.conversations}
        assert got == {m.id: (m.session_ids, m.session_dates) for m in mem.conversations}
        assert set(got) == set(CONVERSATIONS)
        for cid in CONVERSATIONS:
            assert c.sessions(cid) == mem.sessions(cid)
            for s in mem.sessions(cid):
                assert c.get_session(cid, s["id"]) == mem.get_session(cid, s["id"])
        assert c.get_session("ana", "s0")["turns"] == list(sessions_of(0)[0][0].turns)


def test_searches_over_http_equal_direct_searches(server):
    url, mem = server
    mix = search_mix()
    with Client(url) as c:
        for cid, qs, kw in mix:
            assert_same(c.search(cid, qs, **kw), mem.search(cid, qs, **kw))
        raw = httpx.post(f"{url}/v1/search", json={
            "conversation_id": "ben", "questions": ["Who visits from Lisbon?"], "k": 2}).json()
        want = mem.search("ben", ["Who visits from Lisbon?"], k=2)[0].to_dict()
        assert raw["results"][0]["session_ids"] == want["session_ids"]
        assert set(raw["results"][0]) == set(want)


def test_many_concurrent_clients_get_their_own_answers(server):
    url, mem = server
    mix = search_mix()
    want = [mem.search(c, q, **kw) for c, q, kw in mix]
    errors = []
    shared = Client(url)

    def work(t):
        c = shared if t % 2 else Client(url)  # one shared client, and clients of their own
        for i in range(t, 2 * len(mix), 12):
            cid, qs, kw = mix[i % len(mix)]
            try:
                assert_same(c.search(cid, qs, **kw), want[i % len(mix)])
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append((i, e))

    ts = [threading.Thread(target=work, args=(t,)) for t in range(12)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    shared.close()
    assert not errors, errors[:3]
    text = httpx.get(f"{url}/metrics").text
    assert "memgas_search_batches_total" in text


def test_writes_change_the_memory_and_come_back(server, encoder):
    url, mem = server
    c = Client(url)
    s1 = mg.Session.from_messages("w1", "2024-01-02", [
        {"role": "user", "content": "I bought a red kayak."},
        {"role": "assistant", "content": "Paddle safely!"}, {"role": "user", "content": "ok"}])
    s2 = mg.Session("w2", "2024-01-03", ("[user]: a turn stored as given",))
    c.add_session("new/conv ü", s1, summary="kayak", keywords="kayak; red",
                  metadata={"topic": "boats"})
    c.add_sessions("new/conv ü", [s2])
    assert mem.sessions("new/conv ü") == [
        {"id": "w1", "date": "2024-01-02", "metadata": {"topic": "boats"}},
        {"id": "w2", "date": "2024-01-03", "metadata": {}}]
    assert mem.get_session("new/conv ü", "w1")["turns"] == list(s1.turns)
    assert mem.get_session("new/conv ü", "w2")["turns"] == list(s2.turns)
    with pytest.raises(ValueError, match="already has a session 'w1'"):
        c.add_session("new/conv ü", s1)
    assert_same(c.search("new/conv ü", ["kayak"], k=2), mem.search("new/conv ü", ["kayak"], k=2))
    c.remove_session("new/conv ü", "w1")
    assert [s["id"] for s in mem.sessions("new/conv ü")] == ["w2"]
    with pytest.raises(KeyError, match="has no session 'w1'"):
        c.remove_session("new/conv ü", "w1")
    c.forget_conversation("new/conv ü")
    assert "new/conv ü" not in {m.id for m in mem.conversations}
    with pytest.raises(KeyError, match="no conversation 'new/conv ü'"):
        c.forget_conversation("new/conv ü")
    assert c.search("new/conv ü", ["kayak"])[0].session_ids == []
    # many sessions in one request: all checked before any is added
    r = httpx.post(f"{url}/v1/conversations/batch/sessions", json={"sessions": [
        {"id": "a", "messages": [{"role": "user", "content": "fine"}]},
        {"id": "b", "date": "not a date", "messages": [{"role": "user", "content": "x"}]}]})
    _err(r, 422, "invalid_value", "date")
    assert "batch" not in {m.id for m in mem.conversations}
    r = httpx.post(f"{url}/v1/conversations/batch/sessions", json={"sessions": [
        {"id": "a", "messages": [{"role": "user", "content": "fine"}]},
        {"id": "b", "turns": ["[user]: also fine"], "metadata": {"x": 1}}]})
    assert r.status_code == 201 and [a["id"] for a in r.json()["added"]] == ["a", "b"]
    assert [s["id"] for s in mem.sessions("batch")] == ["a", "b"]
    c.close()


# ------------------------------------------------------------------ one error format
BAD = [
    ("POST", "/v1/search", b"{not json", 400, "bad_request", "not JSON"),
    ("POST", "/v1/search", b"", 400, "bad_request", "empty"),
    ("POST", "/v1/search", b'{"conversation_id": "ana", "questions": [NaN]}', 400,
     "bad_request", "NaN"),
    ("POST", "/v1/search", b"[" * 100000 + b"]" * 100000, 400, "bad_request", "nested"),
    ("POST", "/v1/search", {"questions": ["q"]}, 422, "invalid_value", "conversation_id"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": "q"}, 422,
     "invalid_type", "questions"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"], "k": "3"}, 422,
     "invalid_type", "k"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"], "k": 0}, 422,
     "invalid_value", "k"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"], "top": 3}, 422,
     "invalid_value", "'top'"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"],
                            "method": "nope"}, 422, "invalid_value", "method"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"],
                            "settings": {"damping": 7}}, 422, "invalid_value", "damping"),
    ("POST", "/v1/search", {"conversation_id": "ana", "questions": ["q"],
                            "after": "yesterday-ish"}, 422, "invalid_value", "after"),
    ("POST", "/v1/search", {"conversation_id": ["ana"], "questions": ["q", "r"]}, 422,
     "invalid_value", "conversation ids"),
    ("POST", "/v1/conversations/ana/sessions", {"id": "x", "messages": "hi"}, 422,
     "invalid_type", "messages"),
    ("POST", "/v1/conversations/ana/sessions", {"id": "x", "messages": [{"role": "u"}]},
     422, "invalid_value", "content"),
    ("POST", "/v1/conversations/ana/sessions", {"messages": []}, 422, "invalid_value",
     "'id'"),
    ("POST", "/v1/conversations/ana/sessions", {"id": "x", "messages": [
        {"role": "u", "content": "c"}], "metadata": {"k": [1]}}, 422, "invalid_type",
     "metadata"),
    ("POST", "/v1/conversations/ana/sessions", {"id": "s0", "messages": [
        {"role": "u", "content": "c"}]}, 409, "conflict", "'s0'"),
    ("GET", "/v1/conversations/nobody/sessions", None, 404, "not_found", "'nobody'"),
    ("GET", "/v1/conversations/ana/sessions/s99", None, 404, "not_found", "'s99'"),
    ("DELETE", "/v1/conversations/ana/sessions/s99", None, 404, "not_found", "'s99'"),
    ("DELETE", "/v1/conversations/nobody", None, 404, "not_found", "'nobody'"),
    ("GET", "/v2/search", None, 404, "no_route", "/v2/search"),
    ("GET", "/v1/search", None, 405, "method_not_allowed", "POST"),
    ("PUT", "/v1/conversations", None, 405, "method_not_allowed", "GET"),
    ("GET", "/v1/conversations/%FF/sessions", None, 400, "bad_request", "UTF-8"),
]


@pytest.mark.parametrize("method, path, body, status, code, field", BAD,
                         ids=[f"{m} {p} {s} {f}" for m, p, _, s, _, f in BAD])
def test_bad_requests_get_one_error_naming_the_field(server, method, path, body, status,
                                                     code, field):
    url, _ = server
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    _err(httpx.request(method, url + path, **kw), status, code, field)


def test_bodies_over_the_bound_are_refused(tmp_path, encoder):
    mem, backend, app = _served(tmp_path / "m", encoder, limits=Limits(max_body_bytes=4096))
    big = {"conversation_id": "a", "questions": ["word " * 2000]}
    with running(app) as url:
        _err(httpx.post(f"{url}/v1/search", json=big), 413, "too_large", "4096")

        def chunks():  # no Content-Length: the server counts what it reads
            data = json.dumps(big).encode()
            for i in range(0, len(data), 1000):
                yield data[i:i + 1000]
        _err(httpx.post(f"{url}/v1/search", content=chunks()), 413, "too_large", "4096")
        ok = httpx.post(f"{url}/v1/search", json={"conversation_id": "a", "questions": ["q"]})
        assert ok.status_code == 200 and ok.json() == {"results": [
            {"conversation_id": "a", "session_ids": [], "scores": [], "evidence": [],
             "dates": [], "metadata": []}]}
    import asyncio

    asyncio.run(backend.close())


def test_health_and_metrics(server):
    url, _ = server
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    before = httpx.get(f"{url}/metrics").text
    n0 = _count(before, 'memgas_requests_total{route="/v1/search",method="POST",status="200"}')
    for _ in range(3):
        httpx.post(f"{url}/v1/search", json={"conversation_id": "ana", "questions": ["q"]})
    text = httpx.get(f"{url}/metrics").text
    assert _count(text, 'memgas_requests_total{route="/v1/search",method="POST",'
                        'status="200"}') == n0 + 3
    for name in ("memgas_request_seconds_bucket", "memgas_search_batch_size_bucket",
                 "memgas_search_queue_depth", "memgas_search_mean_batch_size",
                 "memgas_search_batches_total"):
        assert name in text
    assert "ana" not in text and "s0" not in text  # routes by pattern, never by id


def _count(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


# ------------------------------------------------------------------ tenants
@pytest.fixture(scope="module")
def tenants(tmp_path_factory, encoder):
    mem, backend, app = _served(tmp_path_factory.mktemp("tenants") / "mem", encoder,
                                keys=KEYS)
    with running(app) as url:
        yield url, mem
    import asyncio

    asyncio.run(backend.close())


def test_keys_are_required(tenants):
    url, _ = tenants
    for headers in ({}, {"Authorization": "Bearer not-a-key-of-this-server"},
                    {"Authorization": f"Basic {ALICE}"}, {"Authorization": "Bearer"}):
        for method, path in (("GET", "/v1/conversations"), ("POST", "/v1/search"),
                             ("DELETE", "/v1/conversations/c1")):
            r = httpx.request(method, url + path, headers=headers)
            _err(r, 401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{url}/healthz").status_code == 200  # no key needed
    with pytest.raises(mg.MemgasError, match="401"):
        Client(url).conversations


def test_tenants_never_see_each_others_conversations(tenants):
    url, mem = tenants
    alice, bob = Client(url, key=ALICE), Client(url, key=BOB)
    s = {c: sessions_of(i) for i, c in enumerate(CONVERSATIONS)}
    for sess, md in s["ana"]:
        alice.add_session("c1", sess, metadata=md)
    for sess, md in s["ben"]:
        bob.add_session("c1", sess, metadata=md)
    # a cid that looks like another tenant's id: alice's own conversation "bob/c1"
    alice.add_session("bob/c1", s["clara"][0][0])
    alice.add_session("../bob/c1", s["clara"][1][0])
    assert sorted(m.id for m in alice.conversations) == ["../bob/c1", "bob/c1", "c1"]
    assert [m.id for m in bob.conversations] == ["c1"]
    assert sorted(m.id for m in mem.conversations) == [
        "alice/../bob/c1", "alice/bob/c1", "alice/c1", "bob/c1"]
    # the same cid: each tenant gets its own sessions and its own search results
    assert bob.sessions("c1") == mem.sessions("bob/c1") != alice.sessions("c1")
    assert alice.sessions("bob/c1") == mem.sessions("alice/bob/c1")
    q = ["Who visits from Lisbon?"]
    assert_same(alice.search("c1", q, k=3),
                [_renamed(r, "c1") for r in mem.search("alice/c1", q, k=3)])
    assert_same(bob.search("c1", q, k=3),
                [_renamed(r, "c1") for r in mem.search("bob/c1", q, k=3)])
    assert_same(alice.search("bob/c1", q, k=3),
                [_renamed(r, "bob/c1") for r in mem.search("alice/bob/c1", q, k=3)])
    # bob cannot reach alice's conversations by any id
    for cid in ("alice/c1", "../alice/c1", "alice%2Fc1", "bob/c1"):
        assert bob.search(cid, q)[0].session_ids == []
        with pytest.raises(KeyError):
            bob.sessions(cid)
        with pytest.raises(KeyError):
            bob.get_session(cid, "s0")
        with pytest.raises(KeyError):
            bob.remove_session(cid, "s0")
        with pytest.raises(KeyError):
            bob.forget_conversation(cid)
    r = httpx.get(f"{url}/v1/conversations/..%2Falice%2Fc1/sessions",
                  headers={"Authorization": f"Bearer {BOB}"})
    _err(r, 404, "not_found")
    # nothing of alice's changed; bob's forget takes only bob's c1
    assert sorted(m.id for m in mem.conversations) == [
        "alice/../bob/c1", "alice/bob/c1", "alice/c1", "bob/c1"]
    bob.forget_conversation("c1")
    assert sorted(m.id for m in mem.conversations) == [
        "alice/../bob/c1", "alice/bob/c1", "alice/c1"]
    assert bob.conversations == [] and len(alice.conversations) == 3
    alice.remove_session("c1", "s0")
    assert "s0" not in {x["id"] for x in mem.sessions("alice/c1")}


def _renamed(r, cid):
    return type(r)(cid, r.session_ids, r.scores, r.evidence)


def test_keys_file_and_environment(tmp_path):
    f = tmp_path / "keys.json"
    f.write_text(json.dumps(KEYS))
    os.chmod(f, 0o600)
    ring, warning = load_keys(str(f))
    assert warning is None and ring.tenant(ALICE) == "alice" and ring.tenant(BOB) == "bob"
    assert ring.tenant("x" * 30) is None and ring.tenant(None) is None
    assert ALICE not in repr(ring)
    os.chmod(f, 0o644)
    assert "chmod 600" in load_keys(str(f))[1]
    ring, _ = load_keys(None, {"MEMGAS_API_KEYS": json.dumps({ALICE: "alice"})})
    assert ring.tenants == ["alice"]
    assert load_keys(None, {}) == (None, None)
    short = "short-key"
    for text, match in (("{", "not JSON"), ("[]", "object"), ("{}", "object"),
                        (json.dumps({short: "alice"}), "entry 1 \\(tenant 'alice'\\)"),
                        (json.dumps({ALICE: "a/b"}), "entry 1: the tenant"),
                        (json.dumps({ALICE: "alice", "with space in the key 123": "b"}),
                         "entry 2")):
        with pytest.raises(KeyFileError, match=match) as e:
            parse_keys(text, "keys.json")
        assert short not in str(e.value) and ALICE not in str(e.value)
    with pytest.raises(KeyFileError, match="cannot read"):
        load_keys(str(tmp_path / "missing.json"))
