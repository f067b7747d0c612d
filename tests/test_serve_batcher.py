"""The search batcher: many threads (and coroutines) at once, each gets exactly what a
direct ``MemoryIndex.search`` with its arguments returns (the oracle), its own error for
its own bad arguments, and nothing of anyone else's; tenants share the batches fairly
(a one-question search is answered within two batches while another tenant's
2,000-question search is queued), large requests are cut into pieces that fit, and a
cancelled caller's pieces are never asked."""
from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from memgas_gpu import Dataset, Session
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.serve import Batcher

from _memory_model import tiny_encoder
from _serve import CONVERSATIONS, DATES, QUESTIONS, TOPICS, assert_same, populate, search_mix


@pytest.fixture(scope="module")
def mem():
    m = MemoryIndex.build(Dataset([]), tiny_encoder(), device="cpu", progress=False)
    populate(m)
    return m


@pytest.fixture(scope="module")
def oracle(mem):
    """Each search of the mix, asked directly, one at a time."""
    return [mem.search(c, q, **kw) for c, q, kw in search_mix()]


def _hammer(call, mix, rounds=2, threads=16):
    """Every search of ``mix`` ``rounds`` times, spread over ``threads`` threads that
    start together; ``{(round, i): result or exception}``."""
    jobs = [(r, i) for r in range(rounds) for i in range(len(mix))]
    out, lock = {}, threading.Lock()
    start = threading.Barrier(threads)

    def work(t):
        start.wait()
        for r, i in jobs[t::threads]:
            c, q, kw = mix[i]
            try:
                got = call(c, q, **kw)
            except Exception as e:  # noqa: BLE001 - compared below
                got = e
            with lock:
                out[(r, i)] = got

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert len(out) == len(jobs)
    return out


def test_many_threads_get_exactly_their_own_results(mem, oracle):
    mix = search_mix()
    with Batcher(mem, max_batch_size=16, max_wait_ms=20) as b:
        got = _hammer(b.search, mix)
        stats = b.stats()
    for (r, i), res in got.items():
        assert not isinstance(res, Exception), (mix[i], res)
        assert_same(res, oracle[i])
    assert stats["requests"] == len(got) and stats["errors"] == 0
    assert stats["questions"] == 2 * sum(len(q) for _, q, _ in mix)
    assert stats["batches"] < stats["requests"]  # calls did share batches
    assert stats["mean_batch_size"] == stats["questions"] / stats["batches"]
    assert stats["batch_sizes"]["+Inf"] == stats["batches"]
    assert stats["queue_depth"] == 0


def test_a_bad_caller_gets_its_own_error_and_the_others_their_results(mem, oracle):
    mix = search_mix()
    bad = [("ana", ["q"], {"k": 0}), ("ana", "one string", {}),
           ("ana", ["q"], {"method": "no-such-method"}),
           ("ana", ["q"], {"after": "not a date at all"}),
           ("ana", ["q"], {"damping": "high"}), (42, ["q"], {}),
           ("ana", ["q"], {"metadata": {"topic": object()}})]
    both = mix + bad
    with Batcher(mem, max_batch_size=64, max_wait_ms=20) as b:
        got = _hammer(b.search, both)
    for (r, i), res in got.items():
        if i < len(mix):
            assert_same(res, oracle[i])
        else:
            assert isinstance(res, (TypeError, ValueError)), (both[i], res)
            c, q, kw = both[i]
            try:
                mem.search(c, q, **kw)
            except Exception as e:  # noqa: BLE001 - the direct call's error is the oracle
                assert type(res) is type(e) and str(res) == str(e)
            else:
                raise AssertionError(f"{both[i]} is not an error for the memory")


class _Flaky:
    """A memory whose ``search_many`` fails any batch that asks about ``"boom"`` (an
    error the checks before batching cannot see)."""

    def __init__(self, mem) -> None:
        self.mem = mem

    def search_many(self, requests, **kw):
        if any("boom" in r.conversation_id for r in requests):
            raise RuntimeError("boom")
        return self.mem.search_many(requests, **kw)


