"""What commits, compaction, atomic batches and the readers of a durable memory promise
(README "A memory kept in a folder"; docs/index-format.md "Commits", "The log",
"Readers"; docs/failure.md "A durable memory"), each checked by an oracle that does not
come from the code under test:

* the folder format 4 read by the test (``tests/_format4.py``, from the documented
  layout only: the pointer, the root, the directory's pages, leaves and entries, the
  packs' headers, ends and live bytes, the log's framed records): which conversation
  entries a commit changed, which blobs it appended and how many bytes, which packs a
  commit names and which a full commit removed, what one record of the log holds;
* every byte of every file of the folder, searched (a forgotten conversation's id,
  dates, metadata, texts and embedding rows; a removed or replaced session's);
* what was written, kept by the test: a fresh in-RAM memory given the same operations,
  or the plain-Python model of ``tests/_memory_model.py`` with its fresh builds of each
  conversation alone (embeddings, texts, graphs, BM25 documents, searches);
* for a read-only follower, every byte, mtime and name of the folder before and after;
  for readers in threads, the list of writes the writer had started and acknowledged.

A commit appends to a pack (docs/index-format.md, "Commits"): until the next full commit
(``compact()``, a conversion, ``save``, or superseded blobs outweighing the live ones)
blobs of a forgotten conversation or a removed session may still be in a pack, named by
no commit; "deletion deletes, at the next compaction" (docs/failure.md) is what is
checked here.

The model-based walk at the end (``FollowedMachine``) adds batches, replacements,
forgets and a read-only follower that refreshes across commits and compactions to the
durable walk of ``tests/test_memory_model.py``, and checks the folder after every step.
"""
from __future__ import annotations

import random
import re
import shutil
import struct
import threading
import time
import zlib
from pathlib import Path
from unittest import mock

import pytest
import torch

pytest.importorskip("Stemmer")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (invariant, rule,  # noqa: E402
                                 run_state_machine_as_test)

import _format4 as f4  # noqa: E402
from memgas_gpu import Dataset, Session  # noqa: E402
from memgas_gpu.retrieve import MemoryIndex  # noqa: E402

from _memory_model import (CONVERSATIONS, DATES, KEYWORDS, POOL, SUMMARIES,  # noqa: E402
                           Entry, Model, Oracle, check_bookkeeping, check_contents,
                           resolved_texts)
from test_memory_model import DurableMachine, _oracle  # noqa: E402

QUERIES = ["What breed is Rex?", "When is the violin recital?", "What did Clara bake?"]
#: the only files a memory's folder holds between writes (docs/index-format.md)
_OWN = re.compile(r"^(manifest\.json|\.lock|data/[0-9]{8}\.pack|wal/[0-9]{20}\.log)$")


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The encoder is tiny: on a shared 2-core machine one thread is several times
    faster than two that contend (the setting is restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def enc(tiny_enc):
    """The test session's tiny random BERT (conftest)."""
    return tiny_enc


# ---------------------------------------------------------------- the folder, by hand
def _snapshot(folder: Path) -> dict:
    """Every entry of the folder: its kind, bytes (files), size, mode and mtime."""
    out = {}
    for p in sorted([folder, *folder.rglob("*")]):
        s = p.lstat()
        out[p.relative_to(folder).as_posix()] = (
            "dir" if p.is_dir() else "file", p.read_bytes() if p.is_file() else None,
            s.st_size if p.is_file() else None, s.st_mode, s.st_mtime_ns)
    return out


def _holders(folder: Path, needles) -> dict:
    """file -> the needles (bytes) it holds, for every file of the folder holding one."""
    out = {}
    for p in Path(folder).rglob("*"):
        if p.is_file():
            raw = p.read_bytes()
            got = [n for n in needles if n in raw]
            if got:
                out[p.relative_to(folder).as_posix()] = got
    return out


def _commit_holds(folder: Path, needles) -> dict:
    """blob -> the needles it holds, for every blob the current commit names."""
    out = {}
    for what, ref in f4.commit_blobs(folder):
        raw = f4.blob(folder, ref)
        got = [n for n in needles if n in raw]
        if got:
            out[what] = got
    return out


def _packs(folder: Path) -> set:
    return set(f4.pack_sizes(folder))


def assert_tidy(folder: Path, what: str = "") -> dict:
    """The commit the pointer names is whole, and the folder holds nothing else:

    * the pointer (format 4) names a root of its own commit number; every blob the
      commit names (root, chunks, questions, pages, leaves, segments) reads back with
      its CRC-32, inside a pack the root lists and before that pack's committed end;
    * the packs in ``data/`` are exactly those the root lists, each with its header
      (naming its own number) and exactly its committed length: nothing an
      interrupted or a replaced commit appended or created is left;
    * each pack's live bytes (the root's figure) are the bytes of the blobs the commit
      names in it;
    * no other file: no temporary file, no file of an older format;
    * the log holds the records after the commit (its first file starts at or before
      the record after the commit's LSN);
    * the store's reference counts are the rows of the commit's conversations referring
      to each slot, each entry with its slot's digest (read independently).

    Returns the root."""
    folder = Path(folder)
    ptr = f4.pointer(folder)
    assert ptr["format"] == "memgas_gpu.index" and ptr["version"] == 4, (what, ptr)
    root = f4.root(folder)
    assert root["commit"] == ptr["commit"] and root["version"] == 4, (what, ptr)
    packs = {int(k): v for k, v in root["packs"].items()}
    sizes = f4.pack_sizes(folder)
    assert sizes == {k: v["end"] for k, v in packs.items()}, \
        f"{what}: packs in the folder {sizes}, the root lists {packs}"
    for k in sizes:
        magic, version, number = f4.pack_header(folder, k)
        assert magic == f4.PACK_MAGIC and number == k and version >= 1, (what, k)
    live = dict.fromkeys(packs, 0)
    for name, ref in f4.commit_blobs(folder):
        assert ref[0] in packs and ref[1] >= f4.PACK_HEADER and \
            ref[1] + ref[2] <= packs[ref[0]]["end"], f"{what}: {name} at {ref}, packs {packs}"
        live[ref[0]] += ref[2]
    assert live == {k: v["live"] for k, v in packs.items()}, \
        f"{what}: bytes of the blobs the commit names {live}, the root says {packs}"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    foreign = [f for f in files if not _OWN.match(f)]
    assert not foreign, f"{what}: files that are no part of the commit or the log: {foreign}"
    logs = f4.log_files(folder)
    assert logs and min(logs) <= root["lsn"] + 1, (what, sorted(logs), root["lsn"])
    assert f4.ref_counts(folder) == f4.counted_refs(folder), f"{what}: reference counts"
    return root


def _commit_state(folder: Path) -> dict:
    """The pointer, root, store chunks and directory of the current commit, and every
    pack's bytes."""
    return {"pointer": f4.pointer(folder), "root": f4.root(folder),
            "chunks": f4.chunks(folder), "dir": f4.directory(folder),
            "refs": f4.ref_counts(folder),
            "packs": {k: (folder / "data" / f"{k:08d}.pack").read_bytes()
                      for k in f4.pack_sizes(folder)}}


def _appended(before: dict, folder: Path) -> int:
    """Bytes appended to the packs since ``before``, checking that the packs were only
    appended to (the same packs, every byte before still there)."""
    now = {k: (folder / "data" / f"{k:08d}.pack").read_bytes() for k in f4.pack_sizes(folder)}
    assert set(now) == set(before["packs"]), \
        f"packs {sorted(before['packs'])} became {sorted(now)}: not an incremental commit"
    for k, raw in before["packs"].items():
        assert now[k][:len(raw)] == raw, f"pack {k}: committed bytes changed"
    return sum(len(now[k]) - len(raw) for k, raw in before["packs"].items())


def assert_wrote_what_changed(folder: Path, before: dict, cid: str, sessions: int,
                              slots: list, what: str) -> None:
    """The commit made since ``before`` wrote what one write to ``cid`` changed:

    * exactly ``cid``'s directory entry changed (its ordinal kept, ``sessions``
      sessions): every other entry, so every other segment blob, is the one before;
    * the store chunks before are kept and one chunk was appended, of exactly the new
      slots ``slots``; the questions' blob is the one before, the generation too;
    * the reference counts that changed are those of the new slots (one row each);
    * the packs were only appended to, and the bytes appended are at most ``cid``'s
      new segment + that chunk + its leaf + its page + the path of each changed count
      (a leaf and three nodes) + the root (each of which lies in what was appended)."""
    after = _commit_state(folder)
    assert after["pointer"]["commit"] == before["pointer"]["commit"] + 1, what
    old_dir, new_dir = before["dir"], after["dir"]
    changed = sorted(c for c in {*old_dir, *new_dir} if old_dir.get(c) != new_dir.get(c))
    assert changed == [cid], f"{what}: directory entries changed: {changed}"
    if cid in old_dir:
        assert new_dir[cid][1] == old_dir[cid][1], f"{what}: the ordinal changed"
    assert new_dir[cid][6] == sessions, (what, new_dir[cid])
    r0, r1 = before["root"], after["root"]
    assert r1["generation"] == r0["generation"], f"{what}: a new store generation"
    assert r1["questions"] == r0["questions"], f"{what}: the questions were written again"
    c0, c1 = before["chunks"], after["chunks"]
    assert c1[:len(c0)] == c0, f"{what}: the store chunks before were not kept"
    new_chunks = c1[len(c0):]
    assert [c["slots"] for c in new_chunks] == [slots], (what, new_chunks)
    appended = _appended(before, folder)
    path = f4.path_of(folder, cid)
    g0, g1 = before["refs"], after["refs"]
    moved = sorted(k for k in {*g0, *g1} if g0.get(k) != g1.get(k))
    assert moved == list(range(*slots)) and all(g1[k][1] == 1 for k in moved), (what, moved)
    counts = {tuple(ref) for k in moved for ref in f4.ref_path(
        folder, f4.ref_leaf(bytes.fromhex(g1[k][0]), k))}
    budget = {"segment": path["segment"][2], "chunk": new_chunks[0]["ref"][2],
              "leaf": path["leaf"][2], "page": path["page"][2],
              "counts": sum(ref[2] for ref in counts), "root": after["pointer"]["root"][2]}
    assert appended <= sum(budget.values()), f"{what}: {appended} bytes appended, {budget}"
    ends = {k: len(v) for k, v in before["packs"].items()}
    for name, ref in [*path.items(), ("chunk", new_chunks[0]["ref"]),
                      *(("count", list(r)) for r in counts),
                      ("root", after["pointer"]["root"])]:
        assert ref[1] >= ends[ref[0]], f"{what}: the {name} is not among the appended bytes"


def assert_full_commit(folder: Path, packs_before: set, what: str) -> dict:
    """The last commit was a full one: tidy, in one new pack numbered after every pack
    before; every pack before is gone."""
    root = assert_tidy(folder, what)
    now = _packs(folder)
    assert len(now) == 1 and min(now) > max(packs_before or {0}), \
        f"{what}: packs {sorted(packs_before)} became {sorted(now)}"
    return root


# ---------------------------------------------------------------- memories
def _fresh(enc) -> MemoryIndex:
    return MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)


