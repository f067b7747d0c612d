"""The order of a durable memory's file calls, asserted from the outside: every write,
fsync, rename and unlink under the memory's folder is recorded (tests/_fsrecord.py)
and checked against docs/index-format.md ("Commits", "The log", "Recovery"):

* a write's record is written to ``wal/*.log`` and that file fsync'd before
  ``add_session`` / ``add_sessions`` / ``replace_session`` / ``remove_session`` /
  ``forget_conversation`` returns (and a power loss right after the return keeps it);
  ``add_sessions`` is one record;
* recovery fsyncs the last log file before it replays a record or writes a commit;
* a commit appends its blobs to a pack and fsyncs it (a new pack: ``data/`` fsync'd
  too) before it replaces the pointer ``manifest.json`` (a temporary file, fsync'd,
  renamed); it fsyncs the folder after that replacement and before it unlinks any log
  file (then fsyncs ``wal/``);
* a full commit (``compact()``, ``save``) unlinks the packs it replaced only after the
  pointer names the new one, and fsyncs ``data/`` after;
* a new folder's entry is fsync'd in its parent before the first write is
  acknowledged;
* a commit after a reopen appends what changed (one conversation: its segment, at most
  one store chunk, its directory leaf and page, and the root: read through
  tests/_format4.py, nothing else).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

import _format4 as f4
from _fsrecord import FSRecorder
from _memory_model import DATES, POOL, tiny_encoder
from memgas_gpu import Dataset, Session
from memgas_gpu.retrieve import MemoryIndex

pytest.importorskip("Stemmer")

SECRET = "[Zed]: my locker code is 7361-ALPHA-ORCHID"


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster on a shared machine
    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("bert"))  # tiny_encoder's model folder
    try:
        e = tiny_encoder()
    finally:
        tempfile.tempdir = old
    yield e
    torch.set_num_threads(threads)


def _add(mem, cid, p, enc, date=1, summary=None, **kw):
    s = POOL[p]
    mem.add_session(cid, Session(s.id, DATES[date], s.turns), encoder=enc,
                    summary=summary or f"summary {p}", keywords=f"keywords {p}", **kw)


def _secret(mem, cid, enc):
    mem.add_session(cid, Session("secret", "2023-06-01", (SECRET,)), encoder=enc,
                    summary="zed locker", keywords="locker")


def _folder(tmp_path: Path) -> Path:
    """The memory's folder, made before recording (its own entry is durable)."""
    folder = tmp_path / "m"
    folder.mkdir()
    return folder


def _names(folder: Path, pattern: str) -> set:
    return {p.relative_to(folder).as_posix() for p in folder.glob(pattern)}


def _packs(folder: Path) -> set:
    """The packs in ``data/`` (relative paths)."""
    return _names(folder, "data/*.pack")


def _holders(folder: Path, needle: bytes) -> list:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and needle in p.read_bytes())


# ---------------------------------------------------------------------------- the checker
def commit_problems(rec: FSRecorder, start: int, stop: int, old: set) -> list[str]:
    """What breaks the documented order in the one commit recorded in
    ``events[start:stop]`` (paths relative to the memory's folder; ``old``: the packs
    in ``data/`` before it)."""
    ev, bad = rec.events, []
    pointer = rec.find("rename", "*", "manifest.json", start=start, stop=stop)
    if len(pointer) != 1:
        return [f"the pointer was replaced {len(pointer)} times"]
    p = pointer[0]
    tmp = ev[p].path
    if not rec.find("fsync", tmp, "file", start=start, stop=p):
        bad.append(f"the pointer's new file {tmp} was not fsync'd before it replaced it")
    # the blobs: appended to packs, each pack fsync'd after its last write, before p
    writes = rec.find("write", "data/*", start=start, stop=stop)
    if not writes:
        bad.append("no blob was written")
    for path in sorted({ev[i].path for i in writes}):
        last = rec.last("write", path, start=start, stop=stop)
        if last > p:
            bad.append(f"{path} was written after the pointer was replaced")
        elif not rec.find("fsync", path, "file", start=last + 1, stop=p):
            bad.append(f"{path} was not fsync'd after its last write, before the pointer")
    for i in rec.find("open", "data/*.pack", "create", start=start, stop=stop):
        if i > p or not rec.find("fsync", "data", "dir", start=i + 1, stop=p):
            bad.append(f"{ev[i].path} is new, and data/ was not fsync'd before the pointer "
                       "named it")
    # after the pointer: the folder fsync'd before any log file or pack is unlinked
    folder_sync = rec.first("fsync", ".", "dir", start=p + 1, stop=stop)
    if folder_sync is None:
        bad.append("the folder was not fsync'd after the pointer was replaced")
    for i in rec.find("unlink", "wal/*.log", start=start, stop=stop):
        if folder_sync is None or i < folder_sync:
            bad.append(f"{ev[i].path} was unlinked before the folder was fsync'd after the "
                       "pointer replacement")
    logs_gone = rec.find("unlink", "wal/*.log", start=start, stop=stop)
    if logs_gone and not rec.find("fsync", "wal", "dir", start=logs_gone[-1] + 1, stop=stop):
        bad.append("wal/ was not fsync'd after log files were unlinked")
    # the replaced packs: unlinked only after the pointer, then data/ fsync'd
    gone = rec.find("unlink", "data/*.pack", start=start, stop=stop)
    for i in gone:
        if ev[i].path not in old:
            bad.append(f"{ev[i].path} (a pack the commit made) was unlinked")
        if i < p or folder_sync is None or i < folder_sync:
            bad.append(f"{ev[i].path} (a replaced pack) was unlinked before the pointer "
                       "naming the new one was durable")
    if gone and not rec.find("fsync", "data", "dir", start=max(gone) + 1, stop=stop):
        bad.append("data/ was not fsync'd after the replaced packs were unlinked")
    return bad


