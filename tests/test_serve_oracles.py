"""Independent oracles for the search batcher and for tenant isolation of the HTTP API.

* **The Batcher** (``memgas_gpu.serve.Batcher``) in front of a wrapper memory that
  records every ``search_many`` call it is given (the thread, which callers' requests,
  how many questions) and fails on purpose: every batch holding a *marked* caller's
  request raises an error naming that caller, and optionally the very first call fails
  whatever it holds.  Callers arrive at seeded random times, from threads and from an
  event loop.  The oracle for each caller is a direct ``MemoryIndex.search`` with its
  own arguments on the unwrapped memory (or that call's own error), and for a marked
  caller the error naming *it*: never another caller's result or error.  The waiting
  rules are checked against the recorded calls with wide time bounds (no speed
  assertions): calls ~50 ms apart share one batch under ``max_wait_ms=300``, a lone call
  waits roughly ``max_wait_ms`` (not seconds, not microseconds), a trickle of arrivals
  does not hold back the oldest call, ``max_batch_size`` caps the questions of a batch,
  a full batch goes at once, and ``max_batch_size=1`` is a direct call in the caller's
  thread.
* **Tenants** of ``memgas serve`` (three tenants, one with two keys, one whose name is a
  prefix of another's): a seeded random walk over every route (add one / several
  sessions, search with one id / a list of ids, list conversations / sessions, get /
  delete a session, forget a conversation) and every id form (plain, colliding between
  tenants, holding ``/``, spelling another tenant's prefix, ``..``, a literal ``%2F``,
  every byte percent-encoded).  Oracles: a model dict per tenant of what it wrote, the
  served memory's own conversation ids inspected directly (``tenant/id``), a direct
  search of the tenant-qualified ids, and an owner tag written into every turn (any
  evidence text a tenant gets back must carry its own tag).
"""
from __future__ import annotations

import asyncio
import json
import random
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from memgas_gpu import Dataset, Session
from memgas_gpu.retrieve import MemoryIndex, SearchResult
from memgas_gpu.serve import Batcher, LocalBackend, create_app
from memgas_gpu.serve.tenants import parse_keys

from _serve import CONVERSATIONS, QUESTIONS, TOPICS, populate, running

METHODS = [None, "memgas", "bm25", "session", "memgas_hybrid"]
JOIN_S = 60  # a caller not answered within this is a hung batcher (a bug), not slowness


@pytest.fixture(scope="module")
def encoder(tiny_enc):
    """The test session's tiny random BERT (conftest)."""
    return tiny_enc


@pytest.fixture(scope="module")
def mem(encoder):
    m = MemoryIndex.build(Dataset([]), encoder, device="cpu", progress=False)
    populate(m)
    return m


# ====================================================================== the batcher
class Boom(RuntimeError):
    """The error of a marked caller's request: it names that caller."""

    def __init__(self, tag: int) -> None:
        super().__init__(f"caller {tag}'s request failed")
        self.tag = tag


class Transient(RuntimeError):
    """The failure of the first ``search_many`` call, whatever it holds."""


def _tag(request) -> int:
    """The caller number a request carries (each caller's questions end in ``#i``)."""
    return int(request.queries[0].rsplit("#", 1)[1])


class Recorder:
    """The memory behind a Batcher: forwards ``search_many`` to ``mem``, records every
    call ``{"thread", "tags", "questions", "ok"}``, fails every call holding a
    ``marked`` caller's request (with :class:`Boom` naming the first such caller) and,
    with ``fail_first``, the first call whatever it holds (:class:`Transient`)."""

    def __init__(self, mem, marked=(), fail_first: bool = False) -> None:
        self.mem, self.marked, self.fail_first = mem, set(marked), fail_first
        self.calls: list[dict] = []
        self._lock = threading.Lock()

    def search_many(self, requests, **kw):
        call = {"thread": threading.get_ident(), "tags": [_tag(r) for r in requests],
                "questions": [len(r.queries) for r in requests], "ok": False}
        with self._lock:
            first = not self.calls
            self.calls.append(call)
        if self.fail_first and first:
            raise Transient("the first call fails")
        bad = [t for t in call["tags"] if t in self.marked]
        if bad:
            raise Boom(bad[0])
        out = self.mem.search_many(requests, **kw)
        call["ok"] = True
        return out

    def search(self, *a, **kw):  # only the batcher's search_many may be used
        raise AssertionError("the batcher must call search_many")


def _outcome(fn, call):
    cid, qs, kw = call
    try:
        return fn(cid, qs, **kw)
    except Exception as e:  # noqa: BLE001 - compared with the oracle
        return e