def _add(mem, cid, p, enc, date="2023-06-01", sid=None, **kw):
    s = POOL[p]
    mem.add_session(cid, Session(sid or s.id, date, s.turns), encoder=enc, **kw)


def _secret(i: int, date: str = "2023-06-01", sid: str = "") -> Session:
    return Session(sid or f"x{i}", date,
                   (f"[Zed]: my vault code is {i:03d}-ORCHID-{(i * 7919) % 10007:05d}",))


def _ids(mem) -> dict:
    return {c.id: list(c.session_ids) for c in mem.conversations}


def same_memory(a: MemoryIndex, b: MemoryIndex, enc, what: str = "") -> None:
    """``a`` holds what ``b`` holds: conversations, sessions (ids, dates, metadata,
    texts), embeddings, graphs and search answers."""
    assert [c.id for c in a.conversations] == [c.id for c in b.conversations], what
    for ca in a.conversations:
        cid = ca.id
        assert a.sessions(cid) == b.sessions(cid), (what, cid)
        for s in a.sessions(cid):
            assert a.get_session(cid, s["id"]) == b.get_session(cid, s["id"]), (what, cid)
        va, vb = a.view([cid]), b.view([cid])
        torch.testing.assert_close(va.gran[va.row_slot], vb.gran[vb.row_slot], rtol=0,
                                   atol=1e-5, msg=f"{what} {cid}")
        ga, gb = va.graph(), vb.graph()
        assert torch.equal(ga[0], gb[0]) and torch.equal(ga[1], gb[1]), (what, cid)
        if ca.session_ids:
            for x, y in zip(a.search(cid, QUERIES, k=10, encoder=enc),
                            b.search(cid, QUERIES, k=10, encoder=enc)):
                assert x.session_ids == y.session_ids, (what, cid)
                assert x.scores == pytest.approx(y.scores, rel=1e-4, abs=1e-5)


def _no_stale_views(mem: MemoryIndex, what: str = "") -> None:
    """The memory's view cache depends on current segment versions only (no public
    view of the cache: its private record)."""
    live = {s.version for s in mem.state().segments}
    stale = mem._cache.depends_on() - live
    assert not stale, f"{what}: the cache keeps views of {len(stale)} replaced segment(s)"


# ================================================================ 1. what a commit writes
def _n_conversations(mem, n, enc):
    for c in range(n):
        for p in (0, 3, 5):
            _add(mem, f"c{c}", p, enc, summary=f"summary of c{c}", metadata={"n": c})


def test_the_first_checkpoint_after_a_reopen_writes_what_changed(tmp_path, enc):
    """10 conversations, a compaction (the store's generation moves on), close; reopen:
    opening writes nothing; an idle checkpoint appends a root only; one add to one
    conversation then a checkpoint: one directory entry changes, one chunk of the one
    new slot is appended, and the bytes appended are bounded by segment + chunk + leaf
    + page + root (a full rewrite would cost the whole store and ten segments)."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    generation = f4.root(folder)["generation"]
    _n_conversations(mem, 10, enc)
    mem.remove_session("c0", "s1")
    assert mem.compact() == 1
    assert f4.root(folder)["generation"] > generation
    mem.close()
    assert_tidy(folder, "closed")
    before = f4.folder_bytes(folder)

    mem = MemoryIndex.open(folder, encoder=enc)
    after = f4.folder_bytes(folder)
    assert {f: b for f, b in after.items() if f != ".lock"} == \
        {f: b for f, b in before.items() if f != ".lock"}, \
        "opening a closed folder wrote a commit or a log record"
    state = _commit_state(folder)
    mem.checkpoint()  # nothing changed: a root only
    now = _commit_state(folder)
    assert now["pointer"]["commit"] == state["pointer"]["commit"] + 1
    assert now["dir"] == state["dir"] and now["chunks"] == state["chunks"]
    assert _appended(state, folder) == now["pointer"]["root"][2], "an idle checkpoint " \
        "wrote more than a root"
    assert_tidy(folder, "an idle checkpoint")

    state = _commit_state(folder)
    _add(mem, "c4", 6, enc, summary="a new one")
    mem.checkpoint()
    assert_wrote_what_changed(folder, state, "c4", 4, [29, 30], "one add after a reopen")
    assert_tidy(folder, "after one add")
    mem.close()
    back = MemoryIndex.load(folder)
    oracle = _fresh(enc)
    _n_conversations(oracle, 10, enc)
    oracle.remove_session("c0", "s1")
    _add(oracle, "c4", 6, enc, summary="a new one")
    same_memory(back, oracle, enc, "reloaded")


def test_the_checkpoint_after_a_replayed_log_writes_what_changed(tmp_path, enc):
    """A crash after one add to one of 10 conversations: opening replays the record and
    commits; that commit writes the one changed conversation, not all ten (the loaded
    segments keep the versions the commit recorded), and covers the record."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    _n_conversations(mem, 10, enc)
    mem.checkpoint()
    state = _commit_state(folder)
    n_slots = state["chunks"][-1]["slots"][1]
    _add(mem, "c4", 6, enc, summary="a new one")
    mem.abandon()  # killed: the add is in the log only
    last = f4.log_records(folder)[-1][0]
    back = MemoryIndex.open(folder, encoder=enc)
    assert back.recovery["replayed"] == 1
    assert_wrote_what_changed(folder, state, "c4", 4, [n_slots, n_slots + 1],
                              "the commit after a replayed log")
    root = assert_tidy(folder, "after recovery")
    assert root["lsn"] == last and [r for r in f4.log_records(folder) if r[0] > last] == []
    oracle = _fresh(enc)
    _n_conversations(oracle, 10, enc)
    _add(oracle, "c4", 6, enc, summary="a new one")
    same_memory(back, oracle, enc, "recovered")
    back.close()