def test_a_request_failing_its_batch_fails_only_its_caller(mem, oracle):
    mix = search_mix()
    both = mix + [("boom", ["q"], {})] * 3
    with Batcher(_Flaky(mem), max_batch_size=64, max_wait_ms=50) as b:
        got = _hammer(b.search, both)
        stats = b.stats()
    for (r, i), res in got.items():
        if i < len(mix):
            assert_same(res, oracle[i])
        else:
            assert isinstance(res, RuntimeError) and str(res) == "boom"
    assert stats["retried"] >= 1 and stats["errors"] == 6


def test_batch_size_one_is_direct_calls(mem, oracle):
    mix = search_mix()
    with Batcher(mem, max_batch_size=1) as b:
        assert not b.batching
        got = _hammer(b.search, mix, rounds=1, threads=8)
        stats = b.stats()
    for (_, i), res in got.items():
        assert_same(res, oracle[i])
    assert stats["batches"] == stats["requests"] == len(mix)


def test_coroutines_share_batches_with_threads(mem, oracle):
    mix = search_mix()

    async def main(b):
        return await asyncio.gather(*[b.asearch(c, q, **kw) for c, q, kw in mix],
                                    return_exceptions=True)

    with Batcher(mem, max_batch_size=32, max_wait_ms=20) as b:
        got = asyncio.run(main(b))
        stats = b.stats()
    for res, want in zip(got, oracle):
        assert_same(res, want)
    assert stats["batches"] < len(mix)
    with Batcher(mem, max_batch_size=1) as b:  # off: direct calls in the loop's executor
        got = asyncio.run(main(b))
    for res, want in zip(got, oracle):
        assert_same(res, want)


def test_close_answers_what_is_queued_then_refuses(mem, oracle):
    mix = search_mix()[:6]
    b = Batcher(mem, max_batch_size=64, max_wait_ms=500)
    out = {}
    ts = [threading.Thread(target=lambda i=i: out.__setitem__(
        i, b.search(mix[i][0], mix[i][1], **mix[i][2]))) for i in range(len(mix))]
    for t in ts:
        t.start()
    b.close()
    for t in ts:
        t.join(60)
    for i, res in out.items():
        assert_same(res, oracle[i])
    with pytest.raises(RuntimeError, match="closed"):
        b.search("ana", ["q"])


@pytest.mark.parametrize("bad, match", [
    (dict(max_batch_size=0), "max_batch_size"), (dict(max_batch_size=True), "max_batch_size"),
    (dict(max_wait_ms=-1), "max_wait_ms"), (dict(max_wait_ms=float("nan")), "max_wait_ms")])
def test_bad_settings_are_refused_naming_them(mem, bad, match):
    with pytest.raises(ValueError, match=match):
        Batcher(mem, **bad)


# ---------------------------------------------------------------------- fair sharing
def twin_free(conversations=CONVERSATIONS) -> dict:
    """``{conversation id: [(Session, metadata)]}`` like :func:`_serve.populate`'s but
    without twins: no conversation holds one text under two session ids (the
    populated memory does, and another batch's float rounding may order their exact
    ties either way)."""
    out = {}
    for c, cid in enumerate(conversations):
        out[cid] = [(Session.from_messages(f"s{j}", DATES[(j + c) % len(DATES)], [
            {"role": "user", "content": TOPICS[(j + c) % len(TOPICS)][0]},
            {"role": "assistant", "content": TOPICS[(j + c) % len(TOPICS)][1]}]),
            {"topic": ["pets", "music", "family", "travel"][j % 4], "n": j})
            for j in range(4 + c % 4)]
    return out


def add_twin_free(m, conversations=CONVERSATIONS) -> None:
    """Add :func:`twin_free`'s sessions to ``m``, one ``add_sessions`` per conversation."""
    for cid, items in twin_free(conversations).items():
        m.add_sessions(cid, [s for s, _ in items], metadata=[md for _, md in items])


