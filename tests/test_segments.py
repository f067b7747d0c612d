"""Per-conversation segments: writes touch one conversation, reads see one published state,
searches run while sessions are written, and every online edit still equals a rebuild.

Oracles: a fresh ``MemoryIndex.build`` of the same sessions (the reference way), searches
on the two contents the writer alternates between (computed single-threaded first), and
hand-counted store sizes.
"""
from __future__ import annotations

import threading
import time

import pytest
import torch

from memgas_gpu import Conversation, Dataset, Session, load_dataset
from memgas_gpu.retrieve import MemoryIndex, retrieve
from memgas_gpu.memory.store import Growable

pytest.importorskip("Stemmer")

KW = dict(summaries="source", device="cpu", progress=False)


class _Fixed:
    """The same keywords text for every session (offline keywords depend on the corpus,
    so a rebuild over other sessions would extract other ones)."""

    name = "fixed"

    def config(self):
        return {}

    def generate(self, kind, sessions, conversations):
        return ["" for _ in sessions]


@pytest.fixture(scope="module")
def tiny(tiny_enc):
    return tiny_enc


@pytest.fixture(scope="module")
def three(locomo_list_path):
    """Three conversations, their first 8 sessions, with their questions."""
    ds = load_dataset(locomo_list_path)
    convs = [Conversation(c.id, c.sessions[:8], c.questions[:20], c.source_summaries)
             for c in list(ds)[:3]]
    return Dataset(convs, format=ds.format)


def _build(ds, enc):
    return MemoryIndex.build(ds, enc, keywords=_Fixed(), **KW)


def _add(idx, conv_id, session, summary=""):
    idx.add_session(conv_id, session, summary=summary, keywords="")


def _rankings(idx, methods=("memgas", "memgas_hybrid", "bm25")):
    return {m: retrieve(idx, method=m, device="cpu") for m in methods}


def _same(idx, ref, atol=1e-5):
    assert [x.session_ids for x in idx.conversations] == \
        [x.session_ids for x in ref.conversations]
    assert torch.equal(idx.snapshot().row_slot, ref.snapshot().row_slot)
    assert torch.equal(idx.snapshot().turn_ptr, ref.snapshot().turn_ptr)
    assert torch.equal(idx.snapshot().graphs["gmm"][0], ref.snapshot().graphs["gmm"][0])
    assert torch.equal(idx.snapshot().graphs["gmm"][1], ref.snapshot().graphs["gmm"][1])
    torch.testing.assert_close(idx.snapshot().gran, ref.snapshot().gran, rtol=0, atol=atol)
    assert idx.snapshot().turn_text.strings(range(len(idx.snapshot().turn_text))) == \
        ref.snapshot().turn_text.strings(range(len(ref.snapshot().turn_text)))


def test_growable_appends_are_amortized():
    g = Growable(torch.zeros(0, 3))
    buffers = set()
    for i in range(1000):
        g.append(torch.full((1, 3), float(i)))
        buffers.add(g.buf.data_ptr())
    assert torch.equal(g.value()[:, 0], torch.arange(1000, dtype=torch.float32))
    # capacity grows by half: log_1.5(1000) ~ 17 reallocations, not 1000
    assert len(buffers) <= 20


def test_empty_memory_grows_into_a_rebuild(three, tiny):
    """An empty index, sessions added one by one (the conversation created on first use),
    equals a build of the same sessions: graphs, embeddings, texts, rankings."""
    c = three[0]
    mem = MemoryIndex.build(Dataset([]), tiny, **KW)
    assert mem.n_conversations == 0 and mem.n_rows == 0
    assert mem.search("me", ["anything"], encoder=tiny)[0].session_ids == []
    for s in c.sessions:
        _add(mem, "me", s, c.source_summaries.get(s.id, ""))
    ref = _build(Dataset([Conversation("me", c.sessions, [], c.source_summaries)]), tiny)
    _same(mem, ref)
    q = [x.text for x in c.questions[:5]]
    for m in ("memgas", "memgas_hybrid"):
        got = [r.session_ids for r in mem.search("me", q, method=m, encoder=tiny)]
        want = [r.session_ids for r in ref.search("me", q, method=m, encoder=tiny)]
        assert got == want, m