def _random_call(rng: random.Random, i: int) -> tuple:
    """A random search of caller ``i``: one to three questions ending in ``#i``, one id
    or one per question (unknown ones too), random k / method / filters, now and then
    a bad argument (refused in the caller's own thread)."""
    n = rng.choice([1, 1, 1, 2, 3])
    qs = [f"{rng.choice(QUESTIONS)} #{i}" for _ in range(n)]
    r = rng.random()
    if r < 0.2:
        cid = [rng.choice(CONVERSATIONS + ["nobody"]) for _ in range(n)]
    elif r < 0.3:
        cid = "nobody-knows-me"
    else:
        cid = rng.choice(CONVERSATIONS)
    kw = {"k": rng.randint(1, 5)}
    m = rng.choice(METHODS)
    if m is not None:
        kw["method"] = m
    if rng.random() < 0.15:
        kw["after"] = "2023-06-10"
    if rng.random() < 0.1:
        kw["metadata"] = {"topic": "music"}
    if rng.random() < 0.15:
        kw["evidence"] = rng.randint(0, 2)
    if rng.random() < 0.06:
        kw.update(rng.choice([{"k": 0}, {"method": "no-such-method"},
                              {"after": "not a date at all"}]))
    return cid, qs, kw


def _arrive(batcher, calls, delays, use_async=None, timeout=JOIN_S):
    """Each call made by its own thread (or, where ``use_async[i]``, by a coroutine of
    one event loop) after ``delays[i]`` seconds; all start together.  Returns
    ``({i: result or exception}, {i: caller thread ident}, {i: (called, answered)})``
    (``time.monotonic()`` stamps).  Fails when a caller is not answered within
    ``timeout`` seconds."""
    use_async = use_async or [False] * len(calls)
    sync = [i for i in range(len(calls)) if not use_async[i]]
    coro = [i for i in range(len(calls)) if use_async[i]]
    got, ident, took = {}, {}, {}
    start = threading.Barrier(len(sync) + (1 if coro else 0))

    def one(i):
        start.wait(30)
        time.sleep(delays[i])
        ident[i] = threading.get_ident()
        t0 = time.monotonic()
        got[i] = _outcome(batcher.search, calls[i])
        took[i] = (t0, time.monotonic())

    def loop():
        async def one_async(i):
            await asyncio.sleep(delays[i])
            t0 = time.monotonic()
            got[i] = await _aoutcome(batcher, calls[i])
            took[i] = (t0, time.monotonic())

        async def main():
            await asyncio.gather(*[one_async(i) for i in coro])

        start.wait(30)
        asyncio.run(main())

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in sync]
    if coro:
        threads.append(threading.Thread(target=loop, daemon=True))
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = sorted(set(range(len(calls))) - set(got))
    assert not hung, f"callers {hung} were never answered"
    return got, ident, took


async def _aoutcome(batcher, call):
    cid, qs, kw = call
    try:
        return await batcher.asearch(cid, qs, **kw)
    except Exception as e:  # noqa: BLE001 - compared with the oracle
        return e


ALL = 1000  # k of a direct search that returns every session (its full ranking)


def _direct(mem, call):
    """The oracle: a direct search with the caller's own arguments (or its error), and
    the same search's full ranking (every session), ``(top k, full)``."""
    cid, qs, kw = call
    want = _outcome(mem.search, call)
    if isinstance(want, Exception):
        return want
    return want, mem.search(cid, qs, **{**kw, "k": ALL})


def _close(a: float, b: float, tol: float = 1e-5) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(b))


def assert_same(got: list, want: list, full: list) -> None:
    """Results (``SearchResult``s) equal to the direct search's ``want`` (top k) and
    consistent with its full ranking ``full``: same conversations, as many sessions,
    the score at each rank equal (up to float rounding), and each returned session
    holding, in the full ranking, the score of its rank and the same evidence.  So
    sessions with equal scores (the same texts under two ids) may swap, also at the
    k-th place: float rounding of another batch breaks such ties either way
    (docs/serving.md: "scores up to float rounding of another batch")."""
    assert len(got) == len(want) == len(full)
    for g, w, f in zip(got, want, full):
        assert g.conversation_id == w.conversation_id == f.conversation_id
        assert len(g.session_ids) == len(set(g.session_ids)) == len(w.session_ids) \
            == len(g.scores), (g, w)
        score = dict(zip(f.session_ids, f.scores))
        evidence = {sid: [(t, x) for t, x, _ in ev] for sid, ev in zip(f.session_ids,
                                                                       f.evidence)}
        for sid, a, b, ev in zip(g.session_ids, g.scores, w.scores, g.evidence):
            assert _close(a, b), (g.scores, w.scores)
            assert sid in score and _close(score[sid], b), (g, w)
            assert [(t, x) for t, x, _ in ev] == evidence[sid], (g, f)