@pytest.fixture(scope="module")
def mem2():
    m = MemoryIndex.build(Dataset([]), tiny_encoder(), device="cpu", progress=False)
    add_twin_free(m)
    return m


def same(got: list, want: list) -> None:
    """:func:`assert_same` at the tolerance of batches of hundreds of questions: their
    scores differ from a lone request's by up to ~1.3e-5 (float rounding through the
    read path); the ranks and evidence do not."""
    assert_same(got, want, tol=1e-4)


class _Recorder:
    """A memory that records the questions of each ``search_many`` call (one list of
    query lists per call), fails any call that asks a question containing ``"boom"``
    (an error the checks before batching cannot see), and, given ``gate``, holds its
    first call until the gate opens (``entered`` is set once a call has started)."""

    def __init__(self, mem, gate=None) -> None:
        self.mem, self.gate = mem, gate
        self.calls, self.lock = [], threading.Lock()
        self.entered = threading.Event()

    def search_many(self, requests, **kw):
        with self.lock:
            self.calls.append([list(r.queries) for r in requests])
            first = len(self.calls) == 1
        self.entered.set()
        if first and self.gate is not None:
            assert self.gate.wait(60)
        if any("boom" in q for r in requests for q in r.queries):
            raise RuntimeError("boom")
        return self.mem.search_many(requests, **kw)

    def asked(self, tag: str) -> int:
        """Questions asked so far that carry ``tag``."""
        with self.lock:
            return sum(tag in q for call in self.calls for qs in call for q in qs)

    def call_of(self, text: str) -> int:
        """The 1-based number of the first call that asked ``text``."""
        with self.lock:
            return next(n for n, call in enumerate(self.calls, 1)
                        if any(text in q for qs in call for q in qs))


def _big(b, tag: str, n: int, boom_at=None):
    """A checked request of ``n`` distinct questions tagged ``tag`` over the
    conversations (the question ``boom_at`` fails its batch)."""
    qs = [f"{QUESTIONS[j % len(QUESTIONS)]} {tag} {j}" for j in range(n)]
    if boom_at is not None:
        qs[boom_at] += " boom"
    return b.request([CONVERSATIONS[j % len(CONVERSATIONS)] for j in range(n)], qs, k=3)


async def _blocked_first_batch(b, rec, coro):
    """Start ``coro`` (a task) and wait until the memory holds its first batch."""
    task = asyncio.ensure_future(coro)
    while not rec.entered.is_set():
        await asyncio.sleep(0.001)
    return task


@pytest.fixture(scope="module")
def floods(mem2):
    """Tenant A's 2,000 questions as one request, or as 100 requests of 20, with the
    direct answers of some (one ``search_many`` each)."""
    b = Batcher(mem2, max_batch_size=1)
    out = {"one large request": [_big(b, "A", 2000)],
           "many small requests": [_big(b, f"A{i}x", 20) for i in range(100)]}
    return {k: (reqs, {i: mem2.search_many([reqs[i]])[0] for i in range(0, len(reqs), 25)})
            for k, reqs in out.items()}


