"""A memory opened on a folder reads its conversations and store chunks when first
needed (memgas_gpu/memory/lazy.py, chunks.py; storage/directory.py).

The oracle is the memory in RAM the folder was saved from: every view, search and
write of the lazily opened memory (whatever it keeps resident, nothing included) must
equal that memory's.
"""
from __future__ import annotations

import json

import pytest
import torch

from memgas_gpu import Session
from memgas_gpu.memory.index import MemoryIndex
from memgas_gpu.memory.meta import ConversationMeta
from memgas_gpu.retrieve.params import GraphParams
from memgas_gpu.retrieve.search import SearchRequest
from memgas_gpu.storage import commit

N_CONV, SESSIONS, DIM = 40, 4, 32
QUERY = ["what did I say about the garden?"]


def _memory() -> MemoryIndex:
    """Conversations whose sessions share store slots across conversations and lie in
    many chunks once saved (slots out of order within a conversation)."""
    g = torch.Generator().manual_seed(3)
    pool = N_CONV * SESSIONS // 2
    gran = torch.randn(pool, 4, DIM, generator=g)
    gran = gran / gran.norm(dim=-1, keepdim=True)
    rows = [torch.randperm(pool, generator=g)[:SESSIONS] for _ in range(N_CONV)]
    row_slot = torch.cat(rows)
    n = N_CONV * SESSIONS
    node = torch.arange(n * 4)
    has_prev = (node // 4 % SESSIONS) > 0
    src, dst = node[has_prev], node[has_prev] - 4
    edges = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    edges = edges[:, torch.argsort(edges[0] * (n * 4) + edges[1])]
    indptr = torch.zeros(n * 4 + 1, dtype=torch.long)
    indptr[1:] = torch.bincount(edges[0], minlength=n * 4).cumsum(0)
    metas = [ConversationMeta(f"c{c:03d}", [f"s{j}" for j in range(SESSIONS)],
                              [f"2024-0{1 + j}-01" for j in range(SESSIONS)])
             for c in range(N_CONV)]
    return MemoryIndex(conversations=metas, questions=[],
                       conv_offsets=torch.arange(0, n + 1, SESSIONS), row_slot=row_slot,
                       gran=gran, concat=None, q_emb=torch.zeros(0, DIM),
                       q_conv=torch.zeros(0, dtype=torch.long),
                       graphs={"gmm": (indptr, edges[1].contiguous())},
                       params=GraphParams(), config={})


def _saved(tmp_path, monkeypatch) -> tuple[MemoryIndex, str]:
    monkeypatch.setattr(commit, "CHUNK_BYTES", 4096)  # about 7 slots a chunk
    mem = _memory()
    folder = str(tmp_path / "mem")
    mem.save(folder)
    return mem, folder


def _same_search(a: MemoryIndex, b: MemoryIndex, cids, enc) -> None:
    for cid in cids:
        ra = a.search(cid, QUERY, k=SESSIONS, method="memgas", encoder=enc, device="cpu")[0]
        rb = b.search(cid, QUERY, k=SESSIONS, method="memgas", encoder=enc, device="cpu")[0]
        assert ra.session_ids == rb.session_ids, cid
        assert torch.allclose(torch.tensor(ra.scores), torch.tensor(rb.scores), atol=1e-5)


def _same_view(a: MemoryIndex, b: MemoryIndex, cids) -> None:
    va, vb = a.view(cids), b.view(cids)
    assert [m.id for m in va.conversations] == [m.id for m in vb.conversations]
    assert torch.equal(va.node_embeddings(), vb.node_embeddings())
    for x, y in zip(va.graph(), vb.graph()):
        assert torch.equal(x, y)
    assert torch.equal(va.session_days(), vb.session_days())


def test_open_reads_no_conversation_until_one_is_needed(tmp_path, monkeypatch):
    mem, folder = _saved(tmp_path, monkeypatch)
    lazy = MemoryIndex.load(folder)
    d = lazy.state().base.directory
    assert d.reads["segments"] == 0 and lazy._store.base.reads == 0
    assert lazy.n_conversations == N_CONV
    assert lazy.conversation_ids() == [m.id for m in mem.conversations]
    assert d.reads["segments"] == 0 and lazy._store.base.reads == 0  # listing: none
    lazy.view(["c007"])
    assert d.reads["segments"] == 1 and lazy._store.base.reads >= 1
    assert lazy.residency()["resident_bytes"] > 0


def test_a_lazily_opened_memory_reads_as_the_one_saved(tmp_path, monkeypatch, tiny_enc):
    mem, folder = _saved(tmp_path, monkeypatch)
    for bound in (0, 6000, None):  # nothing kept, a few things, the default
        lazy = MemoryIndex.load(folder, max_resident_bytes=bound)
        cids = [m.id for m in mem.conversations]
        _same_search(mem, lazy, cids[::3], tiny_enc)
        _same_view(mem, lazy, cids[5:17])  # a batch view over many chunks
        _same_view(mem, lazy, cids)
        got = lazy.search_many([SearchRequest(c, QUERY, SESSIONS, "memgas") for c in cids],
                               encoder=tiny_enc, device="cpu")
        want = mem.search_many([SearchRequest(c, QUERY, SESSIONS, "memgas") for c in cids],
                               encoder=tiny_enc, device="cpu")
        assert [r[0].session_ids for r in got] == [r[0].session_ids for r in want]
        res = lazy.residency()
        if bound is not None:
            assert res["resident_bytes"] <= bound
        if bound == 0:
            assert res["evictions"] == res["segment_loads"]


def test_writes_across_evictions_equal_the_same_writes_in_ram(tmp_path, monkeypatch,
                                                             tiny_enc):
    mem, folder = _saved(tmp_path, monkeypatch)
    lazy = MemoryIndex.open(folder, encoder=tiny_enc, max_resident_bytes=0)
    s = Session("new", "2024-09-01", ("[user]: the tomatoes in the garden are ripe",))
    s2 = Session("s1", "2024-02-01", ("[user]: a session replaced in its place",))
    for m in (mem, lazy):
        m.add_session("c003", s, summary="tomatoes", keywords="garden", encoder=tiny_enc)
        m.add_session("c999", s, summary="tomatoes", keywords="garden", encoder=tiny_enc)
        m.replace_session("c010", s2, summary="replaced", keywords="place",
                          encoder=tiny_enc)
        m.remove_session("c020", "s2")
        m.forget_conversation("c021")
    cids = [m.id for m in mem.conversations]
    assert lazy.conversation_ids() == cids
    _same_search(mem, lazy, ["c003", "c999", "c010", "c020", "c030"], tiny_enc)
    lazy.checkpoint()
    lazy.close()
    again = MemoryIndex.load(folder, max_resident_bytes=0)
    assert again.conversation_ids() == cids
    _same_view(mem, again, cids)
    _same_search(mem, again, ["c003", "c999", "c010", "c020"], tiny_enc)


def test_a_readiness_probe_reads_no_conversation(tmp_path, monkeypatch):
    """``GET /readyz`` counts conversations and sessions from the folder's directory: a
    server over a large folder answers its probes without reading the memory."""
    pytest.importorskip("pydantic")
    from memgas_gpu.serve.backend import MemoryCalls

    mem, folder = _saved(tmp_path, monkeypatch)
    lazy = MemoryIndex.open(folder)
    try:
        got = MemoryCalls(lazy).ready()
        assert lazy.state().base.directory.reads["segments"] == 0
        assert got == {"conversations": N_CONV, "log_bytes": 0,
                       "sessions": sum(len(c.session_ids) for c in mem.conversations)}
    finally:
        lazy.close()


def test_a_follower_that_reads_a_newer_commit_keeps_its_bound(tmp_path, monkeypatch,
                                                              tiny_enc):
    """A read-only memory whose writer wrote a full commit drops what it kept of the
    old commit, and what it reads of the new one (segments and store chunks) is in its
    own resident set: the same reads and bytes as a memory opened on the new commit
    reading the same, all of it dropped by ``drop_resident``."""
    mem, folder = _saved(tmp_path, monkeypatch)
    writer = MemoryIndex.open(folder, encoder=tiny_enc)
    follower = MemoryIndex.open(folder, readonly=True)
    cids = [m.id for m in mem.conversations]
    follower.view(cids)  # the old commit, all resident
    writer.remove_session("c004", "s1")
    writer.compact()  # a full commit: new packs, new chunks
    assert follower.refresh() == -1
    assert follower.residency()["resident_bytes"] == 0  # nothing of the old commit
    loads = follower.residency()["segment_loads"]
    follower.view(cids)
    fresh = MemoryIndex.open(folder, readonly=True)
    fresh.view(cids)
    got, want = follower.residency(), fresh.residency()
    assert got["segment_loads"] - loads == want["segment_loads"]
    assert got["resident_bytes"] == want["resident_bytes"] > 0
    _same_view(fresh, follower, cids)
    follower.drop_resident()
    assert follower.residency()["resident_bytes"] == 0
    writer.close()


def test_the_least_recently_used_is_dropped_first():
    """The resident set by hand: two things of 100 bytes fit in 200; the one read
    least recently goes when a third comes; a thing larger than the bound is handed
    back and not kept."""
    from memgas_gpu.memory.lazy import Resident

    r = Resident(200)
    r.put("a", "A", 100)
    r.put("b", "B", 100)
    assert r.get("a") == "A"  # a is now used after b
    assert r.put("c", "C", 100) == "C"
    assert (r.get("a"), r.get("b"), r.get("c")) == ("A", None, "C")
    assert (r.stats()["resident_bytes"], r.stats()["evictions"]) == (200, 1)
    assert r.put("d", "D", 300) == "D" and r.get("d") is None
    assert r.stats()["resident_bytes"] == 0


# ---------------------------------------------------------------- the chunk list in pages
def _pages_saved(tmp_path, monkeypatch) -> tuple[MemoryIndex, str]:
    monkeypatch.setattr(commit, "CHUNK_BYTES", 600)  # one slot a chunk: 70-odd chunks
    mem = _memory()
    folder = str(tmp_path / "mem")
    mem.save(folder)
    return mem, folder


def test_the_root_lists_the_last_chunks_and_pages_hold_the_others(tmp_path, monkeypatch,
                                                                   tiny_enc):
    """Read with the independent reader (tests/_format4.py): full pages of 16 chunk
    entries, each naming the page before it, then fewer than 16 + 8 in the root; the
    entries lie end to end over every slot the segments use.  A checkpoint after one
    add names every page the commit before named (none written again) and appends only
    that conversation's path, the new chunk and the root; the reopened memory reads as
    the same writes in RAM."""
    import _format4 as f4

    mem, folder = _pages_saved(tmp_path, monkeypatch)
    pages, every = f4.chunk_pages(folder), f4.chunks(folder)
    used = set()
    for e in f4.directory(folder).values():
        used |= set(f4.blob_tensors(folder, e[2:6])[0]["slots"].tolist())
    assert len(every) == len(used) > 60  # one slot a chunk
    assert len(pages) == (len(every) - 8) // 16
    assert len(f4.root(folder)["chunks"]) == len(every) - 16 * len(pages) < 16 + 8
    assert every[0]["slots"][0] == 0 and every[-1]["slots"][1] == len(used)
    assert all(a["slots"][1] == b["slots"][0] for a, b in zip(every, every[1:]))

    lazy = MemoryIndex.open(folder, encoder=tiny_enc)
    before = {k: len(v) for k, v in f4.folder_bytes(folder).items()}
    s = Session("new", "2024-09-01", ("[user]: the tomatoes in the garden are ripe",))
    for m in (mem, lazy):
        m.add_session("c003", s, summary="tomatoes", keywords="garden", encoder=tiny_enc)
    lazy.checkpoint()
    after = f4.chunk_pages(folder)
    assert [ref for ref, _ in after] == [ref for ref, _ in pages], "pages written again"
    assert f4.chunks(folder)[:len(every)] == every
    new = f4.chunks(folder)[len(every):]
    assert [c["slots"] for c in new] == [[len(used), len(used) + 1]]
    path = f4.path_of(folder, "c003")
    grown = sum(len(v) for k, v in f4.folder_bytes(folder).items()
                if k.startswith("data/")) - sum(v for k, v in before.items()
                                                  if k.startswith("data/"))
    digest = bytes(f4.blob_tensors(folder, new[0]["ref"])[0]["digest"][0].tolist())
    counts = f4.ref_path(folder, f4.ref_leaf(digest, len(used)))  # the new slot's count
    assert len(counts) == 4 and None not in counts
    assert grown == sum(ref[2] for ref in (path["segment"], path["leaf"], path["page"],
                                           new[0]["ref"], *counts, f4.pointer(folder)["root"]))
    assert f4.ref_counts(folder)[len(used)] == (digest.hex(), 1)
    lazy.close()
    again = MemoryIndex.load(folder, max_resident_bytes=0)
    cids = [m.id for m in mem.conversations]
    _same_view(mem, again, cids)
    _same_search(mem, again, ["c003", "c010"], tiny_enc)


@pytest.mark.parametrize("damage", ["crc", "short", "prev", "gap", "count"])
def test_a_damaged_chunk_page_is_refused_naming_it(tmp_path, monkeypatch, damage):
    """A chunk page's bytes changed (its CRC-32 then fails), or a page written again with
    its CRC-32 recomputed but 15 entries, a last page naming no page before it, entries
    that skip a slot, or a root counting one page more than the chain holds: each is
    refused at the open, naming the page."""
    import _format4 as f4
    from memgas_gpu.storage.validate import IndexFormatError

    _, folder = _pages_saved(tmp_path, monkeypatch)
    pages = f4.chunk_pages(folder)
    assert len(pages) >= 3
    last_ref, last = pages[-1]
    page = f4.json_blob(folder, last_ref)
    want = f"store chunk page {len(pages) - 1}"
    if damage == "crc":
        path = f"{folder}/data/{last_ref[0]:08d}.pack"
        with open(path, "r+b") as f:
            f.seek(last_ref[1] + 10)
            b = f.read(1)
            f.seek(last_ref[1] + 10)
            f.write(bytes([b[0] ^ 1]))
    else:
        if damage == "short":
            page["chunks"] = page["chunks"][:-1]
            want += ": 15 chunks, not 16"
        elif damage == "prev":  # the chain ends a page early
            page["prev"] = None
            want = f"store chunk page {len(pages) - 2}: missing"
        elif damage == "gap":
            page["chunks"][3]["slots"][0] += 1
            want += r": chunks\[3\] does not follow"
        ref = f4.append_blob(folder, json.dumps(page).encode())
        r = f4.root(folder)
        r["chunk_pages"]["last"] = ref
        if damage == "count":
            r["chunk_pages"]["pages"] += 1
            want = "store chunk page 0: missing"
        f4.set_root(folder, r)
    with pytest.raises(IndexFormatError, match=want):
        MemoryIndex.load(folder)


def _live(mem) -> int:
    """Slots some conversation refers to (counted over the memory's views)."""
    st = mem.state()
    return len({s for c in mem.conversation_ids() for s in st.get(c).slots.tolist()})


def test_the_first_write_after_an_open_reads_only_what_it_touches(tmp_path, monkeypatch,
                                                                 tiny_enc):
    """A commit keeps the store's reference counts (docs/index-format.md), so a write
    to a memory opened on a folder reads the conversations it changes and the counts of
    their slots, no other conversation; a session added again after a reopen is found
    by its digest in the commit (stored once) and a forget of conversations sharing
    slots drops each count by their rows.  Oracles: the same writes in RAM (views,
    searches, how many slots are live) and the independent reader's count of every
    segment's rows (tests/_format4.py)."""
    import _format4 as f4

    mem, folder = _saved(tmp_path, monkeypatch)
    lazy = MemoryIndex.open(folder, encoder=tiny_enc)
    d = lazy.state().base.directory
    s = Session("new", "2024-09-01", ("[user]: the tomatoes in the garden are ripe",))
    for m in (mem, lazy):
        m.forget_conversation("c005")
        m.add_session("c003", s, summary="tomatoes", keywords="garden", encoder=tiny_enc)
        m.add_session("c999", s, summary="tomatoes", keywords="garden", encoder=tiny_enc)
    assert d.reads["segments"] == 2, "a write read conversations it does not change"
    lazy.checkpoint()
    lazy.close()
    assert f4.ref_counts(folder) == f4.counted_refs(folder)

    again = MemoryIndex.open(folder, encoder=tiny_enc)
    d = again.state().base.directory
    n = again._store.n_slots
    for m in (mem, again):
        m.add_session("c777", s, summary="tomatoes", keywords="garden", encoder=tiny_enc)
        m.forget_conversation("c006")
        m.forget_conversation("c007")
    assert again._store.n_slots == n, "a session the commit holds was stored again"
    assert d.reads["segments"] == 2
    counts = again._store.refs()
    st = again.state()
    slot = st.get("c777").slots.item()
    assert counts[slot] == 3 and st.get("c003").slots[-1].item() == slot
    again.checkpoint()
    again.close()
    assert f4.ref_counts(folder) == f4.counted_refs(folder)
    back = MemoryIndex.load(folder, max_resident_bytes=0)
    cids = [c.id for c in mem.conversations]
    assert back.conversation_ids() == cids
    _same_view(mem, back, cids)
    _same_search(mem, back, ["c003", "c777", "c008"], tiny_enc)
    assert _live(back) == _live(mem)


@pytest.mark.parametrize("damage", ["low", "entry", "slot", "leaf", "crc", "node"])
def test_damaged_reference_counts_are_refused_by_the_write_that_reads_them(
        tmp_path, monkeypatch, tiny_enc, damage):
    """A reference leaf whose count is lower than the rows referring to its slot, an
    entry that is not [digest, slot, count], a slot past the store, an entry moved to
    another leaf, a leaf's bytes changed, or a node above it of 15 refs: the write that
    reads it fails with one line naming the leaf or node (or the count)."""
    import _format4 as f4
    from memgas_gpu.storage.validate import IndexFormatError

    mem, folder = _saved(tmp_path, monkeypatch)
    counts = f4.ref_counts(folder)
    cid = "c011"
    slots = f4.blob_tensors(folder, f4.directory(folder)[cid][2:6])[0]["slots"].tolist()
    slot = next(s for s in slots if counts[s][1] >= 2)  # shared with another conversation
    leaf = f4.ref_leaf(bytes.fromhex(counts[slot][0]), slot)
    want = f"reference leaf {leaf}"

    def edit(doc):
        e = next(e for e in doc["entries"] if e[1] == slot)
        if damage == "low":
            e[2] = 1
        elif damage == "entry":
            del e[2]
        elif damage == "slot":
            e[1] = 10 ** 6
        elif damage == "leaf":  # another slot's entry, which hashes to another leaf
            other = next(k for k, (d, _) in counts.items()
                         if f4.ref_leaf(bytes.fromhex(d), k) != leaf)
            doc["entries"].append([counts[other][0], other, counts[other][1]])

    if damage == "crc":
        ref = f4.ref_path(folder, leaf)[-1]
        with open(f"{folder}/data/{ref[0]:08d}.pack", "r+b") as f:
            f.seek(ref[1] + 3)
            b = f.read(1)
            f.seek(ref[1] + 3)
            f.write(bytes([b[0] ^ 1]))
    elif damage == "node":
        f4.edit_ref_leaf(folder, leaf, lambda doc: doc["refs"].pop(), level=1)
        want = "reference node 3.[0-9]+: expected {'refs': \\[16 blob references"
    else:
        f4.edit_ref_leaf(folder, leaf, edit)
    if damage == "low":
        want = f"slot {slot} is referred to by a conversation, but the reference counts"
    elif damage == "leaf":
        want += ": slot [0-9]+'s entry does not belong in it"
    elif damage == "slot":
        want += ": slot 1000000 with [0-9]+ references \\(a store of"
    lazy = MemoryIndex.open(folder, encoder=tiny_enc, max_resident_bytes=0)
    others = [c for c in lazy.conversation_ids() if c != cid and slot in
              f4.blob_tensors(folder, f4.directory(folder)[c][2:6])[0]["slots"].tolist()]
    with pytest.raises(IndexFormatError, match=want):
        for c in [cid, *others]:  # the second forget takes the count below zero
            lazy.forget_conversation(c)
    assert cid in lazy.conversation_ids() if damage != "low" else True
    lazy.close()


def test_a_compaction_counts_the_rows_again(tmp_path, monkeypatch, tiny_enc):
    """A commit whose counts leave out a slot conversations use (its entry gone, the
    root's live count one less): a compaction counts every conversation's rows again,
    so it keeps that slot; the memory equals the one saved, and the full commit after
    it holds the true counts (the independent reader's)."""
    import _format4 as f4

    mem, folder = _saved(tmp_path, monkeypatch)
    counts = f4.ref_counts(folder)
    slot = max(counts, key=lambda s: counts[s][1])  # the most shared slot
    f4.edit_ref_leaf(folder, f4.ref_leaf(bytes.fromhex(counts[slot][0]), slot),
                     lambda doc: doc["entries"].remove(
                         next(e for e in doc["entries"] if e[1] == slot)))
    r = f4.root(folder)
    r["refs"]["live"] -= 1
    f4.set_root(folder, r)
    lazy = MemoryIndex.open(folder, encoder=tiny_enc, max_resident_bytes=0)
    lazy.compact()
    lazy.close()
    assert f4.ref_counts(folder) == f4.counted_refs(folder)
    assert f4.ref_counts(folder)[slot][1] == counts[slot][1]
    back = MemoryIndex.load(folder)
    cids = [c.id for c in mem.conversations]
    _same_view(mem, back, cids)
    _same_search(mem, back, cids[::5], tiny_enc)