def test_speaker_cue_after_writes_equals_a_rebuild(three, tiny):
    """Questions naming one speaker (memgas_hybrid's speaker cue, whose weights are kept
    with the conversation's view): searched before a write, then after an add and after a
    remove, they rank and score as on a rebuild of the same sessions."""
    from memgas_gpu.retrieve.cues import named_speakers

    a = three[0]
    last = a.sessions[-1]
    names = sorted({t.split(":", 1)[0].strip("[] ") for s in a.sessions for t in s.turns
                    if ":" in t})
    qs = [q.text for q in a.questions if sum(named_speakers(q.text, names)) == 1]
    assert len(qs) >= 5, (names, qs)
    head = Conversation(a.id, a.sessions[:-1], a.questions, a.source_summaries)
    idx = _build(Dataset([head, *three[1:]], format=three.format), tiny)

    def same(sessions, name):
        # each rebuild names the conversation otherwise: nothing kept for a name serves it
        ref = _build(Dataset([Conversation(name, sessions, a.questions, a.source_summaries),
                              *three[1:]], format=three.format), tiny)
        for got, want in zip(idx.search(a.id, qs, k=8, encoder=tiny),
                             ref.search(name, qs, k=8, encoder=tiny)):
            assert got.session_ids == want.session_ids
            assert got.scores == pytest.approx(want.scores, rel=1e-4, abs=1e-5)  # float32

    same(a.sessions[:-1], "ref-1")  # warms the cue's weights
    _add(idx, a.id, last, a.source_summaries.get(last.id, ""))
    same(a.sessions, "ref-2")
    idx.remove_session(a.id, last.id)
    same(a.sessions[:-1], "ref-3")


def test_conversation_without_sessions_searches_empty(three, tiny):
    idx = MemoryIndex.build(Dataset([Conversation("me", []), three[0]]), tiny, **KW)
    for m in ("memgas", "memgas_hybrid", "bm25"):
        res = idx.search("me", ["where did I go?"], method=m, encoder=tiny)
        assert res[0].session_ids == [] and res[0].scores == [] and res[0].evidence == []
        assert idx.search(three[0].id, ["where did I go?"], method=m,
                          encoder=tiny)[0].session_ids


def test_bad_queries_are_refused_in_one_line(three, tiny):
    idx = _build(three, tiny)
    cid = three[0].id
    with pytest.raises(ValueError, match=r"queries\[1\] holds a lone UTF-16 surrogate"):
        idx.search(cid, ["fine", "violin \ud800"])
    with pytest.raises(TypeError, match="queries must be strings"):
        idx.search(cid, ["fine", 3])
    with pytest.raises(TypeError, match="one string"):
        idx.search(cid, "fine")
    assert idx.search("nobody", ["fine"])[0].session_ids == []  # no memories yet
    with pytest.raises(ValueError, match=r"queries\[1\] is empty"):
        idx.search(cid, ["fine", "  "])
    with pytest.raises(ValueError, match="question_date 'not a date' is not a date"):
        idx.search(cid, ["fine"], question_date="not a date")
    for bad, err in ((dict(conversation_id=None), TypeError), (dict(evidence=2.5), ValueError),
                     (dict(question_date=123), TypeError), (dict(k=0), ValueError)):
        args = dict(conversation_id=cid, queries=["fine"])
        args.update(bad)
        with pytest.raises(err, match=next(iter(bad))):
            idx.search(**args)


def test_huge_topk_is_capped_by_the_data(three, tiny, tmp_path):
    """--set topk=1000000000 used to size buffers by the setting (400 GB): the candidates
    a node can have are capped by its conversation, so the graph equals topk = all.  A
    setting past the largest a saved index holds is refused before anything is built
    (it used to be accepted, and its graph then made every later save fail)."""
    from memgas_gpu.retrieve import SettingsError
    from memgas_gpu.retrieve.params import MAX_SETTING

    idx = _build(three, tiny)
    every = 8 * 4  # sessions x granularities of a conversation: every candidate
    a = retrieve(idx, method="no_gmm", topk=MAX_SETTING, device="cpu")
    b = retrieve(idx, method="no_gmm", topk=every, device="cpu")
    assert torch.equal(a.rankings, b.rankings)
    torch.testing.assert_close(a.scores, b.scores)
    for bad in (10 ** 7, MAX_SETTING + 1, 0):
        with pytest.raises(SettingsError, match="topk must be an integer from 1 to"):
            retrieve(idx, method="no_gmm", topk=bad, device="cpu")
    with pytest.raises(SettingsError, match="alpha must be an integer from 1 to"):
        retrieve(idx, method="memgas", alpha=10 ** 7, device="cpu")
    idx.save(tmp_path / "ix")  # the graphs of every accepted setting can be saved
    back = MemoryIndex.load(tmp_path / "ix")
    assert f"topk{MAX_SETTING}" in back.snapshot().graphs
    assert torch.equal(retrieve(back, method="no_gmm", topk=every, device="cpu").rankings,
                       b.rankings)