@pytest.mark.parametrize("flood", ["one large request", "many small requests"])
def test_a_one_question_search_waits_two_batches_not_for_a_flood(mem2, floods, flood):
    """Tenant A's 2,000 questions are queued (one request, or 100 of 20), B asks one
    question three times at once while A's first batch is answered: B's questions are
    in the next batch (fair: B's share of it is 32 questions), not in the last one
    (first come, first served)."""
    mbs = 64
    reqs, oracle = floods[flood]
    b1 = Batcher(mem2, max_batch_size=1)
    smalls = [b1.request(c, [f"Who visits from Lisbon? (B{i})"], k=3)
              for i, c in enumerate(("ana", "ben", "fay"))]

    async def run(fair):
        gate = threading.Event()
        rec = _Recorder(mem2, gate)
        with Batcher(rec, max_batch_size=mbs, max_wait_ms=5, fair=fair) as b:
            first = asyncio.ensure_future(b.asearch_request(reqs[0], tenant="A"))
            while not rec.entered.is_set():
                await asyncio.sleep(0.001)
            a = [first] + [asyncio.ensure_future(b.asearch_request(r, tenant="A"))
                           for r in reqs[1:]]
            await asyncio.sleep(0.01)  # A's calls are queued behind the first batch
            bt = [asyncio.ensure_future(b.asearch_request(r, tenant="B")) for r in smalls]
            await asyncio.sleep(0.01)
            assert b.stats()["tenants_queued"] == (2 if fair else 1)
            gate.set()
            got_b = await asyncio.gather(*bt)
            a_done_when_b = sum(t.done() for t in a)
            got_a = await asyncio.gather(*a)
        stats = b.stats()  # closed: the worker is done
        for r, g in zip(smalls, got_b):
            same(g, mem2.search_many([r])[0])
        for i, want in oracle.items():
            same(got_a[i], want)
        assert all(len(g) == len(r.queries) for g, r in zip(got_a, reqs))
        assert stats["queue_depth"] == stats["tenants_queued"] == stats["in_flight"] == 0
        assert all(sum(map(len, call)) <= mbs for call in rec.calls)
        return (max(rec.call_of(f"(B{i})") for i in range(3)), len(rec.calls), a_done_when_b,
                len(a))

    at, calls, a_done, a_n = asyncio.run(run(fair=True))
    assert calls >= 2001 // mbs
    assert at <= 2, f"B's last question was in batch {at} of {calls}"
    if a_n > 1:
        assert a_done < a_n  # B did not wait for all of A
    at, calls, _, _ = asyncio.run(run(fair=False))  # the contrast: B waits for all of A
    assert at >= calls - 1, (at, calls)


def test_with_more_tenants_than_room_each_is_served_every_few_batches(mem2):
    """10 tenants with 40 questions each and room for 4 questions a batch: while a
    tenant has work queued, batches serving it are at most ceil(10 / 4) = 3 apart
    (the least recently served go first), and a tenant arriving late is in one of the
    3 batches after the one being answered when it came."""
    mbs, tenants = 4, [f"T{i}" for i in range(10)]

    async def run():
        gate = threading.Event()
        rec = _Recorder(mem2, gate)
        with Batcher(rec, max_batch_size=mbs, max_wait_ms=1) as b:
            reqs = {t: b.request("ben", [f"Was the trail muddy? <{t}> {j}" for j in range(40)],
                                 k=2, method="bm25") for t in tenants}
            first = await _blocked_first_batch(b, rec, b.asearch_request(reqs["T0"], "T0"))
            rest = [asyncio.ensure_future(b.asearch_request(reqs[t], t)) for t in tenants[1:]]
            await asyncio.sleep(0.01)
            gate.set()
            while len(rec.calls) < 20:
                await asyncio.sleep(0.001)
            late_at = len(rec.calls)
            late = await b.asearch_request(b.request("ana", ["<late>"], k=2), "late")
            await asyncio.gather(first, *rest)
        return rec, late_at, late

    rec, late_at, late = asyncio.run(run())
    for t in tenants:
        served = [n for n, call in enumerate(rec.calls)
                  if any(f"<{t}>" in q for qs in call for q in qs)]
        assert sum(f"<{t}>" in q for call in rec.calls for qs in call for q in qs) == 40
        gaps = [y - x for x, y in zip(served, served[1:])]
        assert max(gaps) <= 3, (t, served)
    assert rec.call_of("<late>") <= late_at + 1 + 3
    assert len(late) == 1


def test_a_cancelled_callers_pieces_are_never_asked(mem2):
    async def run():
        gate = threading.Event()
        rec = _Recorder(mem2, gate)
        with Batcher(rec, max_batch_size=16, max_wait_ms=5) as b:
            task = await _blocked_first_batch(b, rec, b.asearch_request(_big(b, "C", 500),
                                                                        tenant="C"))
            assert b.stats()["queue_depth"] == 1
            task.cancel()
            await asyncio.sleep(0)  # the cancelled call withdraws its pieces
            assert b.stats()["queue_depth"] == 0
            gate.set()
            other = await b.asearch("ben", ["Was the trail muddy?"], k=2)
            with pytest.raises(asyncio.CancelledError):
                await task
            return rec, other

    rec, other = asyncio.run(run())
    assert rec.asked("C") == 16  # the first batch only
    same(other, mem2.search("ben", ["Was the trail muddy?"], k=2))