# ================================================================ 2. no stale commit
def test_every_commit_names_packs_that_exist_and_a_full_commit_removes_those_it_replaced(
        tmp_path, enc, monkeypatch):
    """After every kind of commit (the first, explicit, on close, automatic, the first
    of a process, the one after a replayed log) the pointer names a whole commit and the
    folder holds nothing else; after every full commit (``compact()``, superseded blobs
    outweighing the live ones, ``save`` over the folder, a format-3 folder converted)
    the commit is in one new pack and the packs it replaced are gone."""
    from memgas_gpu.storage import commit

    import _legacy_writers as lw

    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    assert_tidy(folder, "new")
    commits = [f4.pointer(folder)["commit"]]

    def step(what):
        assert_tidy(folder, what)
        n = f4.pointer(folder)["commit"]
        assert n > commits[-1], f"{what}: no new commit"
        commits.append(n)

    _add(mem, "keep", 0, enc)
    mem.checkpoint()
    step("explicit")
    _add(mem, "keep", 3, enc)
    mem.close()
    step("on close")
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=1)
    _add(mem, "keep", 5, enc)  # the log grew past 1 byte: a commit
    step("automatic, the first of a process")
    mem.remove_session("keep", "s2")
    step("automatic")
    mem.close()
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "other", 6, enc)
    mem.abandon()  # killed: the add is in the log only
    mem = MemoryIndex.open(folder, encoder=enc)
    assert mem.recovery["replayed"] == 1
    step("after a replayed log")

    packs = _packs(folder)
    assert mem.compact() == 1  # the removed session's slot
    assert_full_commit(folder, packs, "compact()")
    packs = _packs(folder)
    assert mem.compact() == 0  # nothing to drop: still a full commit
    assert_full_commit(folder, packs, "compact() with nothing to drop")

    monkeypatch.setattr(commit, "GARBAGE_BYTES", 0)
    packs = _packs(folder)
    for _ in range(200):  # idle commits: each supersedes a root
        stats = mem.storage_stats()
        mem.checkpoint()
        if _packs(folder) != packs:
            break
        assert_tidy(folder, "an idle commit")
    assert stats["garbage_bytes"] > stats["live_bytes"]
    assert_full_commit(folder, packs, "superseded blobs outweighing the live ones")
    monkeypatch.undo()
    mem.close()

    packs = _packs(folder)
    back = MemoryIndex.load(folder)
    back.save(folder)
    assert_full_commit(folder, packs, "save over the folder")
    mem = MemoryIndex.open(folder, encoder=enc)
    assert _ids(mem) == {"keep": ["s1", "s4"], "other": ["s5"]}
    mem.close()

    old = tmp_path / "v3"
    lw.write_v3(back, old, lsn=5)
    converted = MemoryIndex.open(old, encoder=enc)
    assert_full_commit(old, set(), "a format-3 folder converted")
    assert _ids(converted) == _ids(back)
    converted.close()
    assert_tidy(old, "converted, closed")
    assert _ids(MemoryIndex.load(old)) == _ids(back)  # its log was empty: still one
    again = MemoryIndex.open(old, encoder=enc)
    _add(again, "other", 7, enc)
    again.close()
    assert_tidy(old, "converted, reopened")
    assert _ids(MemoryIndex.load(old)) == {"keep": ["s1", "s4"], "other": ["s5", "s6"]}


def test_what_an_interrupted_commit_left_is_removed_by_the_next_writer(tmp_path, enc):
    """Bytes appended to a pack past its committed end, a pack no commit names and
    temporary files (a writer killed mid-commit, mid-pointer, mid-log-rotation) are
    cut off and removed when the folder's next writer opens it, before anything is
    written; the memory is the one the pointer names."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "keep", 0, enc)
    mem.checkpoint()
    _add(mem, "keep", 3, enc)
    mem.close()
    assert_tidy(folder, "closed")
    junk = f"left by a crash: {FORGOTTEN}".encode()
    last = max(_packs(folder))
    with open(folder / "data" / f"{last:08d}.pack", "ab") as f:
        f.write(junk * 10)  # a commit cut short before its pointer
    head = struct.pack("<8sIQ", f4.PACK_MAGIC, 1, last + 1)
    (folder / "data" / f"{last + 1:08d}.pack").write_bytes(  # a full commit cut short
        head + struct.pack("<I", zlib.crc32(head)) + junk)
    leftovers = [".manifest.json.a1b2c3d4.tmp", "data/.00000007.pack.0f0e0d0c.tmp",
                 "wal/.00000000000000000099.log.deadbeef.tmp"]
    for name in leftovers:
        (folder / name).write_bytes(junk)
    assert _holders(folder, [FORGOTTEN.encode()])
    back = MemoryIndex.load(folder)  # a reader reads the commit the pointer names
    assert _ids(back) == {"keep": ["s1", "s2"]}

    mem = MemoryIndex.open(folder, encoder=enc)
    assert_tidy(folder, "opened")
    assert _holders(folder, [FORGOTTEN.encode()]) == {}
    assert _ids(mem) == {"keep": ["s1", "s2"]}
    _add(mem, "keep", 5, enc)
    mem.checkpoint()
    assert_tidy(folder, "the next commit")
    mem.close()
    assert _ids(MemoryIndex.load(folder)) == {"keep": ["s1", "s2", "s4"]}


# ================================================================ 3. forgetting deletes
FORGOTTEN = "conv-FORGOTTEN-4471"
F_DATE = "1999-12-31"
F_META = "zebra-ALPHA-7731"


def _add_forgotten(mem, enc, k: int) -> list:
    """Two sessions of their own texts in FORGOTTEN; the needles that give them away:
    the id, the date, the metadata, the texts, the embedding rows."""
    sessions = [_secret(100 + 10 * k + i, date=F_DATE) for i in (0, 1)]
    mem.add_sessions(FORGOTTEN, sessions, encoder=enc, summaries=["zed"] * 2,
                     keywords=["code"] * 2, metadata=[{"tag": F_META}] * 2)
    v = mem.view([FORGOTTEN])
    rows = [v.gran[int(s)].numpy().tobytes()[:128] for s in v.row_slot]
    return [FORGOTTEN.encode(), F_DATE.encode(), F_META.encode(),
            *(s.turns[0].encode() for s in sessions), *rows]


def test_forget_then_compact_leaves_no_byte_of_the_conversation(tmp_path, enc):
    """After ``forget_conversation`` the next commit names no blob holding the
    conversation's id, dates or metadata (its texts and embeddings stay in the store
    until a compaction, and blobs of older commits may stay in a pack: a commit
    appends); after ``compact()`` no file of the folder, the log included, holds its
    id, dates, metadata, texts or embedding rows. So whether the forget was
    checkpointed explicitly, automatically, on close, or replayed after a crash."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "keep", 0, enc)
    needles = _add_forgotten(mem, enc, 0)
    mem.checkpoint()
    page, leaf = f4.leaf_of(FORGOTTEN)
    assert set(_commit_holds(folder, needles[:3])) == {f"segment {FORGOTTEN}",
                                                       f"leaf {page}.{leaf}"}
    mem.forget_conversation(FORGOTTEN)
    mem.checkpoint()
    assert_tidy(folder, "after forget")
    assert FORGOTTEN not in f4.directory(folder)
    assert f4.root(folder)["directory"]["conversations"] == 1
    assert _commit_holds(folder, needles[:3]) == {}, "the commit names the forgotten " \
        "conversation's segment or entry"
    assert _holders(folder, needles)  # the store and older blobs: until a compaction
    mem.compact()
    assert_tidy(folder, "compact()")
    assert _holders(folder, needles) == {}, "compact() left the forgotten conversation"

    # forgotten in the log only, then closed (a commit), compacted by the next process
    needles = _add_forgotten(mem, enc, 1)
    mem.checkpoint()
    mem.forget_conversation(FORGOTTEN)
    mem.close()
    assert _commit_holds(folder, needles[:3]) == {}
    mem = MemoryIndex.open(folder, encoder=enc)
    mem.compact()
    assert _holders(folder, needles) == {}

    # automatic commits
    mem.close()
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=1)
    needles = _add_forgotten(mem, enc, 2)
    assert set(_commit_holds(folder, needles[:3]))  # committed automatically
    mem.forget_conversation(FORGOTTEN)
    assert _commit_holds(folder, needles[:3]) == {}
    mem.compact()
    assert_tidy(folder, "compact() after automatic commits")
    assert _holders(folder, needles) == {}

    # a crash with the forget in the log only: the recovery commit, then compact()
    needles = _add_forgotten(mem, enc, 3)
    mem.close()
    mem = MemoryIndex.open(folder, encoder=enc)
    mem.forget_conversation(FORGOTTEN)
    mem.abandon()
    mem = MemoryIndex.open(folder, encoder=enc)
    assert mem.recovery["replayed"] == 1
    assert_tidy(folder, "after recovery")
    assert _commit_holds(folder, needles[:3]) == {}
    mem.compact()
    assert _holders(folder, needles) == {}
    assert _ids(mem) == {"keep": ["s1"]}
    mem.close()
    assert _holders(folder, needles) == {}
    assert _ids(MemoryIndex.load(folder)) == {"keep": ["s1"]}