def _assert_own(i, got, want):
    """Caller ``i`` got exactly the direct search's answer (or the same error)."""
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want), (i, got, want)
    else:
        assert not isinstance(got, Exception), (i, got)
        assert_same(got, *want)


class _Closing:
    """A Batcher closed with a timeout on exit (a hung worker fails the test instead of
    hanging it)."""

    def __init__(self, *a, **kw) -> None:
        self.b = Batcher(*a, **kw)

    def __enter__(self) -> Batcher:
        return self.b

    def __exit__(self, *exc) -> None:
        self.b.close(timeout=JOIN_S)


@pytest.mark.parametrize("seed", range(8))
def test_random_arrivals_and_failures_each_caller_gets_its_own_answer(mem, seed):
    rng = random.Random(seed)
    n = rng.randint(10, 22)
    calls = [_random_call(rng, i) for i in range(n)]
    marked = {i for i in range(n) if rng.random() < (0.25 if seed % 3 else 0.0)}
    fail_first = seed % 2 == 1
    max_batch = [64, 3, 5, 1, 64, 2, 8, 64][seed]
    max_wait = [20, 5, 40, 10, 0, 30, 15, 60][seed]
    delays = [rng.uniform(0, 0.03) for _ in range(n)]
    use_async = [rng.random() < 0.3 for _ in range(n)]
    want = [_direct(mem, c) for c in calls]
    rec = Recorder(mem, marked, fail_first)
    with _Closing(rec, max_batch, max_wait) as b:
        got, _, _ = _arrive(b, calls, delays, use_async)
    first = rec.calls[0]["tags"] if rec.calls else []
    for i in range(n):
        if isinstance(want[i], Exception):  # refused by the checks: never queued
            _assert_own(i, got[i], want[i])
            assert all(i not in c["tags"] for c in rec.calls)
        elif fail_first and first == [i]:  # alone in the call that failed: its error
            assert isinstance(got[i], Transient), (i, got[i])
        elif i in marked:  # its own error, naming it, never another caller's
            assert isinstance(got[i], Boom) and got[i].tag == i, (i, got[i])
        else:
            _assert_own(i, got[i], want[i])
            # answered by exactly one call that succeeded
            assert sum(c["ok"] and i in c["tags"] for c in rec.calls) == 1, (i, rec.calls)
    for c in rec.calls:  # the cap: questions per call, a single larger call alone
        assert len(c["tags"]) == 1 or sum(c["questions"]) <= max_batch, (max_batch, c)
    assert len({t for c in rec.calls for t in c["tags"]}) == \
        sum(not isinstance(w, Exception) for w in want)


@pytest.mark.parametrize("fail_first", [False, True])
@pytest.mark.parametrize("how", ["threads", "coroutines"])
def test_after_a_failed_batch_each_failing_retry_gets_its_own_error(mem, fail_first, how):
    """One batch of six callers, three of them marked (and, with ``fail_first``, the
    batch's own failure a different error): retried alone, each marked caller gets the
    error naming it, the others their direct results; then a lone marked call."""
    n = 6
    calls = [(CONVERSATIONS[i], [f"{QUESTIONS[i]} #{i}"], {"k": 3}) for i in range(n)]
    marked = {1, 3, 4}
    want = [_direct(mem, c) for c in calls]
    rec = Recorder(mem, marked, fail_first)
    with _Closing(rec, 64, 500) as b:
        got, _, _ = _arrive(b, calls, [0.002 * i for i in range(n)],
                            [how == "coroutines"] * n)
        assert sorted(rec.calls[0]["tags"]) == list(range(n))  # all shared one batch
        for i in range(n):
            if i in marked:
                assert isinstance(got[i], Boom) and got[i].tag == i, (i, got[i])
            else:
                _assert_own(i, got[i], want[i])
        assert b.stats()["retried"] == 1 and b.stats()["errors"] == len(marked)
        lone = (CONVERSATIONS[0], [f"{QUESTIONS[0]} #{n}"], {})
        rec.marked.add(n)
        got, _, _ = _arrive(b, [lone], [0], [how == "coroutines"])
        assert isinstance(got[0], Boom) and got[0].tag == n, got[0]
        assert rec.calls[-1]["tags"] == [n]


