"""Invariants of the memory that the model-based walk cannot see cheaply, one test each.

Oracles: fresh builds of the same sessions (the reference way, ``tests/_memory_model``),
hand-counted cache contents, and the model's bookkeeping checks.
"""
from __future__ import annotations

from unittest import mock

import pytest
import torch

from memgas_gpu import Dataset, Session
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.memory.cache import ViewCache

pytest.importorskip("Stemmer")

from _memory_model import (POOL, Model, Oracle, check_bookkeeping,  # noqa: E402
                           check_contents, tiny_encoder)


@pytest.fixture(scope="module")
def oracle():
    return Oracle(tiny_encoder())


def _memory(oracle, adds) -> tuple[MemoryIndex, Model]:
    mem = MemoryIndex.build(Dataset([]), oracle.encoder, device="cpu", progress=False)
    model = Model()
    for cid, p, summary in adds:
        s = POOL[p]
        mem.add_session(cid, Session(s.id, "2023-06-01", s.turns), summary=summary,
                        keywords="kw", encoder=oracle.encoder)
        model.add(cid, s, "2023-06-01", summary, "kw")
    return mem, model


# ---------------------------------------------------------------- the view cache
def test_view_cache_evicts_the_least_recently_used_and_keeps_bounded_books():
    """LRU under ``max_views + 1`` inserts, and the version links of evicted views go
    with them (they used to stay: 100 entries for 2 views after 100 inserts)."""
    cache = ViewCache(max_views=2)
    cache.get(("view", (0,), (1,)), (1,), lambda: "a")
    cache.get(("view", (1,), (2,)), (2,), lambda: "b")
    assert cache.get(("view", (0,), (1,)), (1,), lambda: "rebuilt") == "a"  # a is recent
    cache.get(("view", (2,), (3,)), (3,), lambda: "c")  # evicts b, the least recent
    assert cache.get(("view", (1,), (2,)), (2,), lambda: "b again") == "b again"
    assert cache.get(("view", (2,), (3,)), (3,), lambda: "rebuilt") == "c"
    assert len(cache) == 2
    for i in range(100):
        cache.get(("view", (i,), (1000 + i, 2000 + i)), (1000 + i, 2000 + i), lambda: i)
        cache.get(("canonical", (3000 + i,)), (3000 + i,), lambda: i)
    stats = cache.stats()
    assert stats["views"] == 2
    assert stats["versions"] <= 3 and stats["links"] == stats["dependencies"] <= 3, stats
    cache.forget([2099, 3099])
    assert cache.stats() == {"views": 0, "versions": 0, "links": 0, "dependencies": 0}


def test_a_view_of_replaced_segments_is_never_cached():
    """A view whose versions stopped being current while it was built is returned to its
    reader but not kept."""
    cache = ViewCache()
    assert cache.get(("v", (1,)), (1,), lambda: "old", live=lambda: False) == "old"
    assert len(cache) == 0 and cache.stats()["versions"] == 0
    assert cache.get(("v", (1,)), (1,), lambda: "new", live=lambda: True) == "new"
    assert len(cache) == 1


def test_an_old_state_reads_old_and_the_current_state_reads_new(oracle):
    """A reader holding the state from before a write sees it whole; a read of the
    current state right after sees the write (never the old reader's view)."""
    mem, model = _memory(oracle, [("A", 0, "s"), ("A", 3, "t"), ("B", 5, "u")])
    old_state, old_model = mem.state(), model.copy()
    check_contents(mem, model, oracle, search=False)  # caches the current views
    s = POOL[6]
    mem.add_session("A", Session(s.id, "2023-06-01", s.turns), summary="v", keywords="kw",
                    encoder=oracle.encoder)
    model.add("A", s, "2023-06-01", "v", "kw")
    check_contents(mem, old_model, oracle, state=old_state)  # the old state, read after
    check_contents(mem, model, oracle)  # the current state: the write is there
    check_bookkeeping(mem, model)  # and nothing of the old state was cached