@pytest.mark.parametrize("how,then", [("remove", "compact"), ("forget", "compact"),
                                      ("forget", "checkpoint")])
def test_compact_after_an_automatic_compaction_leaves_no_byte_of_the_removed(tmp_path, enc,
                                                                             how, then):
    """Removed sessions outnumber the live ones (more than max(COMPACT_MIN_GARBAGE=64,
    slots / 2) garbage): the write that crossed the line compacted the store in memory
    already; ``compact()`` then has nothing left to drop, and still must leave no file
    of the folder (log included) holding the removed sessions' texts, embeddings or
    (all of them forgotten) vocabulary terms; so must the next checkpoint
    (docs/failure.md: "the automatic compaction ... followed by the next checkpoint")."""
    from memgas_gpu.memory.store import COMPACT_MIN_GARBAGE

    n_gone, n_kept = COMPACT_MIN_GARBAGE + 1, 3
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    oracle = _fresh(enc)
    for m in (mem, oracle):
        _add(m, "keep", 0, enc)
        _add(m, "keep", 3, enc)
    sessions = [_secret(i) for i in range(n_gone + n_kept)]
    for i, s in enumerate(sessions):
        if i == n_gone // 2:
            mem.checkpoint()  # half of them in a store chunk, half in the log only
        mem.add_session("bulk", s, encoder=enc, summary=f"vault {i}", keywords="vault")
    now = mem.state()
    bulk = now.segments[now.ids["bulk"]]
    rows = [now.tables.gran[int(slot)].numpy().tobytes() for slot in bulk.slots]
    texts = [s.turns[0].encode() for s in sessions]
    gone = texts[:n_gone] + [r[:128] for r in rows[:n_gone]]
    kept = texts[n_gone:] + [r[:128] for r in rows[n_gone:]] + [b"orchid"]
    if how == "remove":
        for s in sessions[:n_gone]:
            mem.remove_session("bulk", s.id)
        for i, s in enumerate(sessions[n_gone:], n_gone):
            oracle.add_session("bulk", s, encoder=enc, summary=f"vault {i}", keywords="vault")
        live = 2 + n_kept
    else:
        mem.forget_conversation("bulk")
        gone, kept, live = gone + kept, [], 2  # "orchid": a term only they used
    # the automatic compaction ran: only the live sessions are stored
    assert mem.state().tables.n_slots == live
    assert _holders(folder, gone)  # the log and the older chunk still hold them
    if then == "compact":
        assert mem.compact() == 0  # nothing left to drop in memory
    else:
        mem.checkpoint()
    assert _holders(folder, gone) == {}, f"{then}() left removed sessions in the folder"
    for needle in kept:  # the search finds what is there
        assert _holders(folder, [needle]), "a live session's bytes are not in the folder"
    assert len(_packs(folder)) == 1
    assert_tidy(folder, then)
    mem.close()
    assert _holders(folder, gone) == {}
    same_memory(MemoryIndex.load(folder), oracle, enc, "reloaded")


# ================================================================ 4. forget drops views
def test_forget_conversation_drops_its_views_and_searches_of_it_answer_empty(tmp_path, enc):
    """The cached views of a forgotten conversation (its postings and embeddings) go at
    once, in the writer and in a follower that applies the forget; the others' stay.
    (There is no public view of the cache: its private record is read.)"""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    for cid in ("A", "B", "C"):
        for p in (0, 3, 5):
            _add(mem, cid, p, enc, summary=f"about {cid}")
    mem.checkpoint()
    follower = MemoryIndex.open(folder, readonly=True)
    for m in (mem, follower):
        for cid in ("A", "B", "C"):
            assert m.search(cid, QUERIES, k=3, encoder=enc)[0].session_ids
    now = mem.state()
    version = {cid: now.segments[now.ids[cid]].version for cid in ("A", "B", "C")}
    fst = follower.state()
    f_version = {cid: fst.segments[fst.ids[cid]].version for cid in ("A", "B", "C")}
    assert version["B"] in mem._cache.depends_on()
    assert f_version["B"] in follower._cache.depends_on()
    views = mem._cache.stats()["views"]

    mem.forget_conversation("B")
    assert version["B"] not in mem._cache.depends_on(), "the forgotten conversation's " \
                                                        "views are still cached"
    assert {version["A"], version["C"]} <= mem._cache.depends_on()  # the others' kept
    assert mem._cache.stats()["views"] < views
    _no_stale_views(mem, "writer")
    assert [c.id for c in mem.conversations] == ["A", "C"]
    for r in mem.search("B", QUERIES, k=3, encoder=enc):
        assert r.session_ids == [] and r.scores == []
    assert follower.refresh() == 1  # the follower applies the forget the same way
    assert f_version["B"] not in follower._cache.depends_on()
    assert {f_version["A"], f_version["C"]} <= follower._cache.depends_on()
    _no_stale_views(follower, "follower")
    for r in follower.search("B", QUERIES, k=3, encoder=enc):
        assert r.session_ids == []
    follower.close()
    mem.close()


# ================================================================ 5. a follower writes nothing
def test_a_read_only_follower_writes_nothing_to_the_folder(tmp_path, enc):
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    for p in (0, 3):
        _add(mem, "A", p, enc)
    mem.checkpoint()
    _add(mem, "A", 5, enc)  # in the log only: the follower replays it
    _add(mem, "B", 6, enc)
    before = _snapshot(folder)
    follower = MemoryIndex.open(folder, readonly=True)
    assert [c.id for c in follower.conversations] == ["A", "B"]
    assert follower.search("A", QUERIES, k=3, encoder=enc)[0].session_ids
    assert follower.refresh() == 0
    follower.close()
    assert _snapshot(folder) == before, "a read-only follower changed the folder"
    mem.close()
    # the writer gone (no lock held): a follower that reloads, then closes
    before = _snapshot(folder)
    follower = MemoryIndex.open(folder, readonly=True)
    assert follower.refresh() == 0
    follower.close()
    follower.close()
    assert _snapshot(folder) == before, "a read-only follower changed the folder"