def test_two_calls_50ms_apart_share_one_batch(mem):
    calls = [("ana", [f"{QUESTIONS[0]} #0"], {"k": 3}), ("ben", [f"{QUESTIONS[1]} #1"], {})]
    rec = Recorder(mem)
    with _Closing(rec, 64, 300) as b:
        got, _, _ = _arrive(b, calls, [0.0, 0.05])
    assert [sorted(c["tags"]) for c in rec.calls] == [[0, 1]], rec.calls
    for i, c in enumerate(calls):
        _assert_own(i, got[i], _direct(mem, c))


@pytest.mark.parametrize("how", ["threads", "coroutines"])
def test_a_lone_call_waits_about_max_wait_ms(mem, how):
    """300 ms: at least ~0.2 s (not microseconds), well under 5 s (not seconds)."""
    call = ("ana", [f"{QUESTIONS[2]} #0"], {})
    rec = Recorder(mem)
    with _Closing(rec, 64, 300) as b:
        got, _, took = _arrive(b, [call], [0.0], [how == "coroutines"], timeout=10)
    waited = took[0][1] - took[0][0]
    assert 0.2 <= waited < 5.0, waited
    _assert_own(0, got[0], _direct(mem, call))
    assert [c["tags"] for c in rec.calls] == [[0]]


def test_a_steady_trickle_does_not_hold_back_the_oldest_call(mem):
    """``max_wait_ms`` counts from the oldest queued call: with calls arriving every
    0.15 s for about 2.4 s, the first is answered before the last one is even made (a
    window restarted by every arrival would hold it until the trickle stops)."""
    n = 17
    calls = [(CONVERSATIONS[i % 6], [f"{QUESTIONS[i % 6]} #{i}"], {}) for i in range(n)]
    rec = Recorder(mem)
    with _Closing(rec, 64, 300) as b:
        got, _, took = _arrive(b, calls, [0.15 * i for i in range(n)])
    assert took[0][1] < took[n - 1][0], (took[0], took[n - 1])
    assert len(rec.calls) >= 3, rec.calls  # batches went while the trickle went on
    for i, c in enumerate(calls):
        _assert_own(i, got[i], _direct(mem, c))


def test_max_batch_size_caps_the_questions_per_batch(mem):
    rng = random.Random(7)
    calls = [(rng.choice(CONVERSATIONS),
              [f"{rng.choice(QUESTIONS)} #{i}" for _ in range(1 + i % 3)], {"k": 2})
             for i in range(14)]
    calls.append(("ana", [f"{q} #14" for q in QUESTIONS], {}))  # 6 questions: alone
    rec = Recorder(mem)
    with _Closing(rec, 4, 200) as b:
        got, _, _ = _arrive(b, calls, [0.001 * i for i in range(len(calls))])
    for i, c in enumerate(calls):
        _assert_own(i, got[i], _direct(mem, c))
    for c in rec.calls:
        assert sum(c["questions"]) <= 4 or c["tags"] == [14], rec.calls
    assert any(len(c["tags"]) > 1 for c in rec.calls)  # calls did share batches


def test_a_full_batch_goes_at_once(mem):
    """Two one-question calls fill ``max_batch_size=2``: answered without waiting out
    ``max_wait_ms`` (20 s)."""
    calls = [("ana", [f"{QUESTIONS[0]} #0"], {}), ("ben", [f"{QUESTIONS[1]} #1"], {})]
    rec = Recorder(mem)
    with _Closing(rec, 2, 20_000) as b:
        got, _, took = _arrive(b, calls, [0.0, 0.0])
    assert max(end - start for start, end in took.values()) < 10.0, took
    assert [sorted(c["tags"]) for c in rec.calls] == [[0, 1]]
    for i, c in enumerate(calls):
        _assert_own(i, got[i], _direct(mem, c))


def test_max_batch_size_one_is_a_direct_call_in_the_callers_thread(mem):
    calls = [(CONVERSATIONS[i], [f"{QUESTIONS[i]} #{i}"], {"k": 2}) for i in range(4)]
    rec = Recorder(mem, marked={2})
    with _Closing(rec, 1, 20_000) as b:
        assert not b.batching
        got, ident, took = _arrive(b, calls, [0.0] * 4)
    assert max(end - start for start, end in took.values()) < 10.0, took  # no wait
    assert sorted(c["tags"] for c in rec.calls) == [[0], [1], [2], [3]]
    for c in rec.calls:
        assert c["thread"] == ident[c["tags"][0]]  # in the caller's own thread
    for i, c in enumerate(calls):
        if i == 2:
            assert isinstance(got[i], Boom) and got[i].tag == 2
        else:
            _assert_own(i, got[i], _direct(mem, c))