def test_a_failing_piece_fails_its_request_and_drops_the_rest(mem2):
    async def run():
        rec = _Recorder(mem2)
        with Batcher(rec, max_batch_size=16, max_wait_ms=5) as b:
            bad = _big(b, "F", 400, boom_at=40)
            good = _big(b, "G", 100)
            got = await asyncio.gather(b.asearch_request(bad, tenant="F"),
                                       b.asearch_request(good, tenant="G"),
                                       return_exceptions=True)
            stats = b.stats()
        return rec, got, good, stats

    rec, (bad, ok), good, stats = asyncio.run(run())
    assert isinstance(bad, RuntimeError) and str(bad) == "boom"
    same(ok, mem2.search_many([good])[0])
    assert rec.asked("F") < 400 // 2  # the pieces after the failing one: not asked
    assert stats["retried"] >= 1 and stats["queue_depth"] == 0


def test_a_lone_call_waits_about_max_wait_ms(mem2):
    stamps = []

    class Stamped:
        def search_many(self, requests, **kw):
            stamps.append(time.monotonic())
            return mem2.search_many(requests, **kw)

    with Batcher(Stamped(), max_batch_size=64, max_wait_ms=200) as b:
        req = b.request("ana", ["What breed is Rex?"])
        for tenant in (None, "t"):
            stamps.clear()
            t0 = time.monotonic()
            b.search_request(req, tenant=tenant)
            waited = stamps[0] - t0
            assert 0.195 <= waited <= 0.2 + 0.1, waited


def test_a_caller_whose_event_loop_is_gone_harms_nobody(mem2):
    """A coroutine's loop closes while its search is queued: the callers batched with
    it still get their results, and the worker lives on."""
    gate = threading.Event()
    rec = _Recorder(mem2, gate)
    out = {}

    def ask(name, cid, q):
        try:
            out[name] = b.search(cid, [q], k=2)
        except Exception as e:  # noqa: BLE001 - compared below
            out[name] = e

    with Batcher(rec, max_batch_size=8, max_wait_ms=1) as b:
        first = threading.Thread(target=ask, args=("first", "ana", "What breed is Rex?"))
        first.start()
        assert rec.entered.wait(30)
        loop = asyncio.new_event_loop()
        loop.create_task(b.asearch("dev", ["Who visits from Lisbon?"]))
        loop.run_until_complete(asyncio.sleep(0.01))  # queued behind the first batch
        loop.close()  # with the call still queued
        after = threading.Thread(target=ask, args=("after", "ben", "Was the trail muddy?"))
        after.start()
        time.sleep(0.05)  # queued in the same batch as the gone caller's
        gate.set()
        for t in (first, after):
            t.join(60)
        ask("later", "fay", "What about the trip budget?")
    assert len(rec.calls) == 3 and len(rec.calls[1]) == 2  # the gone caller's batch
    for name, cid, q in (("first", "ana", "What breed is Rex?"),
                         ("after", "ben", "Was the trail muddy?"),
                         ("later", "fay", "What about the trip budget?")):
        same(out[name], mem2.search(cid, [q], k=2))


@pytest.mark.parametrize("tenant", [[1], {}])
def test_a_bad_tenant_or_request_is_refused(mem2, tenant):
    with Batcher(mem2, max_batch_size=8) as b:
        req = b.request("ana", ["q"])
        with pytest.raises(TypeError, match="tenant must be hashable"):
            asyncio.run(b.asearch_request(req, tenant=tenant))
        with pytest.raises(TypeError, match="SearchRequest"):
            asyncio.run(b.asearch_request({"conversation_id": "ana"}))
        with pytest.raises(ValueError):
            b.search_request(type(req)("ana", ["q"], k=0))
        assert b.stats()["queue_depth"] == 0


