"""A memory opened on a folder: acknowledged writes survive kill -9, a torn log tail is
dropped with one warning, checkpoints write what changed, forgetting and compacting
delete the bytes, one writer and many readers, and format-2 folders open.

Oracles: the acknowledged operations applied to a fresh in-RAM memory with the same
encoder (compared by sessions, embeddings, graphs, BM25 documents and search results),
the folder's bytes searched for removed texts and embeddings, and file sizes counted
by hand.
"""
from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from memgas_gpu import Dataset, Session
from memgas_gpu.retrieve import MemoryIndex
from memgas_gpu.storage.folder import IndexLockError

pytest.importorskip("Stemmer")

from _child import Child, acknowledged  # noqa: E402
from _memory_model import POOL  # noqa: E402

HERE = Path(__file__).parent
QUESTIONS = ["What breed is Rex?", "When is the violin recital?", "What did Clara bake?"]


@pytest.fixture(scope="module")
def bert(tiny_bert) -> str:
    return tiny_bert


@pytest.fixture(scope="module")
def enc(bert):
    from memgas_gpu.encode import Encoder

    return Encoder(bert, device="cpu", max_length=64)


def _child_apply():
    sys.path.insert(0, str(HERE))
    import _durable_child

    return _durable_child.apply


def same_memory(a: MemoryIndex, b: MemoryIndex, enc, what: str = "") -> None:
    """``a`` holds what ``b`` holds: conversations, sessions, dates, metadata,
    embeddings, graphs, BM25 documents, and the answers to a few questions."""
    assert [c.id for c in a.conversations] == [c.id for c in b.conversations], what
    for ca, cb in zip(a.conversations, b.conversations):
        assert ca.session_ids == cb.session_ids and ca.session_dates == cb.session_dates, \
            (what, ca.id)
        assert a.sessions(ca.id) == b.sessions(cb.id), (what, ca.id)
        va, vb = a.view([ca.id]), b.view([cb.id])
        torch.testing.assert_close(va.gran[va.row_slot], vb.gran[vb.row_slot], rtol=0,
                                   atol=1e-5, msg=f"{what} {ca.id}")
        ga, gb = va.graph(), vb.graph()
        assert torch.equal(ga[0], gb[0]) and torch.equal(ga[1], gb[1]), (what, ca.id)
        for sid in ca.session_ids:
            assert a.get_session(ca.id, sid) == b.get_session(cb.id, sid)
        if ca.session_ids:
            for x, y in zip(a.search(ca.id, QUESTIONS, k=10, encoder=enc),
                            b.search(cb.id, QUESTIONS, k=10, encoder=enc)):
                assert x.session_ids == y.session_ids, (what, ca.id)
                assert x.scores == pytest.approx(y.scores, rel=1e-4, abs=1e-5)


def _fresh(enc) -> MemoryIndex:
    return MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)


# ---------------------------------------------------------------- crash injection
def _kill_run(folder: Path, bert: str, enc, kills: int, seed: int) -> dict:
    """Start a writer, kill it (SIGKILL) at random moments, ``kills`` times; after each
    kill the folder must hold exactly the acknowledged operations (or those and the one
    in flight, complete)."""
    apply = _child_apply()
    rng = random.Random(seed)
    oracle = _fresh(enc)
    acked = in_flight = 0
    for k in range(kills):
        with Child([HERE / "_durable_child.py", folder, bert, seed * 1000 + k,
                    rng.choice([4096, 1 << 16, 1 << 30])]) as child:
            child.wait_ready()
            time.sleep(rng.uniform(0.0, 1.5))  # appends, checkpoints, compactions
            done, pending = acknowledged(child.kill())
        ops = [json.loads(x) for x in done]
        pending = None if pending is None else json.loads(pending)
        for op in ops:
            apply(oracle, op, enc)
        acked += len(ops)
        got = MemoryIndex.load(folder)
        try:
            same_memory(got, oracle, enc, f"kill {k}: {len(ops)} acknowledged")
        except AssertionError:
            assert pending is not None, f"kill {k}: an acknowledged write is missing"
            apply(oracle, pending, enc)  # durable, killed before it printed its ack
            same_memory(got, oracle, enc, f"kill {k}: the write in flight")
            in_flight += 1
    return {"acked": acked, "in_flight": in_flight}