# ================================================================ 6. following across reloads
def test_a_follower_keeps_following_after_a_reload(tmp_path, enc):
    """Writer adds a; the follower opens; writer adds b, checkpoints, adds c: the
    follower's refresh reads the newer commit (-1) and holds a, b, c; then every later
    refresh applies what was logged since (counted), across a second reload and across
    full commits (``compact()``: the packs the follower read are gone), as a fresh
    in-RAM memory given the same operations holds it."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    oracle = _fresh(enc)

    def both(f):
        f(mem)
        f(oracle)

    def check(got, what):
        same_memory(follower, oracle, enc, what)
        _no_stale_views(follower, what)
        assert got == want, f"{what}: refresh() returned {got}, expected {want}"

    both(lambda m: _add(m, "A", 0, enc, metadata={"who": "a"}))
    follower = MemoryIndex.open(folder, readonly=True)
    same_memory(follower, oracle, enc, "opened")
    both(lambda m: _add(m, "A", 3, enc))  # b
    mem.checkpoint()
    both(lambda m: _add(m, "B", 5, enc))  # c
    want = -1
    check(follower.refresh(), "first reload")
    both(lambda m: _add(m, "A", 6, enc))  # d
    both(lambda m: m.remove_session("A", "s1"))
    want = 2
    check(follower.refresh(), "after the reload")
    want = 0
    check(follower.refresh(), "nothing new")
    both(lambda m: _add(m, "C", 2, enc, sid="c1"))
    mem.checkpoint()
    both(lambda m: _add(m, "C", 0, enc, sid="c2"))
    want = -1
    check(follower.refresh(), "second reload")
    both(lambda m: m.forget_conversation("B"))
    both(lambda m: _add(m, "A", 1, enc, sid="e", metadata={"who": "e"}))
    both(lambda m: m.remove_session("C", "c1"))
    want = 3
    check(follower.refresh(), "after the second reload")
    packs = _packs(folder)
    assert mem.compact() == 3  # s1 of A, c1 of C, s4 of B: a full commit
    assert not packs & _packs(folder)
    want = -1
    check(follower.refresh(), "after a compaction")
    both(lambda m: _add(m, "B", 7, enc))
    both(lambda m: m.replace_session("A", Session("e", "2023-09-09", POOL[2].turns),
                                     encoder=enc, summary="r", keywords="k"))
    want = 2
    check(follower.refresh(), "after the compaction")
    both(lambda m: m.add_sessions("D", [POOL[0], POOL[3]], encoder=enc,
                                  summaries=["u1", "u2"], keywords=["k1", "k2"]))
    packs = _packs(folder)
    mem.compact()  # nothing to drop: still a full commit
    assert not packs & _packs(folder)
    both(lambda m: m.remove_session("D", "s1"))
    want = -1
    check(follower.refresh(), "after a second compaction")
    mem.close()  # a commit on close: one more reload
    want = -1
    check(follower.refresh(), "after the writer closed")
    follower.close()


def test_a_state_taken_before_a_refresh_reads_as_it_was(tmp_path, enc):
    """``refresh()`` publishes a new state (records applied, or the writer's newer commit
    read): a reader that took the follower's state before reads that state whole (its
    views are of that state's segments, not the current ones cached since), while the
    follower's current state is the writer's."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "A", 0, enc)
    _add(mem, "A", 3, enc)
    mem.checkpoint()
    follower = MemoryIndex.open(folder, readonly=True)
    for p, how in ((5, "records"), (6, "commit")):
        before = follower.state()
        ids = list(follower.conversations[0].session_ids)
        v = follower.view(["A"])  # cached
        rows = v.gran[v.row_slot].clone()
        _add(mem, "A", p, enc)
        if how == "commit":
            mem.checkpoint()
        assert follower.refresh() == (1 if how == "records" else -1)
        now = follower.view(["A"])  # the current view, cached
        assert now.conversations[0].session_ids == _ids(mem)["A"], how
        old = follower.view(["A"], state=before)
        assert old.conversations[0].session_ids == ids, f"{how}: the state read before " \
            "the refresh reads as the current one"
        assert torch.equal(old.gran[old.row_slot], rows), how
        _no_stale_views(follower, how)
    follower.close()
    mem.close()


# ================================================================ 7. atomic batches
def test_a_batch_with_one_bad_session_changes_nothing(tmp_path, enc):
    """Every session of ``add_sessions`` is checked before any is added: a date the
    memory cannot read in the second session refuses the batch, and neither the memory
    nor the folder's log holds the first one."""
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    _add(mem, "A", 0, enc)
    lsn = mem.storage_stats()["lsn"]
    good, bad = POOL[1], Session(POOL[2].id, "the day after never", POOL[2].turns)
    with pytest.raises(ValueError, match="date"):
        mem.add_sessions("A", [good, bad], encoder=enc)
    assert [s["id"] for s in mem.sessions("A")] == [POOL[0].id]
    assert mem.storage_stats()["lsn"] == lsn
    mem.close()