def test_write_replaces_only_its_conversation(three, tiny):
    """A write makes a new segment for its conversation only: the others keep their
    segments (same objects) and their cached views (no rebuild of derived data)."""
    idx = _build(three, tiny)
    for c in three:
        idx.search(c.id, ["what did they talk about?"], encoder=tiny)
    before = idx.state()
    views = {c.id: idx.view([c.id]) for c in three}
    new = three[0].sessions[-1]
    _add(idx, three[1].id, Session("extra-1", new.date, new.turns))
    after = idx.state()
    assert after is not before and before.segments[1] is not after.segments[1]
    assert after.segments[0] is before.segments[0] and after.segments[2] is before.segments[2]
    assert idx.view([three[0].id]) is views[three[0].id]
    assert idx.view([three[2].id]) is views[three[2].id]
    assert idx.view([three[1].id]) is not views[three[1].id]
    # the old state still reads as it was
    assert before.segments[1].meta.session_ids == [s.id for s in three[1].sessions]


def test_add_to_a_middle_conversation_and_remove_equal_rebuilds(three, tiny):
    """Slots are renumbered as a build stores them, so the packed tables equal a rebuild
    even when the added session lands in a conversation before others."""
    idx = _build(three, tiny)
    a, b, c = three
    gone = b.sessions[2]
    moved = Session("moved", gone.date, gone.turns)
    summary = b.source_summaries.get(gone.id, "")
    idx.remove_session(b.id, gone.id)
    _add(idx, a.id, moved, summary)
    ref_a = Conversation(a.id, a.sessions + [moved], a.questions,
                         {**a.source_summaries, "moved": summary})
    ref_b = Conversation(b.id, [s for s in b.sessions if s is not gone], b.questions,
                         b.source_summaries)
    ref = _build(Dataset([ref_a, ref_b, c], format=three.format), tiny)
    _same(idx, ref)
    got, want = _rankings(idx), _rankings(ref)
    for m in got:
        assert torch.equal(got[m].rankings, want[m].rankings), m


def test_shared_session_is_stored_once(three, tiny):
    idx = _build(three, tiny)
    s = three[0].sessions[3]
    s = Session("shared-1", s.date, s.turns)
    _add(idx, three[0].id, s)
    n = idx.snapshot().tables.n_slots
    _add(idx, three[2].id, s)  # the same session (id and turns) in another conversation
    assert idx.snapshot().tables.n_slots == n  # no second copy, as in a build
    assert idx.conversations[2].session_ids[-1] == s.id
    rs, offs = idx.snapshot().row_slot, idx.snapshot().conv_offsets
    assert int(rs[offs[3] - 1]) == int(rs[offs[1] - 1])


def test_failed_writes_change_nothing(three, tiny):
    idx = _build(three, tiny)
    v = idx.version
    s = three[0].sessions[0]
    for bad in (dict(conversation_id=None), dict(conversation_id=7),
                dict(session=Session(None, "", ("x",))),
                dict(session=Session("x", float("nan"), ("x",))),
                dict(session=Session("x", "", (1, 2))), dict(session="text"),
                dict(summary=2.5)):
        args = dict(conversation_id=three[0].id, session=Session("new", s.date, s.turns))
        args.update(bad)
        with pytest.raises(TypeError):
            idx.add_session(args.pop("conversation_id"), args.pop("session"), **args)
        assert idx.version == v

    for bad in (dict(conversation_id="\udfff"), dict(session=Session("\udfff", "", ("x",))),
                dict(session=Session("x", "", ("ok", "\ud800 no"))), dict(keywords="\udc80")):
        args = dict(conversation_id=three[0].id, session=Session("new", s.date, s.turns))
        args.update(bad)
        with pytest.raises(ValueError, match="surrogate"):
            idx.add_session(args.pop("conversation_id"), args.pop("session"), **args)
        assert idx.version == v

    class Broken:
        fingerprint = tiny.fingerprint
        dim = tiny.dim

        def encode(self, texts, progress=None):
            raise RuntimeError("encoder down")

    with pytest.raises(RuntimeError, match="encoder down"):
        idx.add_session(three[0].id, Session("new", s.date, s.turns), encoder=Broken(),
                        summary="", keywords="")
    assert idx.version == v and "new" not in idx.conversations[0].session_ids

    class Nan(Broken):
        def encode(self, texts, progress=None):
            return torch.full((len(texts), tiny.dim), float("nan"))

    with pytest.raises(ValueError, match="NaN"):
        idx.add_session(three[0].id, Session("new", s.date, s.turns), encoder=Nan(),
                        summary="", keywords="")
    assert idx.version == v
    _add(idx, three[0].id, Session("new", s.date, s.turns))  # still writable
    assert idx.conversations[0].session_ids[-1] == "new"