def test_acknowledged_writes_survive_kill_9(tmp_path, bert, enc):
    """A short run of the crash injection (the long one: -m slow, 200 kills)."""
    got = _kill_run(tmp_path / "mem", bert, enc, kills=4, seed=1)
    assert got["acked"] > 0


@pytest.mark.slow
def test_acknowledged_writes_survive_200_kills(tmp_path, bert, enc):
    got = _kill_run(tmp_path / "mem", bert, enc, kills=200, seed=7)
    assert got["acked"] > 200
    print("crash injection:", got)


# ---------------------------------------------------------------- the log and checkpoints
def _add(mem, cid, p, enc, date="2023-06-01", **kw):
    s = POOL[p]
    mem.add_session(cid, Session(s.id, date, s.turns), encoder=enc, **kw)


def test_close_and_reopen_holds_every_write(tmp_path, enc):
    oracle = _fresh(enc)
    with MemoryIndex.open(tmp_path / "m", encoder=enc) as mem:
        for m in (mem, oracle):
            _add(m, "A", 0, enc, metadata={"x": 1})
            _add(m, "A", 3, enc)
            _add(m, "B", 0, enc, summary="other summary")
            _add(m, "B", 5, enc)
            m.remove_session("A", "s1")
            _add(m, "C", 6, enc)
            m.forget_conversation("C")
    back = MemoryIndex.open(tmp_path / "m", encoder=enc)
    assert back.recovery["replayed"] == 0  # close checkpointed everything
    same_memory(back, oracle, enc)
    assert not list((tmp_path / "m" / "wal").glob("0*.log")) or \
        all(p.stat().st_size <= 24 for p in (tmp_path / "m" / "wal").glob("*.log"))
    back.close()


def test_concurrent_writers_encode_at_once_and_every_write_lands(tmp_path, bert, enc):
    """Writers encode their new sessions outside the write lock: four threads meet
    inside the encoder (a barrier that breaks if encoding is serialized), and the
    folder then holds what the same writes give one after another."""
    from memgas_gpu.encode import Encoder

    slow = Encoder(bert, device="cpu", max_length=64)
    meet, met = threading.Barrier(4, timeout=30), threading.local()
    inner = slow.encode

    def encode(texts, *a, **k):
        if getattr(met, "armed", False):
            met.armed = False
            meet.wait()  # BrokenBarrierError: the encoders ran one at a time
        return inner(texts, *a, **k)

    slow.encode = encode
    new = [Session(f"n{i}", "2023-07-0%d" % (i + 1),
                   (f"[Ana]: note {i}: the {w} arrives on Friday.",))
           for i, w in enumerate(["piano", "kayak", "telescope", "bicycle"])]
    oracle, errors = _fresh(enc), []
    mem = MemoryIndex.open(tmp_path / "m", encoder=slow)
    for m in (mem, oracle):
        for i in range(4):
            _add(m, f"c{i}", i, enc)

    def write(i):
        met.armed = True
        try:
            mem.add_session(f"c{i}", new[i], encoder=slow)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    stats = mem.log_stats  # the log counted the 8 acknowledged records
    assert stats.appends == 8 and 1 <= stats.fsyncs and stats.bytes_written > 8 * 64
    assert oracle.log_stats is None
    for i in range(4):
        oracle.add_session(f"c{i}", new[i], encoder=enc)
    same_memory(mem, oracle, enc, "in memory")
    mem.close()
    back = MemoryIndex.open(tmp_path / "m", encoder=enc)
    same_memory(back, oracle, enc, "reopened")
    back.close()