def test_a_batch_is_one_record_and_a_crash_leaves_all_of_it_or_none(tmp_path, enc, caplog):
    """``add_sessions`` of three sessions is one record of the log (its three
    operations together); a writer killed after it returned reopens with all three, one
    killed while the record was being written (the record cut anywhere) with none,
    never one or two."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "A", 0, enc, summary="first")
    mem.checkpoint()
    lsn = f4.root(folder)["lsn"]
    batch = [_secret(i) for i in range(3)]
    kw = dict(summaries=[f"vault {i}" for i in range(3)], keywords=["vault"] * 3,
              metadata=[{"i": i} for i in range(3)])
    mem.add_sessions("A", batch, encoder=enc, **kw)
    mem.abandon()  # killed right after it returned: the batch is in the log only
    records = [r for r in f4.log_records(folder) if r[0] > lsn]
    assert len(records) == 1, f"a batch of three is {len(records)} records"
    ops = f4.record_ops(records[0][2])
    assert [(o["op"], o["conversation"], o["session"]["id"]) for o in ops] == \
        [("add", "A", "x0"), ("add", "A", "x1"), ("add", "A", "x2")]
    oracle = _fresh(enc)
    _add(oracle, "A", 0, enc, summary="first")
    for s, u, k, md in zip(batch, kw["summaries"], kw["keywords"], kw["metadata"]):
        oracle.add_session("A", s, encoder=enc, summary=u, keywords=k, metadata=md)

    whole = tmp_path / "whole"
    shutil.copytree(folder, whole)
    back = MemoryIndex.open(whole, encoder=enc)
    assert back.recovery["replayed"] == 1
    same_memory(back, oracle, enc, "the whole record")
    back.close()

    log = max(f4.log_files(folder).items())[1]
    end = log.stat().st_size
    start = end - f4.RECORD_HEADER - len(records[0][2])
    assert start >= f4.LOG_HEADER
    for i, cut in enumerate((start + 3, start + f4.RECORD_HEADER,
                             start + f4.RECORD_HEADER + (end - start) // 2, end - 1)):
        torn = tmp_path / f"torn{i}"
        shutil.copytree(folder, torn)
        with open(torn / "wal" / log.name, "r+b") as f:
            f.truncate(cut)
        caplog.clear()
        with caplog.at_level("WARNING"):
            back = MemoryIndex.open(torn, encoder=enc)
        assert back.recovery["replayed"] == 0, cut
        assert _ids(back) == {"A": ["s1"]}, f"a record cut at {cut - start} of " \
            f"{end - start} bytes left part of the batch"
        assert [r for r in caplog.records if r.levelname == "WARNING"], "no warning"
        back.close()


def test_a_batch_encodes_its_new_sessions_in_one_encoder_call_each_text_once(tmp_path, enc):
    """``add_sessions`` encodes the texts of its new sessions together: one encoder
    call for the batch, each distinct text once (two sessions sharing a turn and a
    summary send them once), none of a session another conversation holds (shared,
    not encoded again); the memory equals ``add_session`` of each in order."""
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    _add(mem, "held", 0, enc, summary="held", keywords="held")
    common = "[Ann]: we met at the harbour again"
    news = [Session(f"n{i}", "2023-06-02", (f"[Zed]: orchard {i} is ripe", common))
            for i in range(3)]
    batch = [news[0], Session(POOL[0].id, "2023-06-01", POOL[0].turns), *news[1:]]
    kw = dict(summaries=["the orchard", "held", "the orchard", "the harbour"],
              keywords=["fruit", "held", "fruit", "sea"])
    calls = []
    real = enc.encode

    def counting(texts, *a, **k):
        calls.append(list(texts))
        return real(texts, *a, **k)

    with mock.patch.object(enc, "encode", side_effect=counting):
        mem.add_sessions("B", batch, encoder=enc, **kw)
    assert len(calls) == 1, f"{len(calls)} encoder calls for one batch"
    sent = calls[0]
    assert len(sent) == len(set(sent)), "a text was sent twice"
    for s, u, k in zip(batch, kw["summaries"], kw["keywords"]):
        for t in (s.text, *s.turns, u, k):
            assert (t in sent) == (s.id != POOL[0].id), (s.id, t)
    assert sent.count(common) == 1 and "[Zed]: orchard 2 is ripe" in sent
    oracle = _fresh(enc)
    _add(oracle, "held", 0, enc, summary="held", keywords="held")
    for s, u, k in zip(batch, kw["summaries"], kw["keywords"]):
        oracle.add_session("B", s, encoder=enc, summary=u, keywords=k)
    same_memory(mem, oracle, enc, "a batch against single adds")
    assert mem.storage_stats()["lsn"] == 2
    mem.close()


def _batch(i: int, name: str, shared: bool = False) -> tuple:
    """Session ``name``+``i`` of its own texts (``shared``: added to the conversation
    "held" first), and its summary and keywords."""
    tag = f"held {i}" if shared else f"{name} {i}"
    return (Session(f"{name}{i}", "2023-06-01",
                    (f"[Ann]: the {tag} apples are ripe in orchard {i}",)),
            f"about {tag}", f"kw {tag}")


def test_two_threads_adding_overlapping_batches_one_wins_whole_the_other_leaves_nothing(
        tmp_path, enc):
    """Two threads add ``[a, b]`` and ``[b, c]`` to one conversation at once (30 times,
    then twice ``[b, c]`` first for sure; ``a`` a new session, or one another
    conversation holds): exactly one batch is there
    entirely and the other is refused (``b``: already there) leaving nothing: no slot,
    no reference (the store's counts equal the rows using each slot), no record; after
    forgetting the conversation that held a refused ``a`` and compacting, no file holds
    it. The memory equals fresh builds of the model's sessions, before and after a
    crash."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    model, oracle = Model(), Oracle(enc)
    wins = {"ab": 0, "bc": 0}
    writes = 0
    refused_shared = []

    def add(cid, items):
        nonlocal writes
        mem.add_sessions(cid, [s for s, _, _ in items], encoder=enc,
                         summaries=[u for _, u, _ in items], keywords=[k for _, _, k in items])
        for s, u, k in items:
            model.add(cid, s, s.date, u, k)
        writes += 1

    lsn = f4.root(folder)["lsn"]
    for i in range(32):
        shared = i % 2 == 1
        a, b, c = _batch(i, "a", shared), _batch(i, "b"), _batch(i, "c")
        if shared:
            add("held", [a])
        cid = f"t{i}"
        barrier = threading.Barrier(2)
        out: dict = {}
        rng = random.Random(i)
        delays = {"ab": rng.uniform(0, 0.004), "bc": rng.uniform(0, 0.004)}

        def go(name, items, race=True):
            if race:
                barrier.wait()
                time.sleep(delays[name])
            try:
                mem.add_sessions(cid, [s for s, _, _ in items], encoder=enc,
                                 summaries=[u for _, u, _ in items],
                                 keywords=[k for _, _, k in items])
                out[name] = None
            except ValueError as e:
                out[name] = e

        batches = {"ab": [a, b], "bc": [b, c]}
        if i < 30:
            threads = [threading.Thread(target=go, args=(n, batches[n])) for n in batches]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:  # both orders for sure: [b, c] first, then [a, b] refused after its a
            go("bc", batches["bc"], race=False)
            go("ab", batches["ab"], race=False)
        won = [n for n, e in out.items() if e is None]
        assert len(won) == 1, f"repetition {i}: {out}"
        lost = "bc" if won == ["ab"] else "ab"
        assert f"already has a session 'b{i}'" in str(out[lost]), out[lost]
        assert _ids(mem)[cid] == [s.id for s, _, _ in batches[won[0]]], i
        for s, u, k in batches[won[0]]:
            model.add(cid, s, s.date, u, k)
        writes += 1
        wins[won[0]] += 1
        if shared and lost == "ab":
            refused_shared.append(a[0].turns[0].encode())
        check_bookkeeping(mem, model)  # no reference or slot the refused batch took
    assert wins["bc"] and refused_shared, wins
    n_contents = len({e.content for es in model.convs.values() for e in es})
    assert mem.state().tables.n_slots == n_contents, "a refused batch left a slot"
    assert len([r for r in f4.log_records(folder) if r[0] > lsn]) == writes, \
        "a refused batch left a record"
    check_contents(mem, model, oracle, search=False)
    mem.abandon()
    mem = MemoryIndex.open(folder, encoder=enc)
    check_contents(mem, model, oracle, search=False)
    mem.forget_conversation("held")
    model.forget("held")
    mem.compact()
    assert _holders(folder, refused_shared) == {}, "a refused batch kept a session alive"
    assert_tidy(folder, "compacted")
    mem.close()


# ================================================================ 8. replacing a session
def test_replace_session_equals_a_build_with_the_session_replaced_in_place(tmp_path, enc):
    """``replace_session`` leaves the memory a build of the conversation with the new
    session where the old one was (ids, dates, metadata, embeddings, texts, graph edges,
    BM25 documents, searches, against fresh builds); a session the old content shared
    with another conversation is kept for it; the write is one record, replayed after a
    crash; the old content leaves the folder at the next compaction."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    model, oracle = Model(), Oracle(enc)

    def add(cid, p, d, u, k, md=None):
        s = Session(POOL[p].id, DATES[d], POOL[p].turns)
        mem.add_session(cid, s, encoder=enc, summary=SUMMARIES[u], keywords=KEYWORDS[k],
                        metadata=md)
        model.add(cid, s, DATES[d], SUMMARIES[u], KEYWORDS[k])

    def replace(m, cid, session, u, k, md=None):
        m.replace_session(cid, session, encoder=enc, summary=u, keywords=k, metadata=md)
        uu, kk = resolved_texts(session, u, k)
        entries = model.convs[cid]
        j = [e.session.id for e in entries].index(session.id)
        entries[j] = Entry(session, session.date, uu, kk)

    add("A", 0, 0, 1, 1, {"n": 1})
    add("A", 3, 1, 0, 0)
    add("A", 5, 2, 2, 2, {"n": 3})
    add("A", 6, 3, 1, 2)
    add("B", 3, 1, 0, 0)  # B's s2: the content A's s2 has (one slot for both)
    mem.checkpoint()
    lsn = f4.root(folder)["lsn"]
    new_s2 = Session("s2", DATES[2], POOL[7].turns)
    replace(mem, "A", new_s2, SUMMARIES[2], KEYWORDS[2], {"v": 2})
    check_contents(mem, model, oracle)
    assert [s["id"] for s in mem.sessions("A")] == ["s1", "s2", "s4", "s5"]
    assert [s["metadata"] for s in mem.sessions("A")] == [{"n": 1}, {"v": 2}, {"n": 3}, {}]
    assert mem.get_session("A", "s2")["turns"] == list(POOL[7].turns)
    assert mem.get_session("B", "s2")["turns"] == list(POOL[3].turns)
    records = [r for r in f4.log_records(folder) if r[0] > lsn]
    assert [[(o["op"], o["conversation"], o["session"]["id"]) for o in f4.record_ops(p)]
            for _, _, p in records] == [[("replace", "A", "s2")]]
    with pytest.raises(KeyError):
        mem.replace_session("A", Session("zz", "", ("[X]: no such session",)), encoder=enc)
    with pytest.raises(KeyError):
        mem.replace_session("nobody", new_s2, encoder=enc)
    mem.abandon()  # killed: the replacement is in the log only

    back = MemoryIndex.open(folder, encoder=enc)
    assert back.recovery["replayed"] == 1
    check_contents(back, model, oracle)
    assert [s["metadata"] for s in back.sessions("A")] == [{"n": 1}, {"v": 2}, {"n": 3}, {}]
    # the first and the last sessions, the second with B's content of s2 (shared)
    old_s1 = POOL[0].turns[1].encode()  # "Rex sounds adorable": only A's s1 has it
    replace(back, "A", Session("s1", DATES[1], _secret(5).turns), "zed", "code")
    replace(back, "A", Session("s5", DATES[0], POOL[2].turns), None, None)
    replace(back, "A", Session("s2", DATES[1], POOL[3].turns), SUMMARIES[0], KEYWORDS[0])
    check_contents(back, model, oracle)
    assert _holders(folder, [old_s1])  # in the folder until a compaction
    back.compact()
    assert _holders(folder, [old_s1]) == {}
    assert _holders(folder, [POOL[3].turns[1].encode()])  # shared: kept
    back.close()
    check_contents(MemoryIndex.load(folder), model, oracle)


# ================================================================ 9. readers while writing
def _plan(n: int) -> list:
    """Writes in order: adds to three conversations, removes, a forget, compactions
    (full commits) and checkpoints."""
    plan, held = [], {"A": [], "B": [], "C": []}
    for i in range(n):
        cid = "ABC"[i % 3]
        if i % 4 == 3:
            plan.append(("compact",))
        elif i % 7 == 6 and held[cid]:
            plan.append(("remove", cid, held[cid].pop(0)))
        elif i == n // 2:
            plan.append(("forget", "B"))
            held["B"] = []
        elif i % 5 == 4:
            plan.append(("checkpoint",))
        else:
            sid = f"w{i}"
            held[cid].append(sid)
            plan.append(("add", cid, sid))
    return plan


def _apply(state: dict, op) -> dict:
    state = {c: list(v) for c, v in state.items()}
    if op[0] == "add":
        state.setdefault(op[1], []).append(op[2])
    elif op[0] == "remove":
        state[op[1]].remove(op[2])
    elif op[0] == "forget":
        state.pop(op[1])
    return state


def test_readers_in_threads_never_fail_and_see_a_prefix_of_the_acknowledged_writes(tmp_path,
                                                                                   enc):
    """While the writer writes, commits (every few kB of log) and compacts (full commits
    removing packs), a thread loading the folder in a loop and a follower refreshing in
    a loop never raise, and each read holds the writes 1..k for a k from the writes
    acknowledged when the read started to those started when it ended (a follower's k
    never goes back)."""
    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=4096)
    plan = _plan(60)
    states = [{}]
    for op in plan:
        states.append(_apply(states[-1], op))
    acked, started = [0], [0]
    stop = threading.Event()
    errors: list = []
    reads = {"load": 0, "follower": 0, "reloads": 0}

    def prefix(state, lo, hi, what):
        ks = [k for k in range(lo, hi + 1) if states[k] == state]
        assert ks, f"{what}: {state} is no state of writes {lo} to {hi}"
        return ks

    def loader():
        try:
            while not stop.is_set():
                lo = acked[0]
                m = MemoryIndex.load(folder)
                prefix(_ids(m), lo, started[0], "load")
                reads["load"] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    def follower():
        try:
            lo = acked[0]
            f = MemoryIndex.open(folder, readonly=True)
            last = min(prefix(_ids(f), lo, started[0], "open(readonly=True)"))
            while not stop.is_set():
                lo = acked[0]
                n = f.refresh()
                ks = [k for k in prefix(_ids(f), lo, started[0], "refresh()") if k >= last]
                assert ks, f"the follower went back from write {last}"
                last = ks[0]
                reads["follower"] += 1
                reads["reloads"] += n == -1
            f.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=loader), threading.Thread(target=follower)]
    for t in threads:
        t.start()
    try:
        for i, op in enumerate(plan):
            started[0] = i + 1
            if op[0] == "add":
                mem.add_session(op[1], _secret(i, sid=op[2]), encoder=enc, summary="u",
                                keywords="k")
            elif op[0] == "remove":
                mem.remove_session(op[1], op[2])
            elif op[0] == "forget":
                mem.forget_conversation(op[1])
            else:
                getattr(mem, op[0])()
            acked[0] = i + 1
            if errors:
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, f"a reader failed: {errors[0]!r}"
    assert reads["load"] >= 2 and reads["follower"] >= 2 and reads["reloads"], reads
    assert _ids(MemoryIndex.load(folder)) == states[-1] == _ids(mem)
    mem.close()


@pytest.mark.parametrize("reader", ["load", "open", "refresh"])
@pytest.mark.parametrize("race", ["pack removed", "log truncated"])
def test_a_reader_whose_commit_or_log_a_writer_replaced_reads_again(tmp_path, enc,
                                                                    monkeypatch, reader,
                                                                    race):
    """A reader reads the pointer, the blobs, then the log. The writer's full commit
    between the pointer and the blobs (the pack it read removed), or its checkpoint
    between the blobs and the log (the records it needed removed), makes it read again
    from the new pointer (``load``, ``open(readonly=True)``, ``refresh()``): it returns
    the writer's memory, it does not raise."""
    from memgas_gpu.memory import durable
    from memgas_gpu.storage import folder as storage_folder
    from memgas_gpu.storage.log import WriteAheadLog

    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "A", 0, enc)
    _add(mem, "A", 3, enc)
    mem.checkpoint()
    _add(mem, "B", 5, enc)  # in the log
    follower = MemoryIndex.open(folder, readonly=True) if reader == "refresh" else None
    if reader == "refresh" and race == "pack removed":
        mem.checkpoint()  # the pointer moved: refresh() reads the new commit
    fired = []

    def writer_moves_on():
        fired.append(1)
        _add(mem, "C", 6, enc, sid=f"c{len(fired)}")
        if race == "pack removed":
            mem.compact()
        else:
            mem.checkpoint()

    if race == "pack removed":
        real = storage_folder.read_commit

        def read_commit(path, pointer=None):
            if not fired:
                writer_moves_on()
            return real(path, pointer)

        monkeypatch.setattr(storage_folder, "read_commit", read_commit)
    else:
        class Log(WriteAheadLog):
            @staticmethod
            def read(path, after_lsn=0):
                if not fired:
                    writer_moves_on()
                return WriteAheadLog.read(path, after_lsn)

        monkeypatch.setattr(storage_folder, "WriteAheadLog", Log)
        monkeypatch.setattr(durable, "WriteAheadLog", Log)
    if reader == "load":
        got = MemoryIndex.load(folder)
    elif reader == "open":
        got = MemoryIndex.open(folder, readonly=True)
    else:
        assert follower.refresh() == -1
        got = follower
    assert fired, "the writer did not move on while the reader read"
    monkeypatch.undo()
    assert _ids(got) == _ids(mem) == {"A": ["s1", "s2"], "B": ["s4"], "C": ["c1"]}
    same_memory(got, mem, enc, reader)
    mem.close()