# ====================================================================== tenants
KEYS = {"alice-key-0123456789abcdef": "alice", "alice-key-rotated-00000000": "alice",
        "bob-key-fedcba9876543210": "bob", "bobby-key-1111111111111111": "bobby"}
TENANTS = sorted(set(KEYS.values()))
#: every id form: colliding between tenants, holding '/', spelling another tenant's
#: prefix (and one that 'bob' + ids would spell for 'bobby'), dots, a literal '%2F',
#: unicode, a trailing '/'
IDS = ["c1", "shared", "alice/c1", "bob/c1", "bobby/c1", "../alice/c1", "by/c1",
       "x%2Fy", "ü é/ñ", "c1/", "..", "a//b"]
#: who writes what at the start (the walk adds and forgets more)
START = {"alice": ["c1", "shared", "bob/c1", "x%2Fy", ".."],
         "bob": ["c1", "shared", "alice/c1", "by/c1", "a//b"],
         "bobby": ["c1", "../alice/c1", "ü é/ñ", "c1/"]}
SIDS = ["s0", "s1", "s2", "s3", "s4"]
FORMS = ["quote", "every", "lower"]


def _seg(s: str, form: str) -> str:
    """One path segment: percent-encoded as a client would ('.' and '..' too, else
    HTTP clients resolve them), every byte encoded, or every byte in lower-case hex."""
    if form == "quote":
        q = quote(s, safe="")
        return q.replace(".", "%2E") if set(s) <= {"."} else q
    hexes = [f"%{b:02X}" for b in s.encode("utf-8")]
    return "".join(h.lower() if form == "lower" else h for h in hexes)


def _tagged(tenant: str, cid: str, sid: str, n: int) -> Session:
    """A session whose every turn carries its owner's tag ``[owner tenant:cid]``."""
    tag = f"[owner {tenant}:{cid}]"
    topic = TOPICS[n % len(TOPICS)]
    return Session.from_messages(sid, f"2023-{1 + n % 12:02d}-{1 + n % 27:02d}", [
        {"role": "user", "content": f"{topic[0]} {tag}"},
        {"role": "assistant", "content": f"{topic[1]} {tag}"}])


def _body(s: Session) -> dict:
    return {"id": s.id, "date": s.date, "messages": [
        {"role": role, "content": text} for role, text in _messages(s)]}


def _messages(s: Session):
    for turn in s.turns:
        for line in turn.split("\n"):
            role, text = line.split("]: ", 1)
            yield role[1:], text


class Api:
    """One key's raw HTTP calls (ids percent-encoded in the form asked)."""

    def __init__(self, url: str, key: str) -> None:
        self.tenant = KEYS[key]
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=JOIN_S)

    def __call__(self, method, *segs, body=None, form="quote"):
        path = "/v1/" + "/".join(s if i % 2 == 0 else _seg(s, form)
                                 for i, s in enumerate(segs))
        r = self.http.request(method, path, json=body)
        return r.status_code, r.json()