def test_a_torn_log_tail_is_dropped_with_one_warning(tmp_path, enc, caplog):
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    _add(mem, "A", 0, enc)
    _add(mem, "A", 3, enc)
    mem.abandon()  # killed: no checkpoint
    log = max((tmp_path / "m" / "wal").glob("*.log"))
    whole = log.read_bytes()
    with open(log, "ab") as f:
        f.write(whole[-40:-3])  # half a record, as a crash mid-append leaves
    with caplog.at_level("WARNING"):
        back = MemoryIndex.open(tmp_path / "m", encoder=enc)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "dropp" in warnings[0].getMessage()
    assert back.conversations[0].session_ids == ["s1", "s2"]
    assert back.recovery["replayed"] == 2
    back.close()


def test_a_checkpoint_after_one_write_writes_what_changed(tmp_path, enc):
    """20 conversations; a checkpoint after one add appends that conversation's segment,
    one chunk of the new slot, its directory leaf and page, and a root: every other
    conversation's entry (read through the documented directory) is unchanged, and the
    bytes appended are a small part of the folder."""
    import _format4 as f4

    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    for c in range(20):
        for p in (0, 3, 5):
            _add(mem, f"c{c}", p, enc, summary=f"summary {c}")
    mem.checkpoint()
    before, sizes = f4.directory(tmp_path / "m"), f4.pack_sizes(tmp_path / "m")
    _add(mem, "c7", 6, enc, summary="a new one")
    mem.checkpoint()
    after, grown = f4.directory(tmp_path / "m"), f4.pack_sizes(tmp_path / "m")
    changed = sorted(c for c in after if after[c] != before[c])
    assert changed == ["c7"] and after.keys() == before.keys()
    assert after["c7"][6] == 4 and after["c7"][1] == before["c7"][1]  # sessions, ordinal
    appended = sum(grown.values()) - sum(sizes.values())
    seg = after["c7"][4]
    root = f4.pointer(tmp_path / "m")["root"][2]
    chunk = f4.chunks(tmp_path / "m")[-1]["ref"][2]
    # segment + chunk + root + a leaf and a page (a few entries each)
    assert appended <= seg + chunk + root + 4096, (appended, seg, chunk, root)
    assert sum(grown.values()) > 10 * appended
    mem.close()


def test_forget_and_compact_leave_no_byte_of_the_removed_session(tmp_path, enc):
    secret = "[Zed]: my locker code is 7361-ALPHA-ORCHID"
    s = Session("secret", "2023-06-01", (secret,))
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    _add(mem, "keep", 0, enc)
    mem.add_session("gone", s, encoder=enc, summary="zed locker", keywords="locker")
    row = mem.view(["gone"]).gran[mem.view(["gone"]).row_slot[0]].numpy().tobytes()
    mem.checkpoint()
    mem.forget_conversation("gone")

    def holders():
        return [p for p in (tmp_path / "m").rglob("*") if p.is_file()
                and (secret.encode() in p.read_bytes() or row[:64] in p.read_bytes())]

    assert holders()  # the log and the checkpoint still hold it: not yet compacted
    mem.compact()
    assert holders() == []
    assert [c.id for c in mem.conversations] == ["keep"]
    mem.close()
    assert holders() == []
    assert [c.id for c in MemoryIndex.load(tmp_path / "m").conversations] == ["keep"]


def test_one_writer_and_readers_that_follow(tmp_path, enc):
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    with pytest.raises(IndexLockError, match=rf"open for writing by process {os.getpid()}"):
        MemoryIndex.open(tmp_path / "m", encoder=enc)
    reader = MemoryIndex.open(tmp_path / "m", readonly=True)
    with pytest.raises(PermissionError, match="read-only"):
        _add(reader, "A", 0, enc)
    _add(mem, "A", 0, enc)
    _add(mem, "A", 3, enc)
    assert reader.refresh() == 2
    same_memory(reader, mem, enc)
    mem.checkpoint()  # the log the reader read is gone: it reloads the checkpoint
    _add(mem, "B", 5, enc)
    assert reader.refresh() == -1
    same_memory(reader, mem, enc)
    mem.close()


