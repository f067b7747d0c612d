"""A simple model of a memory and the checks that compare a ``MemoryIndex`` with it.

The model is what a user means by a memory: per conversation, its sessions in order,
each with the date it was added under and the summary and keyword texts it was stored
with.  The oracle for the index's contents is the reference way: a fresh
``MemoryIndex.build`` of each conversation's sessions alone, with those texts (BM25
corpora and association graphs are per conversation, so a conversation built alone is
exactly what the memory must hold for it).  The bookkeeping checks recompute, from the
published segments and the model, what the store's counters and maps must say.

Used by the model-based test of the memory (``tests/test_memory_model.py``) and by the
durable memory's crash tests.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from typing import Optional

import torch

from memgas_gpu import Conversation, Dataset, Session
from memgas_gpu.expand.offline import OfflineExtractor
from memgas_gpu.granularity import CODES
from memgas_gpu.retrieve import MemoryIndex

# ---------------------------------------------------------------- the session pool
#: sessions that share ids, turn counts and contents in every way the store must tell
#: apart: P1 is P0's id and turn count with another second turn, P2 the same id with
#: other turns, P4 P0's turns under another id
POOL = [
    Session("s1", "", ("[Ana]: I adopted a puppy named Rex in May.",
                       "[Ben]: Rex sounds adorable, what breed is he?")),
    Session("s1", "", ("[Ana]: I adopted a puppy named Rex in May.",
                       "[Ben]: Does Rex like the dog park near the river?")),
    Session("s1", "", ("[Ana]: Violin lessons with Mrs. Alvarez start next week.",)),
    Session("s2", "", ("[Ben]: My sister Clara visits from Lisbon in June.",
                       "[Ana]: Show her the botanical garden and the old harbour!")),
    Session("s3", "", ("[Ana]: I adopted a puppy named Rex in May.",
                       "[Ben]: Rex sounds adorable, what breed is he?")),
    Session("s4", "", ("[Ben]: We hiked Mount Tam on Saturday morning.",
                       "[Ana]: Was the trail muddy after the rain?",
                       "[Ben]: Very muddy, but the view of the bay was worth it.")),
    Session("s5", "", ("[Ana]: Clara taught me to bake sourdough bread.",
                       "[Ben]: Share a loaf with me sometime!")),
    Session("s6", "", ("[Ben]: The violin recital is on 7 July, 2023.",
                       "[Ana]: I will bring flowers for Mrs. Alvarez.")),
]
DATES = ["8 May, 2023", "2023-06-01", "1:56 pm on 7 July, 2023", ""]
SUMMARIES = [None, "Ana adopted a dog named Rex.", "Plans with Clara and the violin."]
KEYWORDS = [None, "puppy; Rex; breed", "violin; recital"]
CONVERSATIONS = ["A", "B", "C"]
QUERIES = ["What breed is Rex, the puppy Ana adopted?",
           "When is the violin recital of Mrs. Alvarez?",
           "What did Ben say about Clara and the bread?"]
#: read settings compared: the MemGAS graph path, plain BM25, and every lexical and
#: dense signal with both cues (exercises U, K and the concat table)
METHODS = {
    "memgas": dict(method="memgas"),
    "bm25": dict(method="bm25"),
    "all_signals": dict(method="memgas_hybrid",
                        signals="bm25_S+bm25_Tmax+bm25_U+bm25_K+dense_Tmax+dense_U+dense_K"
                                "+dense_concat"),
}


_TINY: list = []


def tiny_encoder():
    """A random-weight BERT (hidden 32) on the CPU: deterministic and fast (for code
    that cannot take pytest's ``tiny_enc`` fixture: Hypothesis machines, child
    processes).  Each call gets its own encoder object; the model's folder is made once
    per process and removed when the process exits."""
    from memgas_gpu.encode import Encoder
    from memgas_gpu.encode.tiny import make_random_bert

    if not _TINY:
        folder = tempfile.mkdtemp(prefix="memgas-model-bert-")
        atexit.register(shutil.rmtree, folder, True)
        _TINY.append(make_random_bert(folder))
    return Encoder(_TINY[0], device="cpu", max_length=64)


@dataclass(frozen=True)
class Entry:
    """One session of a conversation in the model, with the texts it was stored with
    (``None`` given: the offline extractor's on the session alone, as documented)."""

    session: Session
    date: str
    summary: str
    keywords: str

    @property
    def content(self) -> tuple:
        """What makes two stored sessions the same (independent of the store's digest)."""
        return (self.session.id, tuple(self.session.turns), self.summary, self.keywords)


def resolved_texts(session: Session, summary: Optional[str], keywords: Optional[str]):
    if summary is None or keywords is None:
        u, k = OfflineExtractor().expand([session.text], progress=False)
        summary = u[0] if summary is None else summary
        keywords = k[0] if keywords is None else keywords
    return summary, keywords


class Model:
    """conversation id → its entries, in order."""

    def __init__(self) -> None:
        self.convs: dict[str, list[Entry]] = {}

    def add(self, cid: str, session: Session, date: str, summary, keywords) -> Entry:
        u, k = resolved_texts(session, summary, keywords)
        e = Entry(Session(session.id, date, session.turns), date, u, k)
        self.convs.setdefault(cid, []).append(e)
        return e

    def remove(self, cid: str, sid: str) -> None:
        self.convs[cid] = [e for e in self.convs[cid] if e.session.id != sid]

    def forget(self, cid: str) -> None:
        self.convs.pop(cid, None)

    def has(self, cid: str, sid: str) -> bool:
        return any(e.session.id == sid for e in self.convs.get(cid, ()))

    def copy(self) -> "Model":
        m = Model()
        m.convs = {c: list(v) for c, v in self.convs.items()}
        return m


class _Texts:
    """An expansion source giving each session the texts of the model's entry."""

    def __init__(self, kind: str, entries) -> None:
        self.name = f"model-{kind}"
        self._by = {e.session.id: (e.summary if kind == "summary" else e.keywords)
                    for e in entries}

    def config(self) -> dict:
        return {}

    def generate(self, kind, sessions, conversations):
        return [self._by[s.id] for s in sessions]


class Oracle:
    """Fresh builds of single conversations, memoized by content."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        self._builds: dict = {}

    def build(self, cid: str, entries) -> MemoryIndex:
        key = (cid, tuple((e.content, e.date) for e in entries))
        got = self._builds.get(key)
        if got is None:
            ds = Dataset([Conversation(cid, [e.session for e in entries])])
            got = MemoryIndex.build(ds, self.encoder, summaries=_Texts("summary", entries),
                                    keywords=_Texts("keywords", entries), device="cpu",
                                    progress=False)
            self._builds[key] = got
        return got


# ---------------------------------------------------------------- bookkeeping checks
def check_bookkeeping(mem: MemoryIndex, model: Model, compacted: bool = False) -> None:
    """The store's and cache's internal records against what the published state and
    the model say they must be."""
    st = mem.state()
    store = mem._store
    # conversations: the id map, and the model's conversations in any order
    assert {s.id: i for i, s in enumerate(st.segments)} == st.ids
    assert set(st.ids) == set(model.convs), (sorted(st.ids), sorted(model.convs))
    # one slot per distinct content, and no two contents in one slot
    slot_of, content_of = {}, {}
    for seg in st.segments:
        entries = model.convs[seg.id]
        assert seg.meta.session_ids == [e.session.id for e in entries], seg.id
        for e, slot in zip(entries, seg.slots.tolist()):
            assert slot_of.setdefault(e.content, slot) == slot, \
                f"content {e.content[:2]} stored in slots {slot_of[e.content]} and {slot}"
            assert content_of.setdefault(slot, e.content) == e.content, \
                f"slot {slot} holds two contents: {content_of[slot][:2]} and {e.content[:2]}"
    n_slots = st.tables.n_slots
    assert all(0 <= s < n_slots for s in slot_of.values())
    refs = store.refs()
    if refs:  # counted since the first write
        want = [0] * n_slots
        for seg in st.segments:
            for slot in seg.slots.tolist():
                want[slot] += 1
        assert refs == want, "reference counts differ from the rows using each slot"
        assert store.garbage == want.count(0), (store.garbage, want.count(0))
        digests = st.tables.digest
        for d, slot in store._by_digest.items():
            assert refs[slot] > 0, f"the digest map names slot {slot}, which nothing uses"
            assert bytes(digests[slot].tolist()) == d, \
                f"the digest map names slot {slot} for another content"
        for s in slot_of.values():  # (those a commit holds, through its counts)
            assert store.find(bytes(digests[s].tolist())) == s, \
                f"live slot {s} cannot be found by its digest"
    if compacted:
        assert n_slots == len(slot_of), f"{n_slots - len(slot_of)} garbage slots survive"
        assert not refs or store.garbage == 0
        base = st.tables.lexical_base
        if base is not None:
            used = torch.zeros(len(base.vocab), dtype=torch.bool)
            for m in (*st.tables.lexical_docs.values(), base.queries):
                used[m.indices] = True
            assert bool(used.all()), f"{int((~used).sum())} vocabulary terms nothing uses"
    # the cache: no view of a replaced segment, bookkeeping bounded by its views
    cache = mem._cache
    live_versions = {s.version for s in st.segments}
    stale = cache.depends_on() - live_versions
    assert not stale, f"the cache keeps views of {len(stale)} replaced segment(s)"
    stats = cache.stats()
    assert stats["views"] <= cache.max_views
    assert stats["links"] == stats["dependencies"], stats
    assert stats["versions"] <= stats["dependencies"], stats


# ---------------------------------------------------------------- content checks
def _rows(view):
    """Per row of a one-conversation view: gran, dense rows, turn embeddings, texts."""
    out = []
    for r in range(view.n_rows):
        slot = int(view.row_slot[r])
        t0, t1 = ((int(view.turn_ptr[slot]), int(view.turn_ptr[slot + 1]))
                  if view.turn_ptr is not None else (0, 0))
        out.append(dict(
            gran=view.gran[slot], dense={k: v[slot] for k, v in view.tables.dense.items()},
            turns=view.turns[t0:t1] if view.turns is not None else None,
            text=view.turn_text.strings(range(t0, t1)) if view.turn_text is not None
            else None))
    return out


def _documents(view) -> dict:
    """Per granularity: per row, its documents as sorted (term, count) lists."""
    lex = view.lexical
    if lex is None:
        return {}
    terms = lex.vocab.terms
    out = {}
    for g in CODES:
        ptr, m = lex.doc_ptr[g], lex.docs[g]
        rows = []
        for r in range(view.n_rows):
            slot = int(view.row_slot[r])
            docs = []
            for d in range(int(ptr[slot]), int(ptr[slot + 1])):
                a, b = int(m.indptr[d]), int(m.indptr[d + 1])
                docs.append(sorted(zip((terms[i] for i in m.indices[a:b].tolist()),
                                       m.tf[a:b].tolist())))
            rows.append(docs)
        out[g] = rows
    return out


def same_results(got, want, what: str) -> None:
    for a, b in zip(got, want):
        sa = dict(zip(a.session_ids, a.scores))
        sb = dict(zip(b.session_ids, b.scores))
        assert sa.keys() == sb.keys(), f"{what}: sessions {a.session_ids} vs {b.session_ids}"
        for sid in sa:
            assert abs(sa[sid] - sb[sid]) <= 1e-4 * max(1.0, abs(sb[sid])), \
                f"{what}: score of {sid}: {sa[sid]} vs {sb[sid]}"
        # the order of sessions whose scores differ clearly
        for i in range(len(b.scores) - 1):
            if b.scores[i] - b.scores[i + 1] > 1e-4 * max(1.0, abs(b.scores[i])):
                assert a.session_ids.index(b.session_ids[i]) < \
                    a.session_ids.index(b.session_ids[i + 1]), f"{what}: order"
        ev_a = dict(zip(a.session_ids, a.evidence))
        for sid, ev in zip(b.session_ids, b.evidence):
            assert [(t, x) for t, x, _ in ev_a[sid]] == [(t, x) for t, x, _ in ev], \
                f"{what}: evidence of {sid}"


def check_contents(mem: MemoryIndex, model: Model, oracle: Oracle, *, search: bool = True,
                   queries=QUERIES, methods=METHODS, state=None) -> None:
    """Each conversation of ``mem`` against a fresh build of the model's sessions of it:
    ids, dates, embeddings, turn texts, graph, BM25 documents, and search results
    (``state``: an earlier state of ``mem`` to read instead of the current one; its
    views only, searches read the current state)."""
    st = state or mem.state()
    search = search and state is None
    enc = oracle.encoder
    for cid, entries in model.convs.items():
        view = mem.view([cid], state=st)
        if not entries:
            assert view.n_rows == 0
            for q in mem.search(cid, queries[:1], encoder=enc):
                assert q.session_ids == []
            continue
        ref = oracle.build(cid, entries)
        rv = ref.view()
        assert view.conversations[0].session_ids == rv.conversations[0].session_ids
        assert view.conversations[0].session_dates == rv.conversations[0].session_dates
        for i, (a, b) in enumerate(zip(_rows(view), _rows(rv))):
            where = f"{cid} row {i}"
            torch.testing.assert_close(a["gran"], b["gran"], rtol=0, atol=1e-5, msg=where)
            assert a["dense"].keys() == b["dense"].keys(), where
            for k in a["dense"]:
                torch.testing.assert_close(a["dense"][k], b["dense"][k], rtol=0, atol=1e-5,
                                           msg=f"{where} {k}")
            assert a["text"] == b["text"], where
            if b["turns"] is not None:
                torch.testing.assert_close(a["turns"], b["turns"], rtol=0, atol=1e-5,
                                           msg=where)
        for key in ("gmm",):
            ga, gb = view.graph(), rv.graph()
            assert torch.equal(ga[0], gb[0]) and torch.equal(ga[1], gb[1]), f"{cid} {key}"
        assert _documents(view) == _documents(rv), f"{cid}: BM25 documents"
        if search:
            for name, kw in methods.items():
                got = mem.search(cid, queries, k=8, encoder=enc, device="cpu", **kw)
                want = ref.search(cid, queries, k=8, encoder=enc, device="cpu", **kw)
                same_results(got, want, f"{cid} {name}")