def test_a_view_built_while_a_write_publishes_is_not_served_later(oracle):
    """A reader builds the view of conversation A while a writer adds to A: the reader
    gets its (old) view, the next reader gets the new one."""
    from memgas_gpu.memory import segments

    mem, model = _memory(oracle, [("A", 0, "s"), ("A", 3, "t")])
    s = POOL[6]
    real = segments.View
    wrote = []

    def view_then_write(*a, **k):
        v = real(*a, **k)
        if not wrote:
            wrote.append(1)
            mem.add_session("A", Session(s.id, "2023-06-01", s.turns), summary="v",
                            keywords="kw", encoder=oracle.encoder)
        return v

    with mock.patch("memgas_gpu.memory.index.View", side_effect=view_then_write):
        first = mem.view(["A"])
    model.add("A", s, "2023-06-01", "v", "kw")
    assert first.conversations[0].session_ids == ["s1", "s2"]
    assert mem.view(["A"]).conversations[0].session_ids == ["s1", "s2", "s5"]
    check_bookkeeping(mem, model)
    check_contents(mem, model, oracle)


# ---------------------------------------------------------------- writes
@pytest.mark.parametrize("fail", ["graph", "encoder"])
def test_a_failed_add_leaves_counts_garbage_and_vocabulary_as_before(oracle, fail):
    mem, model = _memory(oracle, [("A", 0, "s"), ("B", 0, "s"), ("B", 3, "t")])
    mem.remove_session("B", "s2")  # one garbage slot
    model.remove("B", "s2")
    store = mem._store
    before = (mem.state(), store.refs(), store.garbage, store.n_slots,
              len(store.lexical.vocab))
    target = ("memgas_gpu.memory.writes.grow_graph" if fail == "graph" else
              "memgas_gpu.memory.writes.encode_unique")
    # a shared session (a reference; not encoded again), a new one (a slot)
    for p in ((0, 7) if fail == "graph" else (7,)):
        s = POOL[p]
        with mock.patch(target, side_effect=RuntimeError("planted failure")):
            with pytest.raises(RuntimeError, match="planted"):
                mem.add_session("C", Session(s.id, "", s.turns), summary="s", keywords="kw",
                                encoder=oracle.encoder)
        after = (mem.state(), store.refs(), store.garbage, store.n_slots,
                 len(store.lexical.vocab))
        assert after[0] is before[0] and after[1:] == before[1:], (p, before[1:], after[1:])
    check_bookkeeping(mem, model)
    mem.compact()
    check_bookkeeping(mem, model, compacted=True)
    check_contents(mem, model, oracle)


def test_a_shared_session_with_its_own_texts_keeps_them(oracle):
    """The same session (id and turns) added to B with other summary and keywords than
    A's is stored apart: B's summary and keyword searches equal a build of B alone, A's
    are unchanged (B used to get A's texts: top score 9.42 instead of 13.12)."""
    s = POOL[0]
    mem = MemoryIndex.build(Dataset([]), oracle.encoder, device="cpu", progress=False)
    model = Model()
    for cid, summary, keywords in (("A", "Ana adopted a dog.", "puppy"),
                                   ("B", "Ben asks about the breed of Rex.", "breed; Rex"),
                                   ("C", "Ana adopted a dog.", "puppy")):
        mem.add_session(cid, Session(s.id, "", s.turns), summary=summary, keywords=keywords,
                        encoder=oracle.encoder)
        model.add(cid, s, "", summary, keywords)
    assert mem._store.n_slots == 2  # A and C share; B is apart
    check_bookkeeping(mem, model)
    check_contents(mem, model, oracle, methods={
        "summary": dict(method="summary"), "keyword": dict(method="keyword"),
        "bm25_U": dict(method="bm25", signals="bm25_U"),
        "bm25_K": dict(method="bm25", signals="bm25_K")})