class World:
    """The server, the memory it serves, one :class:`Api` per key, and the model: what
    each tenant wrote, ``{tenant: {cid: [Session]}}``."""

    def __init__(self, url, mem) -> None:
        self.url, self.mem = url, mem
        self.apis = [Api(url, k) for k in KEYS]
        self.model = {t: {} for t in TENANTS}
        self.n = 0

    def session(self, tenant, cid, sid) -> Session:
        self.n += 1
        return _tagged(tenant, cid, sid, self.n)

    # ------------------------------------------------------------------ oracles
    def check_memory(self) -> None:
        """The memory's own ids and sessions are the model's, tenant-qualified."""
        have = {m.id: list(m.session_ids) for m in self.mem.conversations}
        assert have == {f"{t}/{c}": [s.id for s in ss] for t in TENANTS
                        for c, ss in self.model[t].items()}

    def check_search(self, api, cids, k=10, form=None) -> None:
        """A search of ``cids`` (a list: one per question; a string: one id) equals a
        direct search of the caller's qualified ids; everything it shows is the
        caller's own (session ids, owner tags of the evidence)."""
        t = api.tenant
        ids = cids if isinstance(cids, list) else [cids] * 2
        qs = [QUESTIONS[(j + len(c)) % len(QUESTIONS)] for j, c in enumerate(ids)]
        status, body = api("POST", "search", body={"conversation_id": cids,
                                                   "questions": qs, "k": k})
        assert status == 200, body
        mine = [f"{t}/{c}" for c in ids]
        want, full = self.mem.search(mine, qs, k=k), self.mem.search(mine, qs, k=ALL)
        assert len(body["results"]) == len(ids)
        got = [SearchResult(r["conversation_id"], r["session_ids"], r["scores"],
                            [[(e["turn"], e["text"], e["score"]) for e in ev]
                             for ev in r["evidence"]]) for r in body["results"]]
        assert_same(got, *[[SearchResult(c, w.session_ids, w.scores, w.evidence)
                            for c, w in zip(ids, x)] for x in (want, full)])
        for c, r in zip(ids, body["results"]):
            own = self.model[t].get(c, [])
            assert r["conversation_id"] == c
            assert set(r["session_ids"]) <= {s.id for s in own}, (t, c, r)
            assert bool(r["session_ids"]) == bool(own), (t, c, r)
            texts = [e["text"] for ev in r["evidence"] for e in ev]
            assert all(f"[owner {t}:{c}]" in x for x in texts), (t, c, texts)

    def check_reads(self, api, cid, form) -> None:
        t = api.tenant
        own = self.model[t].get(cid)
        status, body = api("GET", "conversations", cid, form=form)
        if own is None:
            assert status == 404 and body["error"]["code"] == "not_found", (t, cid, body)
        else:
            dates = [s.date for s in own if s.date]
            assert status == 200 and body == {
                "id": cid, "sessions": len(own), "first_date": dates[0] if dates else None,
                "last_date": dates[-1] if dates else None}, (t, cid, body)
        status, body = api("GET", "conversations", cid, "sessions", form=form)
        if own is None:
            assert status == 404 and body["error"]["code"] == "not_found", (t, cid, body)
        else:
            assert status == 200, body
            assert body == {"conversation_id": cid, "sessions": [
                {"id": s.id, "date": s.date, "metadata": {}} for s in own],
                "next_cursor": None}
        for sid in SIDS:
            s = next((x for x in own or [] if x.id == sid), None)
            status, body = api("GET", "conversations", cid, "sessions", sid, form=form)
            if s is None:
                assert status == 404, (t, cid, sid, body)
            else:
                assert status == 200 and body == {"id": sid, "date": s.date, "metadata": {},
                                                  "turns": list(s.turns)}, (t, cid, body)
                assert all(f"[owner {t}:{cid}]" in x for x in body["turns"])

    def check_listing(self, api) -> None:
        status, body = api("GET", "conversations")
        assert status == 200
        assert body["next_cursor"] is None
        got = {c["id"]: (c["sessions"], c["first_date"], c["last_date"])
               for c in body["conversations"]}

        def summary(ss):
            dates = [s.date for s in ss if s.date]
            return (len(ss), dates[0] if dates else None, dates[-1] if dates else None)
        assert got == {c: summary(ss) for c, ss in self.model[api.tenant].items()}, \
            (api.tenant, got)

    def check_everything(self, round_: int = 0) -> None:
        """Every key: its listing, every id of IDS read in a rotating form, one search
        per id and one with the list of every id."""
        self.check_memory()
        for api in self.apis:
            self.check_listing(api)
            for j, cid in enumerate(IDS):
                self.check_reads(api, cid, FORMS[(j + round_) % len(FORMS)])
                self.check_search(api, cid)
            self.check_search(api, IDS[round_ % len(IDS):] + IDS[:round_ % len(IDS)])

    # ------------------------------------------------------------------ writes
    def add(self, api, cid, sids, form, several) -> None:
        t = api.tenant
        new = [self.session(t, cid, sid) for sid in sids]
        body = {"sessions": [_body(s) for s in new]} if several else _body(new[0])
        status, out = api("POST", "conversations", cid, "sessions", body=body, form=form)
        have = {s.id for s in self.model[t].get(cid, [])}
        if have & set(sids):
            assert status == 409 and out["error"]["code"] == "conflict", (t, cid, out)
        else:
            assert status == 201, (t, cid, out)
            assert out == {"conversation_id": cid, "added": [
                {"id": s.id, "date": s.date, "turns": len(s.turns)} for s in new]}
            self.model[t].setdefault(cid, []).extend(new)

    def remove(self, api, cid, sid, form) -> None:
        t = api.tenant
        own = self.model[t].get(cid)
        status, out = api("DELETE", "conversations", cid, "sessions", sid, form=form)
        if own is None or sid not in {s.id for s in own}:
            assert status == 404, (t, cid, sid, out)
        else:
            assert status == 200 and out == {"conversation_id": cid, "removed": sid}
            self.model[t][cid] = [s for s in own if s.id != sid]

    def replace(self, api, cid, sid, form) -> None:
        """PUT of a new version of session ``sid``: in its place, or 404."""
        t = api.tenant
        own = self.model[t].get(cid)
        new = self.session(t, cid, sid)
        status, out = api("PUT", "conversations", cid, "sessions", sid, body=_body(new),
                          form=form)
        if own is None or sid not in {s.id for s in own}:
            assert status == 404 and out["error"]["code"] == "not_found", (t, cid, sid, out)
        else:
            assert status == 200 and out == {"conversation_id": cid, "replaced": {
                "id": sid, "date": new.date, "turns": len(new.turns)}}, (t, cid, out)
            self.model[t][cid] = [new if s.id == sid else s for s in own]

    def forget(self, api, cid, form) -> None:
        t = api.tenant
        status, out = api("DELETE", "conversations", cid, form=form)
        if cid not in self.model[t]:
            assert status == 404, (t, cid, out)
        else:
            assert status == 200 and out == {"forgotten": cid}
            del self.model[t][cid]


