"""The search batcher: many threads (and coroutines) at once, each gets exactly what a
direct ``MemoryIndex.search`` with its arguments returns (the oracle), its own error for
its own bad arguments, and nothing of anyone else's."""
from __future__ import annotations

import asyncio
import threading

import pytest

from memgas_gpu import Dataset
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.serve import Batcher

from _memory_model import tiny_encoder
from _serve import assert_same, populate, search_mix


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