def test_the_vocabulary_shrinks_with_the_sessions_it_holds(oracle, tmp_path):
    """Add/remove cycles of sessions with words of their own: the vocabulary and the
    saved folder stay bounded by what is live (they grew with every session ever added:
    10,000 cycles took 15 terms to 60,016), and after a compaction the vocabulary is
    exactly a rebuild's."""
    enc = oracle.encoder
    mem = MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)
    model = Model()

    def session(i):
        return Session(f"c{i}", "", (f"[Ana]: word{i}a word{i}b word{i}c",))

    sizes = []
    for i in range(300):
        s = session(i)
        mem.add_session("A", s, summary="", keywords="", encoder=enc)
        model.add("A", s, "", "", "")
        if i >= 5:
            old = f"c{i - 5}"
            mem.remove_session("A", old)
            model.remove("A", old)
        sizes.append(len(mem._store.lexical.vocab))
    # 5 live sessions of 3 terms (+ the speaker), garbage compacted at 64+ removed ones
    assert max(sizes) < 3 * (64 + 5 + 2) + 10, max(sizes)
    mem.compact()
    check_bookkeeping(mem, model, compacted=True)
    ref = oracle.build("A", model.convs["A"])
    assert sorted(mem._store.lexical.vocab.terms) == sorted(ref.snapshot().lexical.vocab.terms)
    check_contents(mem, model, oracle, search=False)
    mem.save(tmp_path / "ix")
    small = sum(f.stat().st_size for f in (tmp_path / "ix").rglob("*") if f.is_file())
    ref.save(tmp_path / "ref")
    want = sum(f.stat().st_size for f in (tmp_path / "ref").rglob("*") if f.is_file())
    assert small < 2 * want, (small, want)


def test_add_session_refuses_a_date_it_cannot_read(oracle):
    mem = MemoryIndex.build(Dataset([]), oracle.encoder, device="cpu", progress=False)
    s = POOL[0]
    with pytest.raises(ValueError, match="date 'not a date' is not a date"):
        mem.add_session("A", Session(s.id, "not a date", s.turns), encoder=oracle.encoder)
    assert mem.n_conversations == 0
    for i, ok in enumerate(("", "8 May, 2023", "1:56 pm on 8 May, 2023",
                            "2023/05/20 (Sat) 02:21")):
        mem.add_session("A", Session(f"x{i}", ok, s.turns), encoder=oracle.encoder)
    assert mem.n_rows == 4


def test_auto_signals_reads_an_odd_config_without_crashing():
    """``signals="auto"`` over a config whose expansion record is not an object (a
    hand-made or older manifest) uses the written-summaries rule, not AttributeError."""
    from memgas_gpu.retrieve.engine import HYBRID_SIGNALS, auto_signals

    class Odd:
        config = {"expansion": "offline"}

    assert auto_signals(None)[0] == HYBRID_SIGNALS
    with mock.patch("memgas_gpu.retrieve.engine.available", lambda index, sig: list(sig)):
        assert auto_signals(Odd())[0] == HYBRID_SIGNALS
        Odd.config = {"expansion": {"summaries": "offline"}}
        assert auto_signals(Odd())[0] == HYBRID_SIGNALS
        Odd.config = "not a dict"
        assert auto_signals(Odd())[0] == HYBRID_SIGNALS


def test_compaction_keeps_slots_findable_and_content_exact(oracle):
    """After a compaction renumbers the slots, adding a session the store already holds
    shares its (renumbered) slot, in another conversation too."""
    mem, model = _memory(oracle, [("A", 3, "t"), ("A", 0, "s"), ("B", 5, "u"),
                                  ("B", 6, "w")])
    mem.remove_session("A", "s2")  # slot 0 becomes garbage: every later slot moves
    model.remove("A", "s2")
    assert mem.compact() == 1
    check_bookkeeping(mem, model, compacted=True)
    s = POOL[0]
    mem.add_session("C", Session(s.id, "2023-06-01", s.turns), summary="s", keywords="kw",
                    encoder=oracle.encoder)
    model.add("C", s, "2023-06-01", "s", "kw")
    assert mem._store.n_slots == 3  # shared with A's, not stored again
    check_bookkeeping(mem, model)
    check_contents(mem, model, oracle)