# ---------------------------------------------------------------------------- appends
def _batch(mem, enc):
    mem.add_sessions("C", [Session(POOL[p].id, DATES[2], POOL[p].turns) for p in (5, 6)],
                     encoder=enc, summaries=["summary 5", "summary 6"],
                     keywords=["keywords 5", "keywords 6"])


def test_each_write_is_in_the_log_and_fsynced_before_it_returns(tmp_path, enc):
    folder = _folder(tmp_path)
    with FSRecorder(folder) as rec:
        mem = MemoryIndex.open(folder, encoder=enc)
        writes = [(["add"], lambda: _add(mem, "A", 0, enc, metadata={"k": 1})),
                  (["add"], lambda: _add(mem, "B", 0, enc)),  # shared: no encoding
                  (["add"], lambda: _add(mem, "A", 3, enc)),
                  (["add", "add"], lambda: _batch(mem, enc)),  # one write, one record
                  (["replace"], lambda: mem.replace_session(
                      "A", Session("s2", DATES[3], POOL[7].turns), encoder=enc)),
                  (["remove"], lambda: mem.remove_session("A", "s1")),
                  (["forget"], lambda: mem.forget_conversation("B"))]
        for k, (ops, write) in enumerate(writes, 1):
            start = rec.mark()
            write()
            stop = rec.mark()
            logged = rec.find("write", "wal/*.log", start=start, stop=stop)
            assert logged, f"{ops}: no record was written to the log"
            for path in {rec.events[i].path for i in logged}:
                last = rec.last("write", path, start=start, stop=stop)
                assert rec.find("fsync", path, "file", start=last + 1, stop=stop), \
                    f"{ops}: {path} was not fsync'd after its record, before the write returned"
            # from the outside: a power loss now keeps the record, one per write
            state = rec.power_loss_state(tmp_path / f"power-{k}")
            records = f4.wal_checked(state / "wal")
            assert [lsn for lsn, _, _ in records] == list(range(1, k + 1)), ops
            assert [o["op"] for o in f4.record_ops(records[-1][2])] == ops
        mem.abandon()


def test_recovery_fsyncs_the_last_log_file_before_replaying(tmp_path, enc, monkeypatch):
    folder = _folder(tmp_path)
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "A", 0, enc)
    _batch(mem, enc)
    mem.remove_session("A", "s1")
    mem.abandon()  # killed: three records, no commit
    last = max(_names(folder, "wal/*.log"))
    old = _packs(folder)
    with FSRecorder(folder) as rec:
        apply = MemoryIndex._replay

        def noted(self, ops):
            rec.note("replay")
            return apply(self, ops)

        monkeypatch.setattr(MemoryIndex, "_replay", noted)
        back = MemoryIndex.open(folder, encoder=enc)
        stop = rec.mark()
        back.abandon()
    assert back.recovery["replayed"] == 3
    replays = rec.find("note", "replay")
    assert len(replays) == 3
    synced = rec.first("fsync", last, "file")
    assert synced is not None, f"{last} (the last log file) was never fsync'd"
    assert synced < replays[0], "a record was replayed before the log was fsync'd"
    written = rec.find("write", "data/*") + rec.find("rename", "*", "manifest.json")
    assert written and synced < min(written), "a commit was written before the log was fsync'd"
    assert commit_problems(rec, replays[-1] + 1, stop, old) == []