# ================================================================ 10. the model-based walk


class FollowedMachine(DurableMachine):
    """The durable walk (adds, shared adds, removes, re-adds, compactions, checkpoints,
    crashes and reopenings; batches, replacements and forgets added here) with a
    read-only follower, and the folder checked after every step:

    * the follower refreshes after every step (across the writer's commits, which make
      it read the newer commit, full commits that remove the packs it read, and the
      writer's crashes and reopenings) and then holds what the model holds: its
      conversations and sessions after every step, everything (embeddings, texts,
      graphs, BM25 documents, searches) in the ``follower_reads`` step; its cache keeps
      no view of a segment it replaced; its ``close()`` changes nothing in the folder
      (``follower_reopens``);
    * the folder holds the commit the pointer names, whole (its root readable, every
      blob it names there, CRC-32 checked), the packs the root lists and no other,
      each of exactly its committed length, no temporary file (``assert_tidy``); after
      ``compact()``, one pack, and no embedding row or turn text of a removed session
      (one no conversation holds any more) in any file of it;
    * a batch that is refused (a session id the conversation holds, or twice in it)
      changes nothing (the bookkeeping invariant checks the store's counts).

    The automatic compaction's floor is lowered (2 instead of 64 removed sessions) so
    that the walk reaches it too."""

    def __init__(self) -> None:
        super().__init__()
        self.follower = MemoryIndex.open(self.folder, readonly=True)
        self.seen_rows: set = set()  # every embedding row (bytes) the store has held
        self.seen_texts: set = set()  # every turn text added

    def teardown(self) -> None:
        self.follower.close()
        super().teardown()

    # the steps of the walk that do not involve the folder are left to test_memory_model
    def failed_add(self, *a, **k): ...

    def save_and_load(self): ...

    def remember_state(self): ...

    def read_remembered_state(self): ...

    def clear_cache(self): ...

    @rule(cid=st.sampled_from(CONVERSATIONS))
    def forget(self, cid):
        """Forget a conversation (with a few sessions it may take the removed sessions
        past the automatic compaction's line)."""
        if cid not in self.model.convs:
            with pytest.raises(KeyError, match="no conversation"):
                self.mem.forget_conversation(cid)
            return
        self.mem.forget_conversation(cid)
        self.model.forget(cid)
        self.compacted = False
        for r in self.mem.search(cid, QUERIES[:1], encoder=self.enc):
            assert r.session_ids == []

    @rule(cid=st.sampled_from(CONVERSATIONS),
          ps=st.lists(st.integers(0, len(POOL) - 1), min_size=2, max_size=3),
          d=st.integers(0, len(DATES) - 1), u=st.integers(0, len(SUMMARIES) - 1),
          k=st.integers(0, len(KEYWORDS) - 1))
    def add_batch(self, cid, ps, d, u, k):
        """``add_sessions``: all of them, or (an id twice, or one the conversation
        holds) none."""
        sessions = [Session(POOL[p].id, DATES[d], POOL[p].turns) for p in ps]
        ids = [s.id for s in sessions]
        n = len(sessions)
        kw = dict(summaries=[SUMMARIES[u]] * n, keywords=[KEYWORDS[k]] * n, encoder=self.enc)
        if len(set(ids)) < n or any(self.model.has(cid, x) for x in ids):
            before = self.mem.state()
            with pytest.raises(ValueError, match="appears twice|already has a session"):
                self.mem.add_sessions(cid, sessions, **kw)
            assert self.mem.state() is before, "a refused batch published a state"
            return
        self.mem.add_sessions(cid, sessions, **kw)
        for s in sessions:
            self.model.add(cid, s, DATES[d], SUMMARIES[u], KEYWORDS[k])
        self.compacted = False

    @rule(cid=st.sampled_from(CONVERSATIONS), i=st.integers(0, 7),
          p=st.integers(0, len(POOL) - 1), d=st.integers(0, len(DATES) - 1),
          u=st.integers(0, len(SUMMARIES) - 1), k=st.integers(0, len(KEYWORDS) - 1))
    def replace(self, cid, i, p, d, u, k):
        """Replace a session (in its place) by another pool session's turns, date and
        texts under its id."""
        entries = self.model.convs.get(cid)
        if not entries:
            with pytest.raises(KeyError):
                self.mem.replace_session(cid, Session("s1", DATES[d], POOL[p].turns),
                                         encoder=self.enc)
            return
        j = i % len(entries)
        s = Session(entries[j].session.id, DATES[d], POOL[p].turns)
        self.mem.replace_session(cid, s, summary=SUMMARIES[u], keywords=KEYWORDS[k],
                                 encoder=self.enc)
        uu, kk = resolved_texts(s, SUMMARIES[u], KEYWORDS[k])
        entries[j] = Entry(s, DATES[d], uu, kk)
        self.compacted = False

    @rule()
    def follower_reads(self):
        """Everything the follower holds against fresh builds of the model's sessions."""
        check_contents(self.follower, self.model, self.oracle, search=True,
                       methods={"memgas": dict(method="memgas")})

    @rule()
    def follower_reopens(self):
        before = _snapshot(self.folder)
        self.follower.close()
        assert _snapshot(self.folder) == before, "a follower's close() changed the folder"
        self.follower = MemoryIndex.open(self.folder, readonly=True)

    @rule()
    def compact(self):
        packs = _packs(self.folder)
        self.mem.compact()
        self.compacted = True
        assert_full_commit(self.folder, packs, "compact()")
        t = self.mem.state().tables
        live_rows = {t.gran[s].numpy().tobytes() for s in range(t.n_slots)}
        live_texts = "\n".join(t.turn_text.strings(range(int(t.turn_ptr[t.n_slots]))))
        gone = sorted(self.seen_rows - live_rows)
        gone += [x.encode() for x in sorted(self.seen_texts) if x not in live_texts]
        assert _holders(self.folder, gone) == {}, \
            "compact() left removed sessions' bytes in the folder"

    @invariant()
    def the_folder_is_tidy(self):
        assert_tidy(self.folder, "after a step")
        now = self.mem.state()
        for seg in now.segments:
            for slot in seg.slots.tolist():
                self.seen_rows.add(now.tables.gran[slot].numpy().tobytes())
        for entries in self.model.convs.values():
            self.seen_texts.update(t for e in entries for t in e.session.turns)

    @invariant()
    def equals_the_model(self):
        """The writer against the model (contents without searches: the follower and
        test_memory_model search), then the follower, refreshed, against the writer and
        the model."""
        check_bookkeeping(self.mem, self.model, compacted=self.compacted)
        check_contents(self.mem, self.model, self.oracle, search=False)
        n = self.follower.refresh()
        assert n >= -1
        f = self.follower
        assert sorted(c.id for c in f.conversations) == sorted(self.model.convs)
        for cid, entries in self.model.convs.items():
            assert [(s["id"], s["date"]) for s in f.sessions(cid)] == \
                [(e.session.id, e.date) for e in entries], cid
            assert f.sessions(cid) == self.mem.sessions(cid), cid
            for e in entries:
                assert f.get_session(cid, e.session.id) == \
                    self.mem.get_session(cid, e.session.id), (cid, e.session.id)
        _no_stale_views(f, "follower")
        assert f.refresh() == 0, "a second refresh found more to apply"


_QUICK = settings(max_examples=10, stateful_step_count=20, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), print_blob=True, database=None,
                  phases=[Phase.explicit, Phase.generate])
_LONG = settings(max_examples=60, stateful_step_count=40, deadline=None,
                 suppress_health_check=list(HealthCheck), print_blob=True)


def _walk(config) -> None:
    _oracle()
    with mock.patch("memgas_gpu.memory.store.COMPACT_MIN_GARBAGE", 2):
        run_state_machine_as_test(FollowedMachine, settings=config)


def test_a_followed_durable_memory_equals_its_model():
    """A short, reproducible walk (the default suite)."""
    _walk(_QUICK)


@pytest.mark.slow
def test_a_followed_durable_memory_equals_its_model_long():
    _walk(_LONG)