@pytest.mark.parametrize("fmt", [1, 2, 3])
def test_an_older_folder_loads_opens_and_is_converted_once(tmp_path, enc, fmt):
    """Folders of formats 1, 2 and 3 (3 with records in its log after its checkpoint)
    load as they are; opening one for writing converts it to format 4 by its first
    commit and removes the older files; the sessions are those written."""
    import _format4 as f4
    import _legacy_writers as lw
    from memgas_gpu.memory.writes import AddOp, RemoveOp

    old = _fresh(enc)
    _add(old, "A", 0, enc)
    _add(old, "A", 3, enc)
    folder = tmp_path / "old"
    if fmt == 3:
        extra = Session(POOL[4].id, "2023-05-05", POOL[4].turns)
        lw.write_v3(old, folder, lsn=7, records=[
            lw.v1_record(AddOp("B", extra, "a summary", "kw",
                               _encoded(old, extra, "a summary", "kw", enc))),
            lw.v1_record(RemoveOp("A", "s2"))])
        old.add_session("B", extra, summary="a summary", keywords="kw", encoder=enc)
        old.remove_session("A", "s2")
    else:
        (lw.write_v1 if fmt == 1 else lw.write_v2)(old, folder)
    same_memory(MemoryIndex.load(folder), old, enc, f"format {fmt} loaded")
    mem = MemoryIndex.open(folder, encoder=enc)
    same_memory(mem, old, enc, f"format {fmt} opened")
    assert f4.pointer(folder)["version"] == 4
    left = sorted(p.name for p in folder.rglob("*") if p.is_file() and p.name != ".lock")
    assert all(n == "manifest.json" or n.endswith((".pack", ".log")) for n in left), left
    _add(mem, "A", 5, enc)
    _add(old, "A", 5, enc)
    mem.close()
    same_memory(MemoryIndex.load(folder), old, enc, f"format {fmt} after a write")
    if fmt == 3:  # record numbers go on after the old log's
        assert min(int(p.stem) for p in (folder / "wal").glob("*.log")) > 9


def _encoded(mem, session, summary, keywords, enc):
    from memgas_gpu.memory.writes import encode_sessions

    return encode_sessions(mem._store, [(session, summary, keywords)], enc, mem.dim)[0]


def test_a_saved_folder_opens_without_converting(tmp_path, enc):
    """``save`` writes the format a memory opened on a folder keeps (a complete commit,
    an empty log): opening it writes no commit."""
    import _format4 as f4

    old = _fresh(enc)
    _add(old, "A", 0, enc)
    old.save(tmp_path / "s")
    before = f4.folder_bytes(tmp_path / "s")
    mem = MemoryIndex.open(tmp_path / "s", encoder=enc)
    assert mem.recovery["replayed"] == 0
    after = f4.folder_bytes(tmp_path / "s")
    assert {k: v for k, v in after.items() if k != ".lock"} == \
        {k: v for k, v in before.items() if k != ".lock"}  # the lock names its holder
    same_memory(mem, old, enc)
    mem.close()


def test_replaying_a_record_twice_adds_nothing(tmp_path, enc):
    """A crash after a checkpoint but before the log was cut: records it covers are
    skipped by their sequence number, and a record whose session is already there with
    the same content changes nothing."""
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    _add(mem, "A", 0, enc)
    _add(mem, "A", 3, enc)
    from memgas_gpu.storage.records import decode
    from memgas_gpu.storage.log import WriteAheadLog

    records = [decode(p, "test") for _, p in WriteAheadLog.read(tmp_path / "m" / "wal")]
    before = [c.session_ids for c in mem.conversations]
    for r in records:
        assert mem._replay(r) is False
    assert [c.session_ids for c in mem.conversations] == before
    mem.close()