# ---------------------------------------------------------------------------- commits
def _checkpointed_memory(folder: Path, enc) -> MemoryIndex:
    """A memory with a commit and, after it, log records of every kind."""
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "A", 0, enc)
    _add(mem, "B", 3, enc)
    mem.checkpoint()
    _add(mem, "A", 5, enc)
    _batch(mem, enc)
    mem.replace_session("B", Session("s2", DATES[0], POOL[7].turns), encoder=enc)
    mem.remove_session("A", "s1")
    return mem


def test_a_commit_makes_its_blobs_durable_before_the_pointer_then_drops_the_log(tmp_path,
                                                                               enc):
    folder = _folder(tmp_path)
    mem = _checkpointed_memory(folder, enc)
    old, logs = _packs(folder), _names(folder, "wal/*.log")
    with FSRecorder(folder) as rec:
        mem.checkpoint()
        stop = rec.mark()
        mem.abandon()
    assert commit_problems(rec, 0, stop, old) == []
    unlinked = {rec.events[i].path for i in rec.find("unlink", "wal/*.log")}
    assert unlinked == logs, "the log files the commit covers are unlinked"
    assert not rec.find("unlink", "data/*"), "an incremental commit removes no pack"
    assert f4.root(folder)["lsn"] == 6


def test_a_commit_in_another_process_follows_the_same_order(tmp_path, enc):
    """The first commit of a process after a reopen (the writer read the commit, cut
    what a crashed one appended): the same order."""
    folder = _folder(tmp_path)
    mem = _checkpointed_memory(folder, enc)
    mem.close()
    back = MemoryIndex.open(folder, encoder=enc)
    _add(back, "D", 7, enc)
    old = _packs(folder)
    with FSRecorder(folder) as rec:
        back.close()
    assert commit_problems(rec, 0, rec.mark(), old) == []


@pytest.mark.parametrize("how", ["compact", "save"])
def test_a_full_commit_unlinks_the_replaced_packs_after_the_pointer_then_syncs_data(
        tmp_path, enc, how):
    folder = _folder(tmp_path)
    if how == "compact":
        mem = _checkpointed_memory(folder, enc)
        mem.forget_conversation("B")
    else:
        mem = MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)
        _add(mem, "A", 0, enc)
        _add(mem, "B", 3, enc)
        mem.save(folder)
        mem.forget_conversation("B")
        _add(mem, "A", 5, enc)
    old = _packs(folder)
    assert old
    with FSRecorder(folder) as rec:
        mem.compact() if how == "compact" else mem.save(folder)
        stop = rec.mark()
        power = rec.power_loss_state(tmp_path / "power")
        if how == "compact":
            mem.abandon()
    assert commit_problems(rec, 0, stop, old) == []
    assert {rec.events[i].path for i in rec.find("unlink", "data/*.pack")} == old
    assert not (_packs(folder) & old) and not (_packs(power) & old)
    assert f4.pack_sizes(power) == f4.pack_sizes(folder)
    assert [c.id for c in MemoryIndex.load(power).conversations] == \
        (["A", "C"] if how == "compact" else ["A"])


# ---------------------------------------------------------------------------- compaction
def test_a_compaction_commits_in_order_and_unlinks_the_log_of_removed_sessions(tmp_path,
                                                                              enc):
    folder = _folder(tmp_path)
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "A", 0, enc)
    _add(mem, "B", 3, enc)
    mem.checkpoint()
    _secret(mem, "A", enc)
    _add(mem, "B", 5, enc)
    mem.remove_session("A", "secret")
    holding = [p for p in _holders(folder, SECRET.encode()) if p.startswith("wal/")]
    assert holding, "the log holds the removed session before the compaction"
    old = _packs(folder)
    with FSRecorder(folder) as rec:
        assert mem.compact() == 1
        stop = rec.mark()
        state = rec.power_loss_state(tmp_path / "power")
        mem.abandon()
    assert commit_problems(rec, 0, stop, old) == []
    unlinked = {rec.events[i].path for i in rec.find("unlink", "wal/*.log")}
    assert set(holding) <= unlinked
    # every blob is written again, to a new pack: none of the old ones stays
    assert {rec.events[i].path for i in rec.find("unlink", "data/*")} == old
    # from the outside: neither the folder nor what a power loss leaves holds it
    assert _holders(folder, SECRET.encode()) == []
    assert _holders(state, SECRET.encode()) == []
    assert [c.session_ids for c in MemoryIndex.load(state).conversations] == \
        [["s1"], ["s2", "s4"]]