@pytest.fixture(scope="module")
def world(encoder):
    """``memgas serve`` in process (uvicorn in a thread) over a memory opened on a
    temporary folder, with the keys of :data:`KEYS`; every tenant's START written."""
    with tempfile.TemporaryDirectory(prefix="memgas-oracles-serve-") as tmp:
        mem = MemoryIndex.open(Path(tmp) / "mem", encoder=encoder)
        backend = LocalBackend(mem, Batcher(mem, max_batch_size=16, max_wait_ms=5))
        app = create_app(backend, parse_keys(json.dumps(KEYS), "test"))
        try:
            with running(app) as url:
                w = World(url, mem)
                for j, (t, cids) in enumerate(sorted(START.items())):
                    api = next(a for a in w.apis if a.tenant == t)
                    for i, cid in enumerate(cids):  # one session, then several at once
                        w.add(api, cid, ["s0"], FORMS[(i + j) % 3], several=False)
                        w.add(api, cid, ["s1", "s2"], FORMS[(i + j + 1) % 3], several=True)
                yield w
                for api in w.apis:
                    api.http.close()
        finally:
            asyncio.run(backend.close())


def test_tenants_see_only_their_own_conversations_under_every_id_form(world):
    """Right after the start: every key, every id of IDS in every form, every read
    route and both search forms see exactly the tenant's own model."""
    for round_ in range(len(FORMS)):
        world.check_everything(round_)


def test_foreign_ids_reach_nothing_on_any_route(world):
    """For every key and every id it does not own (another tenant's unqualified id
    included, and the memory's own qualified ids), in every form: reads and deletes are
    404 and the memory does not change."""
    qualified = [f"{t}/{c}" for t in TENANTS for c in START[t]]
    for api in world.apis:
        foreign = [c for c in IDS + qualified if c not in world.model[api.tenant]]
        for j, cid in enumerate(foreign):
            form = FORMS[j % len(FORMS)]
            put = _body(world.session(api.tenant, cid, "s0"))
            status, body = api("PUT", "conversations", cid, "sessions", "s0", body=put,
                               form=form)
            assert status == 404 and body["error"]["code"] == "not_found", \
                (api.tenant, "PUT", cid, body)
            for method, segs in (("GET", ("conversations", cid)),
                                 ("GET", ("conversations", cid, "sessions")),
                                 ("GET", ("conversations", cid, "sessions", "s0")),
                                 ("DELETE", ("conversations", cid, "sessions", "s0")),
                                 ("DELETE", ("conversations", cid))):
                status, body = api(method, *segs, form=form)
                assert status == 404 and body["error"]["code"] == "not_found", \
                    (api.tenant, method, cid, body)
            world.check_search(api, cid)
        world.check_search(api, foreign[::-1])
        world.check_memory()