def test_a_write_whose_log_sync_fails_is_neither_acknowledged_nor_seen(tmp_path, enc,
                                                                       monkeypatch):
    """The log's fsync fails (a full or failing disk): the write raises, readers never
    saw it, and the memory refuses writes until it is opened again, when the folder
    holds exactly what was acknowledged."""
    from memgas_gpu.storage import log as wal

    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    _add(mem, "A", 0, enc)
    seen = []
    real = os.fsync

    def failing(fd):
        seen.append([c.session_ids for c in mem.conversations])  # what readers see now
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(wal.os, "fsync", failing)
    with pytest.raises(OSError):
        _add(mem, "A", 3, enc)
    monkeypatch.setattr(wal.os, "fsync", real)
    assert seen and all(x == [["s1"]] for x in seen)  # during the sync: not published
    assert [c.session_ids for c in mem.conversations] == [["s1"]]
    with pytest.raises(Exception, match="open the folder again"):
        _add(mem, "A", 5, enc)
    mem.abandon()
    back = MemoryIndex.open(tmp_path / "m", encoder=enc)
    assert [c.session_ids for c in back.conversations] == [["s1"]]
    back.close()


def test_chunks_of_one_size_are_merged(tmp_path, enc, monkeypatch):
    """Each checkpoint with new sessions appends a store chunk; when FANIN chunks of one
    size class are there they are written again as one (so there are few, and a slot is
    rewritten a logarithmic number of times), and the memory reads back the same."""
    import _format4 as f4
    from memgas_gpu.storage import commit

    monkeypatch.setattr(commit, "CHUNK_FANIN", 3)
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    counts = []
    for p in (0, 3, 4, 5, 6, 7):
        _add(mem, "A", p, enc)
        mem.checkpoint()
        counts.append([c["slots"][1] - c["slots"][0]
                       for c in f4.chunks(tmp_path / "m")])
    # the empty first chunk, then one per checkpoint; three of one size class (slots < 3:
    # class 0; 3 to 8: class 1) merged into one
    assert counts == [[0, 1], [2], [2, 1], [4], [4, 1], [4, 1, 1]], counts
    back = MemoryIndex.load(tmp_path / "m")
    same_memory(back, mem, enc)
    mem.close()


@pytest.mark.parametrize("option, value, match", [
    ("checkpoint_bytes", 0, "checkpoint_bytes must be an integer"),
    ("checkpoint_bytes", 1.5, "checkpoint_bytes must be an integer"),
    ("checkpoint_seconds", float("nan"), "checkpoint_seconds must be finite"),
    ("checkpoint_seconds", 0, "checkpoint_seconds must be > 0"),
    ("lock_timeout", -1, "lock_timeout must be >= 0"),
    ("lock_timeout", float("nan"), "lock_timeout must be finite"),
])
def test_the_options_are_settings_checked_before_anything(tmp_path, enc, option, value,
                                                          match):
    from memgas_gpu.settings import SettingsError

    with pytest.raises(SettingsError, match=match):
        MemoryIndex.open(tmp_path / "m", encoder=enc, **{option: value})
    assert not (tmp_path / "m").exists()  # refused before the folder was touched