# ---------------------------------------------------------------------- the property
def _random_request(b, rng, tag: str):
    """A random request: 1-3 questions (mostly) or 20-80, random conversations (some
    unknown), k, method and filters; some ask a question that fails its batch."""
    n = rng.randint(1, 3) if rng.random() < 0.75 else rng.randint(20, 80)
    convs = [rng.choice(CONVERSATIONS + ["nobody"]) for _ in range(n)]
    qs = [f"{rng.choice(QUESTIONS)} {tag} {j}" for j in range(n)]
    if rng.random() < 0.15:
        qs[rng.randrange(n)] += " boom"
    kw = {"k": rng.randint(1, 5)}
    m = rng.choice([None, None, "bm25", "memgas", "session"])
    if m:
        kw["method"] = m
    if rng.random() < 0.2:
        kw["after"] = "2023-06-10"
    if rng.random() < 0.1:
        kw["metadata"] = {"topic": "music"}
    return b.request(convs, qs, **kw)


@pytest.mark.parametrize("seed, fair", [
    (0, True), (1, False), (2, True),
    *[pytest.param(s, f, marks=pytest.mark.slow) for s in range(3, 9) for f in (True, False)]])
def test_random_tenants_arrivals_sizes_failures_and_cancels(mem2, seed, fair):
    """Callers of several tenants at random times (coroutines, and threads through the
    plain ``search``), small and large requests, some failing, some cancelled: each
    gets exactly ``memory.search_many([its request])[0]`` or its own error, and a
    cancelled caller's questions stop being asked within one batch (two with the
    retry of a failed batch)."""
    rng = random.Random(seed)
    mbs = rng.choice([4, 16, 32])
    rec = _Recorder(mem2)
    tenants = ["t0", "t1", "t2", None]
    plan = []

    async def run():
        loop = asyncio.get_running_loop()
        with Batcher(rec, max_batch_size=mbs, max_wait_ms=rng.choice([1, 5, 20]),
                     fair=fair) as b:
            for i in range(30):
                req = _random_request(b, rng, f"[r{i}]")
                how = rng.choice(["async", "async", "async", "thread"])
                cancel = rng.uniform(0, 0.05) if how == "async" and rng.random() < 0.2 \
                    else None
                plan.append((req, how, rng.choice(tenants), rng.uniform(0, 0.08), cancel))

            async def caller(i, req, how, tenant, delay, cancel):
                await asyncio.sleep(delay)
                if how == "thread":
                    return await loop.run_in_executor(None, lambda: b.search(
                        req.conversation_id, req.queries, k=req.k, method=req.method,
                        after=req.after, metadata=req.metadata))
                task = asyncio.ensure_future(b.asearch_request(req, tenant=tenant))
                if cancel is None:
                    return await task
                await asyncio.sleep(cancel)
                task.cancel()
                await asyncio.sleep(0)
                asked = rec.asked(f"[r{i}]")
                try:
                    got = await task
                except asyncio.CancelledError:
                    return ("cancelled", asked)
                return got

            got = await asyncio.gather(*[caller(i, *p) for i, p in enumerate(plan)],
                                       return_exceptions=True)
        return got, b.stats()  # closed: the worker is done

    got, stats = asyncio.run(run())
    for i, ((req, how, tenant, _, cancel), res) in enumerate(zip(plan, got)):
        if isinstance(res, tuple):  # cancelled: at most one more batch of it asked
            assert rec.asked(f"[r{i}]") - res[1] <= 2 * mbs, (i, res)
            continue
        if any("boom" in q for q in req.queries):
            assert isinstance(res, RuntimeError) and str(res) == "boom", (i, res)
        else:
            assert not isinstance(res, BaseException), (i, res)
            same(res, mem2.search_many([req])[0])
    assert stats["queue_depth"] == stats["tenants_queued"] == stats["in_flight"] == 0
    for call in rec.calls:
        assert sum(map(len, call)) <= mbs or len(call) == 1  # a plain search: alone