def test_the_client_reaches_dot_ids_and_only_them(world):
    """``mg.Client`` with the ids '.' and '..' (conversations and a session): each call
    reaches exactly that id; removing the session '..' of 'c1' never forgets 'c1' (an
    unescaped '..' segment is resolved away by the HTTP client: DELETE
    .../c1/sessions/.. became DELETE .../c1)."""
    from memgas_gpu.serve import Client

    t = "bobby"
    key = next(k for k, v in KEYS.items() if v == t)
    api = next(a for a in world.apis if a.tenant == t)
    if "c1" not in world.model[t]:
        world.add(api, "c1", ["s0"], "quote", several=False)
    with Client(world.url, key=key) as c:
        for cid in (".", ".."):
            s = world.session(t, cid, "..")
            c.add_session(cid, s)
            world.model[t].setdefault(cid, []).append(s)
            world.check_memory()
            assert c.sessions(cid) == [{"id": x.id, "date": x.date, "metadata": {}}
                                       for x in world.model[t][cid]]
            assert c.get_session(cid, "..")["turns"] == list(s.turns)
            got = c.search(cid, [QUESTIONS[0]], k=3)
            assert got[0].conversation_id == cid and got[0].session_ids == [".."]
        s = world.session(t, "c1", "..")
        c.add_session("c1", s)
        world.model[t]["c1"].append(s)
        world.check_memory()
        c.remove_session("c1", "..")
        world.model[t]["c1"].remove(s)
        world.check_memory()  # 'c1' and its other sessions are still there
        with pytest.raises(KeyError):
            c.remove_session("c1", "..")
        with pytest.raises(KeyError):
            c.get_session("c1", ".")
        world.check_memory()
        for cid in ("..", "."):
            c.forget_conversation(cid)
            del world.model[t][cid]
            world.check_memory()
    world.check_listing(api)


def test_a_list_search_over_an_emptied_conversation(world):
    """A conversation whose sessions were all removed, searched in a list with others
    (one read over the union of their conversations): empty for it, the others' own
    results (it once failed the whole search with a 500: join_postings indexed the
    last pointer of a conversation without postings)."""
    alice = next(a for a in world.apis if a.tenant == "alice")
    world.add(alice, "emptied", ["s0"], "quote", several=False)
    world.add(alice, "later", ["s0", "s1"], "quote", several=True)  # after it in the memory
    world.remove(alice, "emptied", "s0", "every")
    assert world.model["alice"]["emptied"] == []
    world.check_memory()
    world.check_search(alice, ["emptied", "later", "emptied", "c1"])
    world.check_search(alice, ["later", "emptied"])
    world.check_search(alice, "emptied")
    for cid in ("emptied", "later"):
        world.forget(alice, cid, "lower")
    world.check_memory()


def test_a_random_walk_over_every_route_keeps_tenants_apart(world):
    rng = random.Random(20240501)
    ops = ["add", "add_several", "remove", "forget", "read", "search", "search_list",
           "list", "replace"]
    weights = [4, 3, 3, 1, 2, 2, 2, 1, 2]
    for step in range(150):
        api = rng.choice(world.apis)
        cid, form = rng.choice(IDS), rng.choice(FORMS)
        op = rng.choices(ops, weights)[0]
        if op == "add":
            world.add(api, cid, [rng.choice(SIDS)], form, several=False)
        elif op == "add_several":
            world.add(api, cid, rng.sample(SIDS, rng.randint(2, 3)), form, several=True)
        elif op == "remove":
            world.remove(api, cid, rng.choice(SIDS), form)
        elif op == "forget":
            world.forget(api, cid, form)
        elif op == "replace":
            world.replace(api, cid, rng.choice(SIDS), form)
        elif op == "read":
            world.check_reads(api, cid, form)
        elif op == "search":
            world.check_search(api, cid, k=rng.randint(1, 6))
        elif op == "search_list":
            world.check_search(api, rng.sample(IDS, rng.randint(2, 6)), k=rng.randint(1, 6))
        else:
            world.check_listing(api)
        world.check_memory()
        if step % 75 == 74:
            world.check_everything(step)
    # the walk wrote, removed and forgot in every tenant, and ids collided
    assert all(world.model[t] for t in TENANTS)
    world.check_everything()


def test_concurrent_tenants_share_batches_but_not_answers(world):
    """Every key searching at once (single ids and lists over the same colliding ids):
    the server's batcher mixes the tenants' questions in its batches; each answer is the
    caller's own (the oracle checks run in each thread)."""
    errors = []
    start = threading.Barrier(len(world.apis))

    def work(a, api):
        rng = random.Random(a)
        try:
            start.wait(30)
            for _ in range(12):
                if rng.random() < 0.5:
                    world.check_search(api, rng.choice(IDS), k=rng.randint(1, 6))
                else:
                    world.check_search(api, rng.sample(IDS, rng.randint(2, 5)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((api.tenant, e))

    ts = [threading.Thread(target=work, args=(a, api), daemon=True)
          for a, api in enumerate(world.apis)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in ts)
    assert not errors, errors[:3]