def test_the_order_of_conversations_survives_forget_and_add_again(tmp_path, enc):
    """A conversation forgotten and added again comes last, in the memory and after a
    reload of each commit, also in a memory reopened on the folder (oracle: the order of
    the writes, by hand)."""
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    for c, p in (("A", 0), ("B", 3), ("C", 4), ("D", 5)):
        _add(mem, c, p, enc)
    mem.checkpoint()
    mem.forget_conversation("A")
    mem.forget_conversation("B")
    _add(mem, "B", 6, enc)
    _add(mem, "A", 7, enc)
    _add(mem, "E", 0, enc)
    assert [c.id for c in mem.conversations] == ["C", "D", "B", "A", "E"]
    mem.checkpoint()
    assert [c.id for c in MemoryIndex.load(tmp_path / "m").conversations] == \
        ["C", "D", "B", "A", "E"]
    mem.abandon()
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    assert [c.id for c in mem.conversations] == ["C", "D", "B", "A", "E"]
    # reopened: the conversations are the folder's (read when needed); one forgotten and
    # added again comes last too, not back in the folder's place
    mem.forget_conversation("C")
    _add(mem, "C", 4, enc)
    assert [c.id for c in mem.conversations] == ["D", "B", "A", "E", "C"]
    mem.close()
    assert [c.id for c in MemoryIndex.load(tmp_path / "m").conversations] == \
        ["D", "B", "A", "E", "C"]


def test_a_merge_into_a_chunk_page_lists_its_chunks_again(tmp_path, enc, monkeypatch):
    """Chunk pages (here of 2 entries, merges of 2 chunks) are written once; when a
    merge takes a chunk a page lists, that page is dropped and the new commit's pages
    and root list the merged chunk instead (read with the independent reader: every
    slot once, end to end), and the memory reads back the same."""
    import _format4 as f4
    from memgas_gpu.storage import commit

    monkeypatch.setattr(commit, "CHUNK_FANIN", 2)
    monkeypatch.setattr(commit, "CHUNK_PAGE", 2)
    monkeypatch.setattr(f4, "CHUNK_PAGE", 2)
    mem = MemoryIndex.open(tmp_path / "m", encoder=enc)
    pages, dropped = [], 0
    for p in range(23):  # pages at 14 and 22; the merge at 15 takes the first
        mem.add_session("A", Session(f"x{p}", "2023-06-01", (f"[user]: note {p} on roses",)),
                        encoder=enc)
        mem.checkpoint()
        now = [ref for ref, _ in f4.chunk_pages(tmp_path / "m")]
        kept = [r for r in now if r in pages]
        assert kept == now[:len(kept)], "a page kept after one written again"
        dropped += len(pages) - len(kept)
        pages = now
        every = f4.chunks(tmp_path / "m")
        assert every[0]["slots"][0] == 0 and every[-1]["slots"][1] == p + 1, every
        assert all(a["slots"][1] == b["slots"][0] for a, b in zip(every, every[1:]))
        assert len(f4.root(tmp_path / "m")["chunks"]) < 2 + 2
    assert dropped > 0 and pages, "no merge reached into a page"
    back = MemoryIndex.load(tmp_path / "m")
    same_memory(back, mem, enc)
    mem.close()


def test_full_commits_leave_no_removed_pack_open(tmp_path, tiny_enc, monkeypatch):
    """A memory that compacts (a full commit to a new pack, the old packs removed) again
    and again holds no removed pack open once its old snapshots are gone: the disk space
    of the packs it replaced comes back (the reference counts' reader of each full
    commit, which reads its pack, here with nothing kept parsed, is closed when the
    next one replaces it)."""
    import gc

    from memgas_gpu.storage import refs

    monkeypatch.setattr(refs, "CACHE", 0)  # every count read from the pack

    folder = tmp_path / "mem"
    mem = MemoryIndex.open(folder, encoder=tiny_enc)
    for c in range(3):
        _add(mem, f"c{c}", c, tiny_enc)
    mem.checkpoint()
    for r in range(4):
        mem.compact()
        _add(mem, "c0", 3 + r, tiny_enc)
        mem.checkpoint()  # an incremental commit reading the counts of the full one
    gc.collect()

    def removed_packs():
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if path.startswith(str(folder)) and path.endswith(" (deleted)"):
                out.append(path)
        return out

    assert not removed_packs()
    mem.close()
    gc.collect()
    assert not removed_packs()