def test_compaction_keeps_results(three, tiny, monkeypatch):
    """Removing most sessions compacts the store (new buffers, renumbered slots); what
    is left equals a rebuild, and a snapshot taken before still reads the old content."""
    import memgas_gpu.memory.store as store

    monkeypatch.setattr(store, "COMPACT_MIN_GARBAGE", 4)
    idx = _build(three, tiny)
    old = idx.snapshot()
    old_text = old.turn_text.strings(range(len(old.turn_text)))
    keep = {}
    for c in three:
        for s in c.sessions[1:7]:
            idx.remove_session(c.id, s.id)
        keep[c.id] = [c.sessions[0], c.sessions[7]]
    assert idx.view().tables.n_slots < 24  # compacted: fewer slots than ever held
    ref = _build(Dataset([Conversation(c.id, keep[c.id], c.questions, c.source_summaries)
                          for c in three], format=three.format), tiny)
    _same(idx, ref)
    assert old.turn_text.strings(range(len(old.turn_text))) == old_text
    assert old.conversations[0].session_ids == [s.id for s in three[0].sessions]


@pytest.mark.parametrize("seconds", [6, pytest.param(20, marks=pytest.mark.slow)])
def test_searches_while_writing_see_whole_states(three, tiny, seconds):
    """Two threads search while one adds and removes a session (6 s in the default run,
    20 s with ``-m slow``): no search fails, and each result equals the result on the
    content before or after a write (the writer alternates between two contents, A and B)."""
    idx = _build(three, tiny)
    a = three[0]
    new = Session("concurrent-1", a.sessions[-1].date, a.sessions[2].turns)
    queries = [(c.id, q.text) for c in three for q in c.questions[:2]]

    def results(method):
        return [idx.search(cid, [q], k=5, method=method, encoder=tiny)[0]
                for cid, q in queries]

    def key(r):
        return (tuple(r.session_ids), tuple(round(x, 5) for x in r.scores))

    methods = ("memgas_hybrid", "memgas")
    want_a = {m: [key(r) for r in results(m)] for m in methods}
    idx.add_session(a.id, new, summary="", keywords="")
    want_b = {m: [key(r) for r in results(m)] for m in methods}
    idx.remove_session(a.id, new.id)
    assert want_a != want_b  # the write changes what conversation a's queries see
    stop = threading.Event()
    errors, counts = [], {"search": 0, "write": 0, "b": 0}

    def reader(m):
        i = 0
        while not stop.is_set():
            j = i % len(queries)
            try:
                got = key(idx.search(queries[j][0], [queries[j][1]], k=5, method=m,
                                     encoder=tiny)[0])
                if got not in (want_a[m][j], want_b[m][j]):
                    errors.append(f"{m} query {j}: {got} is neither state's result")
                counts["b"] += got == want_b[m][j] != want_a[m][j]
            except Exception as e:  # any failure counts
                errors.append(f"{m} query {j}: {type(e).__name__}: {e}")
            counts["search"] += 1
            i += 1

    def writer():
        while not stop.is_set():
            try:
                idx.add_session(a.id, new, summary="", keywords="")
                idx.remove_session(a.id, new.id)
                counts["write"] += 2
            except Exception as e:
                errors.append(f"writer: {type(e).__name__}: {e}")
                return

    threads = [threading.Thread(target=reader, args=(m,)) for m in methods]
    threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    assert counts["write"] >= 10 and counts["search"] >= 20, counts
    assert counts["b"] > 0, counts  # some searches did see the written state
