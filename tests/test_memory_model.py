"""A model-based test of the memory: random adds, removes, re-adds with other content,
compactions, saves and loads, and failed adds on a few conversations that share
sessions (the same id and content, the same id with other content, the same content
under another id; summaries and keywords given or not), and after every step:

* the bookkeeping is what the published state says it must be: every slot's reference
  count equals the rows using it, one slot per distinct content and one content per
  slot, the digest map names live slots of that content, no garbage survives a
  compaction, and the cache holds no view of a replaced segment and no more
  bookkeeping than its views need (``tests/_memory_model.check_bookkeeping``);
* every conversation equals a fresh build of the model's sessions of it: ids, dates,
  embeddings, turn texts, graph, BM25 documents, and the rankings, scores and evidence
  of a few searches by three read settings (``check_contents``).

Hypothesis drives the walk (``RuleBasedStateMachine``): a short derandomized run in the
default suite, a long random one under ``-m slow``.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from unittest import mock

import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("Stemmer")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant,  # noqa: E402
                                 precondition, rule, run_state_machine_as_test)

from memgas_gpu import Dataset, Session  # noqa: E402
from memgas_gpu.retrieve import MemoryIndex  # noqa: E402

from _memory_model import (CONVERSATIONS, DATES, KEYWORDS, POOL, SUMMARIES, Model,  # noqa: E402
                           Oracle, check_bookkeeping, check_contents, tiny_encoder)

_SHARED: dict = {}


def _oracle() -> Oracle:
    if "oracle" not in _SHARED:
        _SHARED["oracle"] = Oracle(tiny_encoder())
    return _SHARED["oracle"]


class MemoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.oracle = _oracle()
        self.enc = self.oracle.encoder
        self.mem = MemoryIndex.build(Dataset([]), self.enc, device="cpu", progress=False)
        self.model = Model()
        self.compacted = False
        self.tmp = Path(tempfile.mkdtemp(prefix="memgas-model-"))
        self.saves = 0
        self.old = None

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _add(self, cid, p, d, u, k) -> None:
        s = POOL[p]
        session = Session(s.id, DATES[d], s.turns)
        if self.model.has(cid, s.id):
            with pytest.raises(ValueError, match="already has a session"):
                self.mem.add_session(cid, session, summary=SUMMARIES[u], keywords=KEYWORDS[k],
                                     encoder=self.enc)
            return
        self.mem.add_session(cid, session, summary=SUMMARIES[u], keywords=KEYWORDS[k],
                             encoder=self.enc)
        self.model.add(cid, s, DATES[d], SUMMARIES[u], KEYWORDS[k])
        self.compacted = False

    _ADD = st.tuples(st.sampled_from(CONVERSATIONS), st.integers(0, len(POOL) - 1),
                     st.integers(0, len(DATES) - 1), st.integers(0, len(SUMMARIES) - 1),
                     st.integers(0, len(KEYWORDS) - 1))

    @initialize(adds=st.lists(_ADD, min_size=3, max_size=8), shared=st.integers(0, 2))
    def start(self, adds, shared):
        """A few sessions in each conversation, some of them shared."""
        for a in adds:
            self._add(*a)
        for cid in CONVERSATIONS[:shared + 1]:
            self.add_shared(cid, len(adds))

    @rule(add=_ADD)
    def add(self, add):
        self._add(*add)

    @rule(add=_ADD)
    def add_another(self, add):  # adds twice as likely as any other step
        self._add(*add)

    @rule(cid=st.sampled_from(CONVERSATIONS), j=st.integers(0, 31))
    def add_shared(self, cid, j):
        """Add what another conversation holds: the same session with the same texts
        (one slot for both, as in a LongMemEval haystack)."""
        held = [e for c, es in sorted(self.model.convs.items()) if c != cid for e in es]
        if not held:
            return
        e = held[j % len(held)]
        if self.model.has(cid, e.session.id):
            return
        self.mem.add_session(cid, e.session, summary=e.summary, keywords=e.keywords,
                             encoder=self.enc)
        self.model.add(cid, e.session, e.date, e.summary, e.keywords)
        self.compacted = False

    @rule(cid=st.sampled_from(CONVERSATIONS), i=st.integers(0, 7))
    def remove(self, cid, i):
        entries = self.model.convs.get(cid)
        if not entries:
            with pytest.raises(KeyError, match="no (conversation|session)"):
                self.mem.remove_session(cid, "s1")
            return
        sid = entries[i % len(entries)].session.id
        self.mem.remove_session(cid, sid)
        self.model.remove(cid, sid)
        self.compacted = False

    @rule(cid=st.sampled_from(CONVERSATIONS), i=st.integers(0, 7), p=st.integers(0, 7),
          u=st.integers(0, len(SUMMARIES) - 1), k=st.integers(0, len(KEYWORDS) - 1))
    def readd_with_other_content(self, cid, i, p, u, k):
        """Remove a session, then add one under the same id: other turns when the pool
        has them (``s1``), else the same turns with other texts."""
        entries = self.model.convs.get(cid)
        if not entries:
            return
        old = entries[i % len(entries)]
        sid = old.session.id
        self.mem.remove_session(cid, sid)
        self.model.remove(cid, sid)
        same_id = [j for j, s in enumerate(POOL) if s.id == sid]
        self._add(cid, same_id[p % len(same_id)], p % len(DATES), u, k)

    @rule()
    def compact(self):
        self.mem.compact()
        self.compacted = True

    @rule()
    def save_and_load(self):
        self.saves += 1
        path = self.tmp / f"ix{self.saves}"
        self.mem.save(path)
        self.mem = MemoryIndex.load(path)
        self.compacted = True  # a saved index holds the used slots only

    @rule(cid=st.sampled_from(CONVERSATIONS), p=st.integers(0, len(POOL) - 1),
          u=st.integers(0, len(SUMMARIES) - 1))
    def failed_add(self, cid, p, u):
        """The graph step fails: the memory, its counts and its garbage are as before."""
        s = POOL[p]
        if self.model.has(cid, s.id):
            return
        store = self.mem._store
        before = (self.mem.state(), store.refs(), store.garbage, store.n_slots)
        with mock.patch("memgas_gpu.memory.writes.grow_graph",
                        side_effect=RuntimeError("planted graph failure")):
            with pytest.raises(RuntimeError, match="planted"):
                self.mem.add_session(cid, Session(s.id, DATES[0], s.turns),
                                     summary=SUMMARIES[u], keywords="", encoder=self.enc)
        store = self.mem._store
        after = (self.mem.state(), store.refs(), store.garbage, store.n_slots)
        assert after[0] is before[0], "a failed add published a state"
        if not before[1]:  # counting starts at the first write: compare with what it found
            before = (before[0], after[1], *before[2:])
        assert after[1:] == before[1:], f"a failed add changed the store: {before[1:]} -> " \
                                        f"{after[1:]}"

    @rule()
    def remember_state(self):
        """Hold the current state, as a reader that started now would."""
        self.old = (self.mem, self.mem.state(), self.model.copy())

    @precondition(lambda self: getattr(self, "old", None) is not None)
    @rule()
    def read_remembered_state(self):
        """A reader of an older state still sees it whole, whatever was written since
        (and reading it caches nothing of it: checked by the invariant)."""
        mem, state, model = self.old
        check_contents(mem, model, self.oracle, state=state)

    @precondition(lambda self: self.model.convs)
    @rule()
    def clear_cache(self):
        self.mem.clear_cache()

    @invariant()
    def equals_the_model(self):
        check_bookkeeping(self.mem, self.model, compacted=self.compacted)
        check_contents(self.mem, self.model, self.oracle)


# the default run does not shrink a failure (minutes on this model): the unshrunk steps
# are printed; the long run shrinks
class DurableMachine(MemoryMachine):
    """The same walk on a memory opened on a folder, with checkpoints, crashes (the
    process let go without a checkpoint) and reopenings: after each, the reopened memory
    must equal the model (everything acknowledged, nothing else)."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = self.tmp / "durable"
        self.mem = MemoryIndex.open(self.folder, encoder=self.enc,
                                    checkpoint_bytes=1 << 14)

    def teardown(self) -> None:
        if self.mem.folder is not None:
            self.mem.abandon()
        super().teardown()

    @rule()
    def checkpoint(self):
        self.mem.checkpoint()

    @rule()
    def crash_and_reopen(self):
        self.mem.abandon()
        self.mem = MemoryIndex.open(self.folder, encoder=self.enc, checkpoint_bytes=1 << 14)
        self.compacted = False

    @rule()
    def close_and_reopen(self):
        self.mem.close()
        self.mem = MemoryIndex.open(self.folder, encoder=self.enc, checkpoint_bytes=1 << 14)
        self.compacted = False

    @rule()
    def evict_everything(self):
        """Every segment and store chunk read from the folder dropped: the next reads
        and writes read them again from their files."""
        self.mem.drop_resident()
        assert self.mem.residency()["resident_bytes"] == 0

    @rule()
    def reopen_keeping_nothing(self):
        """Reopened with no room for what it reads: every segment and chunk is dropped as
        soon as it is read (searches, writes, the view cache and batch views work on
        what they hold)."""
        self.mem.close()
        self.mem = MemoryIndex.open(self.folder, encoder=self.enc, checkpoint_bytes=1 << 14,
                                    max_resident_bytes=0)
        self.compacted = False

    @rule()
    def save_and_load(self):
        """A copy saved elsewhere loads as the same memory; the folder's memory goes on."""
        self.saves += 1
        path = self.tmp / f"copy{self.saves}"
        self.mem.save(path)
        check_contents(MemoryIndex.load(path), self.model, self.oracle, search=False)


_QUICK = settings(max_examples=8, stateful_step_count=16, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), print_blob=True, database=None,
                  phases=[Phase.explicit, Phase.generate])
_LONG = settings(max_examples=80, stateful_step_count=40, deadline=None,
                 suppress_health_check=list(HealthCheck), print_blob=True)


def test_memory_equals_its_model():
    """A short, reproducible walk (seconds): the default suite's safety net."""
    run_state_machine_as_test(MemoryMachine, settings=_QUICK)


@pytest.mark.slow
def test_memory_equals_its_model_long():
    run_state_machine_as_test(MemoryMachine, settings=_LONG)


def test_a_durable_memory_equals_its_model():
    """The walk with checkpoints, crashes and reopenings (seconds)."""
    run_state_machine_as_test(DurableMachine, settings=_QUICK)


@pytest.mark.slow
def test_a_durable_memory_equals_its_model_long():
    run_state_machine_as_test(DurableMachine, settings=_LONG)