def test_a_power_loss_after_a_compaction_keeps_no_name_of_a_forgotten_conversation(
        tmp_path, enc):
    folder = _folder(tmp_path)
    mem = MemoryIndex.open(folder, encoder=enc)
    _add(mem, "A", 0, enc)
    _add(mem, "zed-private-7361", 3, enc)
    mem.checkpoint()
    mem.forget_conversation("zed-private-7361")
    with FSRecorder(folder) as rec:
        mem.compact()
        state = rec.power_loss_state(tmp_path / "power")
        mem.abandon()
    assert _holders(folder, b"zed-private-7361") == []
    assert _holders(state, b"zed-private-7361") == []
    assert [c.id for c in MemoryIndex.load(state).conversations] == ["A"]


# ---------------------------------------------------------------------------- a new folder
def test_a_new_folder_is_fsynced_in_its_parent(tmp_path, enc):
    """``open`` of ``parent/a/b/m`` (none of them there): each folder it makes is
    fsync'd in its parent before the first write is acknowledged, so a power loss right
    after that write keeps the memory and the write."""
    parent = tmp_path / "parent"
    parent.mkdir()
    with FSRecorder(parent) as rec:
        mem = MemoryIndex.open(parent / "a" / "b" / "m", encoder=enc)
        _add(mem, "A", 0, enc)  # acknowledged: the folder must survive a power loss
        state = rec.power_loss_state(tmp_path / "power")
        mem.abandon()
    ack = rec.last("fsync", "a/b/m/wal/*.log", "file")
    assert ack is not None
    for made, above in (("a", "."), ("a/b", "a"), ("a/b/m", "a/b")):
        i = rec.first("mkdir", made)
        assert i is not None, f"{made} was made by the open"
        assert rec.find("fsync", above, "dir", start=i + 1, stop=ack), \
            f"{above} was not fsync'd after {made} was made, before the first ack"
    got = MemoryIndex.load(state / "a" / "b" / "m")
    assert [c.session_ids for c in got.conversations] == [["s1"]]


# ---------------------------------------------------------------------------- bytes
def test_a_commit_after_a_reopen_appends_the_changed_conversation_only(tmp_path, enc):
    """Six conversations committed and reopened; one add to c3 and a commit: the bytes
    appended to the pack are exactly c3's new segment, one chunk of its new slot, its
    directory leaf and page, the new slot's reference count (its leaf and the three
    nodes above it), and the root (their refs read through the documented directory
    and tree, laid end to end from the pack's old end to its new one); every other
    conversation's entry is unchanged."""
    folder = _folder(tmp_path)
    mem = MemoryIndex.open(folder, encoder=enc)
    for c in range(6):
        for p in (0, 3, 5):
            _add(mem, f"c{c}", p, enc, summary=f"summary {c}.{p}")  # not shared
    mem.close()
    back = MemoryIndex.open(folder, encoder=enc)
    assert back.recovery["replayed"] == 0
    before, sizes = f4.directory(folder), f4.pack_sizes(folder)
    chunks_before = len(f4.chunks(folder))
    _add(back, "c3", 6, enc)
    with FSRecorder(folder) as rec:
        back.checkpoint()
        back.abandon()
    after, grown = f4.directory(folder), f4.pack_sizes(folder)
    assert sorted(c for c in after if after[c] != before[c]) == ["c3"]
    assert after.keys() == before.keys()
    (pack,) = [k for k in grown if grown[k] != sizes.get(k)]
    root = f4.root(folder)
    on_path = f4.path_of(folder, "c3")
    new = {"root": f4.pointer(folder)["root"], "segment": on_path["segment"],
           "leaf": on_path["leaf"], "page": on_path["page"]}
    assert len(f4.chunks(folder)) == chunks_before + 1, "one chunk of the new slot"
    new["chunk"] = root["chunks"][-1]["ref"]
    slot = root["chunks"][-1]["slots"][0]
    digest = bytes(f4.blob_tensors(folder, new["chunk"])[0]["digest"][0].tolist())
    assert f4.ref_counts(folder)[slot] == (digest.hex(), 1)
    for level, ref in enumerate(f4.ref_path(folder, f4.ref_leaf(digest, slot))):
        new[f"count {level}"] = ref
    laid = sorted(new.items(), key=lambda kv: kv[1][1])
    at = sizes[pack]
    for what, ref in laid:  # end to end: nothing else was appended
        assert ref[0] == pack and ref[1] == at, (what, ref, at, laid)
        at += ref[2]
    assert at == grown[pack], (at, grown[pack], laid)
    written = sum(rec.events[i].detail for i in rec.find("write", "data/*"))
    assert written == grown[pack] - sizes[pack]
    assert f4.tensor_meta(folder, new["segment"])["id"] == "c3"
    assert sum(new[k][2] for k in ("segment", "leaf", "page")) * 3 < \
        sum(grown.values()) - f4.PACK_HEADER
