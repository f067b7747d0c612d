"""The promises of the write-ahead log and of recovery (docs/index-format.md, "The log"
and "Recovery"; docs/failure.md, "A durable memory"), each checked against an oracle
that does not use the code under test:

* the log's bytes, parsed here as the format is written down (tests/_format4.py: a
  24-byte header ``MGAS-WAL | version u32 | first record u64 | CRC-32 of those 20
  bytes``; records ``length u32 | CRC-32 of (number u64 + group u64 + payload) u32 |
  number u64 | group u64 | payload``, little-endian; ``group`` the number of the first
  record of the write), and records framed here the same way;
* the files and fsyncs the operating system saw, and what a power loss would leave
  (tests/_fsrecord.py);
* the commits as the folder's pointer ``manifest.json`` and root name them (read with
  tests/_format4.py), a list of the payloads written, a count of the checkpoints the
  log's size asks for, and an in-RAM memory given the same writes.

tests/test_wal.py and tests/test_durable.py check the log and the memory through their
own API; these check what the bytes, the files and the order of events must be.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
import zlib
from pathlib import Path

import pytest
import torch

import _format4 as f4
from _child import Child
from _fsrecord import FSRecorder
from memgas_gpu.storage.log import WALCorruptionError, WriteAheadLog

HERE = Path(__file__).resolve().parent

HEADER_BYTES = f4.WAL_HEADER
REC_BYTES = f4.WAL_RECORD.size  # 24: length, CRC-32, number, group
frame, check_documented, log_files = f4.frame, f4.wal_checked, f4.wal_files


def lsns(folder: Path) -> list[int]:
    return [lsn for lsn, _, _ in check_documented(folder)]


def payloads(n: int, salt: int = 0) -> list[bytes]:
    sizes = (0, 1, 7, 16, 100, 333, 1000)
    return [bytes([(i + salt) % 256]) + os.urandom(sizes[i % len(sizes)]) for i in range(n)]


def write_log(folder: Path, data: list[bytes], rotate_every: int = 0, **kw) -> None:
    with WriteAheadLog.open(folder, **kw) as w:
        for i, p in enumerate(data, 1):
            assert w.append(p) == i
            if rotate_every and i % rotate_every == 0 and i < len(data):
                assert w.rotate()


def wal_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "memgas_gpu.wal" and r.levelno >= logging.WARNING]


def append_unsynced(path: Path, data: bytes) -> None:
    """Bytes a killed writer wrote and never synced (through a file object: no
    ``os.write`` a recorder would see, no fsync)."""
    with open(path, "ab") as f:
        f.write(data)


# ================================================================ 1. the record checksum
def test_every_header_and_record_checksum_is_exactly_as_documented(tmp_path, monkeypatch):
    """Written by the log (rotated files, a reopen between appends, and 6 threads
    appending at once so that writes carry several records), read here per the format:
    each header's CRC is over its 20 bytes, each record's over its number and group
    (u64 little-endian each) then its payload, each group the number of the first
    record of its write; and ``stats.bytes_written`` is what the records take on
    disk."""
    folder = tmp_path / "wal"
    data = payloads(40)
    with WriteAheadLog.open(folder, max_file_bytes=1500) as w:
        for p in data[:25]:
            w.append(p)
    real_fsync = os.fsync

    def slow_fsync(fd):  # writers arriving meanwhile queue up: they share the next write
        time.sleep(0.01)
        return real_fsync(fd)

    more = payloads(60, salt=5)
    with WriteAheadLog.open(folder, max_file_bytes=1500) as w:
        for p in data[25:]:
            w.append(p)
        monkeypatch.setattr(os, "fsync", slow_fsync)
        got: dict = {}
        threads = [threading.Thread(target=lambda k=k: got.update(
            {w.append(p): p for p in more[k::6]})) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        monkeypatch.undo()
        written = w.stats.bytes_written
    records = check_documented(folder)
    assert [(lsn, p) for lsn, _, p in records[:40]] == list(enumerate(data, 1))
    assert {lsn: p for lsn, _, p in records[40:]} == got and len(got) == len(more)
    assert len(log_files(folder)) >= 4  # the checks above crossed rotations
    groups = [g for _, g, _ in records]
    assert groups[:40] == list(range(1, 41))  # one writer: a write per record
    assert any(groups.count(g) > 1 for g in groups[40:]), "no write carried two records"
    assert written == sum(REC_BYTES + len(p) for p in data[25:] + more)
    on_disk = sum(p.stat().st_size - HEADER_BYTES for p in log_files(folder))
    assert on_disk == sum(REC_BYTES + len(p) for p in data + more)


@pytest.mark.parametrize("forged", ["payload only", "number and payload (format 1)",
                                    "group 0", "a group after the record"])
def test_records_framed_as_documented_are_read_back(tmp_path, forged):
    """The reader's side of the same format: records framed here (a write of three
    records sharing group 3, then a write of one) appended to a log file are replayed,
    and the next record goes on from them; the same last record with a checksum that
    leaves the number or the group out, or naming a group no write could have, is not
    read (the last one: a torn tail, dropped)."""
    folder = tmp_path / "ok"
    write_log(folder, [b"one", b"two"])
    last = log_files(folder)[-1]
    append_unsynced(last, frame(3, 3, b"three") + frame(4, 3, b"") +
                    frame(5, 3, b"five" * 100) + frame(6, 6, b"six"))
    want = [(1, b"one"), (2, b"two"), (3, b"three"), (4, b""), (5, b"five" * 100),
            (6, b"six")]
    assert list(WriteAheadLog.read(folder)) == want
    with WriteAheadLog.open(folder) as w:
        assert list(w.replay()) == want
        assert w.append(b"seven") == 7
    assert check_documented(folder)[-1] == (7, 7, b"seven")

    bad = tmp_path / "forged"
    write_log(bad, [b"one", b"two"])
    p = b"three"
    record = {"payload only": frame(3, 3, p, crc=zlib.crc32(p)),
              "number and payload (format 1)": frame(
                  3, 3, p, crc=zlib.crc32((3).to_bytes(8, "little") + p)),
              "group 0": frame(3, 0, p),
              "a group after the record": frame(3, 4, p)}[forged]
    append_unsynced(log_files(bad)[-1], record)
    assert list(WriteAheadLog.read(bad)) == [(1, b"one"), (2, b"two")]
    with WriteAheadLog.open(bad) as w:
        assert w.last_lsn == 2
        assert w.append(b"three") == 3
    assert [(n, p) for n, _, p in check_documented(bad)] == [(1, b"one"), (2, b"two"),
                                                              (3, b"three")]


def test_a_format_1_file_is_read_and_never_appended_to(tmp_path):
    """A log file of format 1 (no group; CRC-32 of number + payload), written here: its
    records are read and replayed; the next record goes to a new file of format 2 named
    by its number, and the old file's bytes stay as they were."""
    folder = tmp_path / "wal"
    folder.mkdir()
    old = folder / f"{1:020d}.log"
    old.write_bytes(f4.wal_header(1, version=1) + f4.frame_v1(1, b"a") +
                    f4.frame_v1(2, b"bb" * 50) + f4.frame_v1(3, b""))
    before = old.read_bytes()
    want = [(1, b"a"), (2, b"bb" * 50), (3, b"")]
    assert list(WriteAheadLog.read(folder)) == want
    with WriteAheadLog.open(folder) as w:
        assert list(w.replay()) == want
        assert w.append(b"four") == 4
    assert old.read_bytes() == before
    assert [p.name for p in log_files(folder)] == [old.name, f"{4:020d}.log"]
    assert f4.parse_log_file(log_files(folder)[-1])["version"] == 2
    assert [(n, g) for n, g, _ in check_documented(folder, versions=(1, 2))] == \
        [(1, None), (2, None), (3, None), (4, 4)]


@pytest.mark.parametrize("crc", ["as written", "payload only", "group left out"])
def test_a_renumbered_file_is_refused_not_replayed(tmp_path, caplog, crc):
    """A copy of the first file put where the second belongs, its header, numbers and
    groups rewritten (a file moved, or records renumbered) and its CRC fields left as
    they were, or set to a CRC of the payload alone or of number + payload: the
    checksum covers the number and the group, so the log is refused (naming the file
    and the first record's offset) and nothing changes; as the last file, none of its
    records is replayed."""
    folder = tmp_path / "wal"
    data = payloads(9, salt=3)
    write_log(folder, data, rotate_every=3)
    files = log_files(folder)
    assert [int(p.stem) for p in files] == [1, 4, 7]
    src = f4.parse_log_file(files[0])
    moved = bytearray(f4.wal_header(4))
    for _, _, old_crc, lsn, group, payload in src["records"]:
        new_crc = {"as written": old_crc, "payload only": zlib.crc32(payload),
                   "group left out": zlib.crc32((lsn + 3).to_bytes(8, "little") + payload)
                   }[crc]
        moved += f4.WAL_RECORD.pack(len(payload), new_crc, lsn + 3, group + 3) + payload
    files[1].write_bytes(bytes(moved))
    before = f4.folder_bytes(folder)
    name = str(files[1])
    with pytest.raises(WALCorruptionError, match=rf"^{name}: offset {HEADER_BYTES}: "):
        WriteAheadLog.open(folder)
    with pytest.raises(WALCorruptionError, match=rf"^{name}: offset {HEADER_BYTES}: "):
        list(WriteAheadLog.read(folder))
    assert f4.folder_bytes(folder) == before  # nothing changed
    assert wal_warnings(caplog) == []

    # the same copy as the last file: whatever the log does with it, it never replays it
    files[2].unlink()
    got = None
    try:
        with WriteAheadLog.open(folder) as w:
            got = list(w.replay())
    except WALCorruptionError:
        pass
    if got is not None:
        assert got == list(enumerate(data[:3], 1)), "a renumbered record was accepted"
    try:
        got = list(WriteAheadLog.read(folder))
    except WALCorruptionError:
        got = None
    if got is not None:
        assert got == list(enumerate(data[:3], 1)), "a renumbered record was read"


# ================================================================ 2. recovery syncs first
def test_opening_a_log_fsyncs_its_last_file_before_it_returns(tmp_path):
    """Records a killed writer wrote but never synced (framed here, appended without an
    fsync) are made durable by ``open``: the last file is fsync'd before ``open``
    returns, so a power loss right after the open keeps them."""
    folder = tmp_path / "wal"
    write_log(folder, [b"a", b"b", b"c"], rotate_every=2)
    last = log_files(folder)[-1]
    assert int(last.stem) == 3
    with FSRecorder(folder) as rec:  # what is there now is durable
        append_unsynced(last, frame(4, 4, b"d") + frame(5, 4, b"e" * 50))
        before = rec.power_loss_state(tmp_path / "before")
        w = WriteAheadLog.open(folder)
        opened = rec.mark()
        after = rec.power_loss_state(tmp_path / "after")
    try:
        synced = rec.find("fsync", last.name, "file", stop=opened)
        assert synced, f"the last log file was not fsync'd by open: {rec.events}"
        assert [lsn for lsn, _ in w.replay()] == [1, 2, 3, 4, 5]
    finally:
        w.close()
    assert [lsn for lsn, _ in WriteAheadLog.read(before)] == [1, 2, 3]  # the oracle's model
    assert [lsn for lsn, _ in WriteAheadLog.read(after)] == [1, 2, 3, 4, 5]


def test_recovery_fsyncs_the_last_log_file_before_replaying_it(tmp_path, monkeypatch, enc):
    """A memory whose writer was killed with its last record written but not synced:
    opening fsyncs the last log file before the first record is applied and before the
    recovery commit writes anything (a power loss at the first replayed record keeps
    that record), and that record is replayed."""
    from memgas_gpu.retrieve import MemoryIndex

    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    add(mem, "A", 0, "s1", enc)
    with FSRecorder(folder) as rec:
        with monkeypatch.context() as m:  # the last write: in the file, its fsync never ran
            m.setattr(os, "fsync", lambda fd: None)
            add(mem, "A", 3, "s2", enc)
        mem.abandon()
        last = log_files(folder / "wal")[-1]
        assert lsns(folder / "wal") == [1, 2]
        start = rec.mark()
        real_replay = MemoryIndex._replay
        states = []

        def replay(self, ops):
            rec.note("replay")
            if not states:  # a power loss as the first record is applied
                states.append(rec.power_loss_state(tmp_path / "power"))
            return real_replay(self, ops)

        monkeypatch.setattr(MemoryIndex, "_replay", replay)
        back = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    try:
        assert back.recovery["replayed"] == 2
        rel = last.relative_to(folder).as_posix()
        synced = rec.first("fsync", rel, "file", start=start)
        applied = rec.first("note", "replay", start=start)
        assert synced is not None, f"the last log file was never fsync'd: {rec.events}"
        assert applied is not None and synced < applied, \
            f"a record was applied before the log file was fsync'd: {rec.events[start:]}"
        wrote = rec.find("write", "data/*", start=start) + \
            rec.find("rename", "*", "manifest.json", start=start)
        assert wrote and synced < min(wrote), "the recovery commit wrote first"
        assert [lsn for lsn, _ in WriteAheadLog.read(states[0] / "wal")] == [1, 2]
        assert [c.session_ids for c in back.conversations] == [["s1", "s2"]]
    finally:
        back.abandon()


# ================================================================ 3. the checkpoint trigger
def commit_number(folder: Path) -> int:
    return f4.pointer(folder)["commit"]


def test_the_log_size_trigger_is_reset_by_each_checkpoint(tmp_path, enc):
    """With ``checkpoint_bytes=X`` a write commits once the log grew by X bytes since the
    last commit: the commits counted (the pointer's ``commit`` number) are exactly what
    that rule says for the bytes each write logged, about bytes / X of them, and each
    covers every write so far and leaves none of them in the log."""
    from memgas_gpu.retrieve import MemoryIndex

    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=1, checkpoint_seconds=1e9)
    add(mem, "c0", 0, "x0", enc)
    x = int(2.5 * mem.log_stats.bytes_written)  # about two and a half records
    mem.close()
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=x, checkpoint_seconds=1e9)
    current, at_last, expected, seen = commit_number(folder), 0, [], []
    for i in range(1, 19):
        add(mem, f"c{i % 3}", i % 8, f"x{i}", enc)
        logged = mem.log_stats.bytes_written
        if logged - at_last >= x:
            expected.append(i + 1)  # the number of this write's record
            at_last = logged
        now = commit_number(folder)
        if now != current:
            assert now == current + 1, (current, now)
            seen.append(i + 1)
            current = now
            assert f4.root(folder)["lsn"] == i + 1  # it covers every write so far
            assert check_documented(folder / "wal") == []  # and the log holds none of them
    total = mem.log_stats.bytes_written
    mem.abandon()
    assert seen == expected, f"commits after records {seen}, the rule says {expected}"
    assert 2 <= len(seen) <= total // x, (len(seen), total, x)


def test_a_failed_automatic_checkpoint_is_tried_again_after_as_much_log(tmp_path, enc,
                                                                       monkeypatch, caplog):
    """An automatic commit that fails (a full disk) does not fail the write that ran it
    (its record is synced): one warning, the folder's commit unchanged, every write in
    the log, and the next commit tried only once the log has grown by
    ``checkpoint_bytes`` again."""
    from memgas_gpu.memory import durable
    from memgas_gpu.retrieve import MemoryIndex

    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=1, checkpoint_seconds=1e9)
    add(mem, "c0", 0, "x0", enc)
    x = int(2.5 * mem.log_stats.bytes_written)
    mem.close()
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=x, checkpoint_seconds=1e9)
    real, calls = durable.write_commit, []

    def full_disk_once(*a, **kw):
        calls.append(mem.log_stats.bytes_written)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "data"))
        return real(*a, **kw)

    monkeypatch.setattr(durable, "write_commit", full_disk_once)
    first, at_last, expected = commit_number(folder), 0, []
    with caplog.at_level(logging.WARNING):
        for i in range(1, 13):
            add(mem, f"c{i % 3}", i % 8, f"x{i}", enc)  # never raises
            logged = mem.log_stats.bytes_written
            if logged - at_last >= x:
                expected.append(logged)
                at_last = logged
            if len(calls) == 1:
                assert commit_number(folder) == first
                assert lsns(folder / "wal") == list(range(2, i + 2))
    assert calls == expected and len(calls) >= 3, (calls, expected)
    assert mem.storage_stats()["checkpoint_failures"] == 1
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and "checkpoint failed" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert commit_number(folder) == first + len(calls) - 1
    mem.abandon()


# ================================================================ 4. the LSN after replay
#: writes after a commit: an add, its removal, the same session id with other content,
#: another add, two sessions in one write (one record), a replacement
OPS = [("checkpoint",), ("add", "A", 0, "s1"), ("remove", "A", "s1"), ("add", "A", 1, "s1"),
       ("add", "B", 5, "s4"), ("batch", "C", [(6, "s5"), (7, "s6")]),
       ("replace", "B", 4, "s4")]
LAST = 7  # the number of the last record OPS writes


def run_ops(mem, enc, ops) -> None:
    from _memory_model import POOL

    from memgas_gpu import Session

    for op in ops:
        if op[0] == "add":
            add(mem, op[1], op[2], op[3], enc)
        elif op[0] == "remove":
            mem.remove_session(op[1], op[2])
        elif op[0] == "batch":
            mem.add_sessions(op[1], [Session(sid, "2023-06-02", POOL[p].turns)
                                     for p, sid in op[2]], encoder=enc)
        elif op[0] == "replace":
            mem.replace_session(op[1], Session(op[3], "2023-06-03", POOL[op[2]].turns),
                                encoder=enc)
        elif op[0] == "checkpoint":
            if mem.folder is not None:
                mem.checkpoint()


def commit_lsn(folder: Path) -> int:
    return f4.root(folder)["lsn"]


def crashed_writer(folder: Path, enc):
    """Record 1 covered by a commit; records 2..7 only in the log, the writer let go
    without a commit. Returns the in-RAM memory given the same writes."""
    from memgas_gpu.retrieve import MemoryIndex

    model = fresh(enc)
    mem = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    for m in (mem, model):
        add(m, "B", 3, "s2", enc)
        run_ops(m, enc, OPS)
    mem.abandon()
    return model


def check_recovered(folder: Path, model, enc) -> None:
    from memgas_gpu.retrieve import MemoryIndex

    assert commit_lsn(folder) == 1
    records = check_documented(folder / "wal")
    assert [lsn for lsn, _, _ in records] == list(range(2, LAST + 1))
    assert [len(f4.record_ops(p)) for _, _, p in records] == [1, 1, 1, 1, 2, 1]
    back = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    assert back.recovery["replayed"] == LAST - 1
    # the recovery commit covers the replayed records and the log holds none of them
    assert commit_lsn(folder) == LAST
    assert check_documented(folder / "wal") == []
    assert [int(p.stem) for p in log_files(folder / "wal")] == [LAST + 1]
    same_memory(back, model, enc, "recovered")
    back.abandon()  # killed again, right after recovery
    again = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    try:
        assert again.recovery["replayed"] == 0
        assert commit_lsn(folder) == LAST
        same_memory(again, model, enc, "reopened")
        for m in (again, model):  # the next write is record LAST + 1
            add(m, "A", 6, "s9", enc)
        assert lsns(folder / "wal") == [LAST + 1]
    except BaseException:
        again.abandon()
        raise
    again.close()
    assert commit_lsn(folder) == LAST + 1
    assert check_documented(folder / "wal") == []
    last = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    assert last.recovery["replayed"] == 0
    same_memory(last, model, enc, "after close")
    last.close()


def test_after_replay_the_memory_lsn_moves_past_the_replayed_records(tmp_path, enc):
    folder = tmp_path / "m"
    model = crashed_writer(folder, enc)
    check_recovered(folder, model, enc)


CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[3])
import torch
torch.set_num_threads(1)
from memgas_gpu.encode import Encoder
from memgas_gpu.retrieve import MemoryIndex
import test_log_promises as t
enc = Encoder(sys.argv[2], device="cpu", max_length=64)
mem = MemoryIndex.open(sys.argv[1], encoder=enc, **t.NO_AUTO)
t.add(mem, "B", 3, "s2", enc)
t.run_ops(mem, enc, t.OPS)
print("acked", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_after_replay_the_lsn_moves_past_the_records_of_a_writer_killed_9(tmp_path, bert,
                                                                          enc):
    """The same, the writer a child process killed with SIGKILL."""
    folder = tmp_path / "m"
    with Child(["-c", CHILD, folder, bert, HERE]) as child:
        child.wait_for("acked")
        child.kill()
    model = fresh(enc)
    add(model, "B", 3, "s2", enc)
    run_ops(model, enc, OPS)
    check_recovered(folder, model, enc)


# ================================================================ 5. more promises
def test_lsns_are_consecutive_across_rotated_files_and_replay_starts_anywhere(tmp_path):
    """Files rotated by size, by ``rotate()`` and by reopening: each file is named by its
    first record, the numbers run 1, 2, 3, ... across files, and replaying (or reading)
    after any number gives exactly the records after it, file boundaries included."""
    folder = tmp_path / "wal"
    data = payloads(45, salt=7)
    with WriteAheadLog.open(folder, max_file_bytes=900) as w:
        for p in data[:20]:
            w.append(p)
        w.rotate()
        for p in data[20:30]:
            w.append(p)
    with WriteAheadLog.open(folder, max_file_bytes=900) as w:
        for i, p in enumerate(data[30:], 31):
            assert w.append(p) == i
            if i == 37:
                w.rotate()
        want = list(enumerate(data, 1))
        assert [(n, p) for n, _, p in check_documented(folder)] == want
        firsts = [int(p.stem) for p in log_files(folder)]
        assert len(firsts) >= 6
        for after in range(len(data) + 1):
            assert list(w.replay(after)) == want[after:], after
    for after in [0] + [f - 1 for f in firsts] + [f for f in firsts]:
        assert list(WriteAheadLog.read(folder, after)) == want[after:], after


def test_every_acknowledged_record_survives_a_power_loss_across_rotations(tmp_path):
    """After each append returns (files rotated by size every few records), what a power
    loss would leave (strict model: a file's bytes as of its last fsync, a folder's
    entries as of its own last fsync) holds every acknowledged record: a new log file's
    name is durable before a record is acknowledged in it."""
    folder = tmp_path / "wal"
    folder.mkdir()
    data = payloads(14, salt=13)
    with FSRecorder(folder, real_fsync=False) as rec:
        with WriteAheadLog.open(folder, max_file_bytes=150) as w:
            for i, p in enumerate(data, 1):
                assert w.append(p) == i
                state = rec.power_loss_state(tmp_path / f"power-{i}")
                assert list(WriteAheadLog.read(state)) == list(enumerate(data[:i], 1)), i
                shutil.rmtree(state)
    assert len(log_files(folder)) >= 4


def test_a_new_file_whose_folder_fsync_failed_is_not_left_behind(tmp_path):
    """The rotation a commit's ``truncate_through`` runs fails with ENOSPC from the log
    folder's fsync, after the new file was renamed into place: the log goes on in its
    current file and leaves no file claiming records it never got, so the log opens
    and replays every record (a later truncation works too)."""
    folder = tmp_path / "wal"
    data = payloads(6, salt=17)
    with WriteAheadLog.open(folder) as w:
        for p in data[:3]:
            w.append(p)
        with FSRecorder(folder) as rec:
            rec.fail_at(2, errno.ENOSPC, ops=("fsync",))  # the new file's, then the folder's
            with pytest.raises(OSError):
                w.truncate_through(3)
        assert [(e.path, e.detail) for e in rec.failures] == [(".", "fsync")]
        assert rec.find("rename", "*", f"{4:020d}.log")  # the new file was in place
        for p in data[3:]:
            w.append(p)
    assert [(n, p) for n, _, p in check_documented(folder)] == list(enumerate(data, 1))
    with WriteAheadLog.open(folder) as w:
        assert list(w.replay()) == list(enumerate(data, 1))
        files = len(log_files(folder))
        assert w.truncate_through(6) == files  # and a new empty file keeps number 7
    assert [p.name for p in log_files(folder)] == [f"{7:020d}.log"]


def test_a_torn_tail_is_cut_at_the_last_whole_record_with_one_warning(tmp_path, caplog):
    """A record framed here and cut short at several lengths: ``open`` truncates the
    file exactly where the last whole record ends (its offset computed here), logs one
    warning naming the file, the bytes dropped and the offset; a reopen warns no more,
    and the next record goes where the torn one began."""
    torn = frame(4, 4, b"the torn record" * 4)
    for cut in (1, REC_BYTES - 1, REC_BYTES, REC_BYTES + 1, len(torn) - 1):
        folder = tmp_path / f"cut{cut}"
        write_log(folder, [b"one", b"two" * 10, b"three"])
        path = log_files(folder)[0]
        end = f4.parse_log_file(path)["end"]
        append_unsynced(path, torn[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="memgas_gpu.wal"):
            with WriteAheadLog.open(folder) as w:
                assert w.last_lsn == 3
            warned = wal_warnings(caplog)
            assert len(warned) == 1, (cut, warned)
            assert warned[0].startswith(f"{path}: dropped {cut} bytes "), warned
            assert f"(offset {end})" in warned[0], warned
            assert path.stat().st_size == end, cut
            caplog.clear()
            with WriteAheadLog.open(folder) as w:
                assert w.append(b"four") == 4
            assert wal_warnings(caplog) == []
        assert [(n, p) for n, _, p in check_documented(folder)] == \
            [(1, b"one"), (2, b"two" * 10), (3, b"three"), (4, b"four")]


def _damaged(frames: bytes) -> bytes:
    """``frames`` with one byte of its first record's payload flipped."""
    b = bytearray(frames)
    b[REC_BYTES + 2] ^= 0x5A
    return bytes(b)


@pytest.mark.parametrize("after", ["its own write's records", "a later write's record",
                                   "the record that belongs there"])
def test_damage_is_a_torn_last_write_only_without_a_later_write_after_it(tmp_path, caplog,
                                                                        after):
    """Records framed here after three good ones: a write of three records (group 4)
    whose first is damaged and whose other two reached the disk (a write's pages may
    land in any order) was never acknowledged: it is dropped whole with one warning, at
    the damaged record's offset, and the next record is 4.  The same damage followed by
    a record of a later write (group 5), or by a valid record 4 itself, is damage no
    crash leaves: refused by the writer and by a reader, naming the file and the
    damaged record's offset, and nothing is changed."""
    folder = tmp_path / "wal"
    write_log(folder, [b"one", b"two", b"three"])
    path = log_files(folder)[0]
    end = f4.parse_log_file(path)["end"]
    bad = _damaged(frame(4, 4, b"four" * 8))
    tail = {"its own write's records": bad + frame(5, 4, b"five") + frame(6, 4, b"six"),
            "a later write's record": bad + frame(5, 5, b"five"),
            "the record that belongs there": bad + frame(4, 4, b"four" * 8)}[after]
    append_unsynced(path, tail)
    if after == "its own write's records":
        assert list(WriteAheadLog.read(folder)) == [(1, b"one"), (2, b"two"), (3, b"three")]
        with caplog.at_level(logging.WARNING, logger="memgas_gpu.wal"):
            with WriteAheadLog.open(folder) as w:
                assert w.last_lsn == 3 and w.append(b"four") == 4
        warned = wal_warnings(caplog)
        assert len(warned) == 1 and warned[0].startswith(
            f"{path}: dropped {len(tail)} bytes ") and f"(offset {end})" in warned[0], warned
        assert lsns(folder) == [1, 2, 3, 4]
        return
    before = f4.folder_bytes(folder)
    with pytest.raises(WALCorruptionError, match=rf"^{path}: offset {end}: "):
        WriteAheadLog.open(folder)
    with pytest.raises(WALCorruptionError, match=rf"^{path}: offset {end}: "):
        list(WriteAheadLog.read(folder))
    assert f4.folder_bytes(folder) == before
    assert wal_warnings(caplog) == []


def test_truncate_through_removes_exactly_the_covered_files(tmp_path):
    """For every number: the files whose records are all at or before it go, oldest
    first, then the log folder is fsync'd; the one holding the next record stays, and
    every later record still replays."""
    src = tmp_path / "src"
    data = payloads(10, salt=9)
    write_log(src, data, rotate_every=3)
    spans = [(1, 3), (4, 6), (7, 9), (10, 10)]
    assert [int(p.stem) for p in log_files(src)] == [a for a, _ in spans]
    for lsn in range(len(data) + 1):
        folder = tmp_path / f"t{lsn}"
        shutil.copytree(src, folder)
        if lsn == len(data):
            keep = [len(data) + 1]  # all covered: a new empty file keeps the next number
        else:
            keep = [a for a, b in spans if b > lsn]
        gone = [a for a, b in spans if a not in keep]
        with WriteAheadLog.open(folder) as w, FSRecorder(folder) as rec:
            assert w.truncate_through(lsn) == len(gone), lsn
            assert [int(p.stem) for p in log_files(folder)] == keep, lsn
            assert list(w.replay(lsn)) == list(enumerate(data, 1))[lsn:], lsn
        unlinked = rec.find("unlink", "*.log")
        assert [int(Path(rec.events[i].path).stem) for i in unlinked] == gone, \
            f"truncate_through({lsn}) removed {[rec.events[i] for i in unlinked]}"
        if gone:
            assert rec.find("fsync", ".", "dir", start=unlinked[-1]), lsn
        assert list(WriteAheadLog.read(folder, lsn)) == list(enumerate(data, 1))[lsn:]
        shutil.rmtree(folder)


def test_a_truncation_cut_short_leaves_a_log_that_opens(tmp_path):
    """Files are removed oldest first, so a truncation that stops halfway (here the
    second removal fails) leaves a suffix of the log, which opens and replays."""
    folder = tmp_path / "wal"
    data = payloads(10, salt=11)
    write_log(folder, data, rotate_every=3)
    with WriteAheadLog.open(folder) as w, FSRecorder(folder) as rec:
        rec.fail_at(2, errno.EIO, ops=("unlink",))
        with pytest.raises(OSError):
            w.truncate_through(9)
    assert [e.op for e in rec.failures] == ["fail"]
    with WriteAheadLog.open(folder) as w:
        first = w.first_lsn
        assert first in (4, 7)
        assert list(w.replay(first - 1)) == list(enumerate(data, 1))[first - 1:]
    check_documented(folder)


def test_writes_are_published_in_log_order_once_their_write_is_synced(tmp_path, enc,
                                                                     monkeypatch):
    """Three writes queued while another write's fsync is under way go out as one
    write of three records (one group, one fsync); each memory state is published only
    after the fsync that covers its record, in the order of the records (a state holds
    exactly the writes of the records up to its own), and the memory's number is the
    last record's."""
    from memgas_gpu.retrieve import MemoryIndex

    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    for c in "ABCD":  # encoded and stored once: the writes below encode nothing
        add(mem, "warm", "ABCD".index(c), f"w{c}", enc)
    mem.checkpoint()
    base = mem.log_stats.appends
    gate, waiting = threading.Event(), threading.Event()
    events: list = []
    lock = threading.Lock()
    real_fsync = os.fsync
    wal_dir = os.path.realpath(folder / "wal")

    def fsync(fd):
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = ""
        if where.startswith(wal_dir) and where.endswith(".log"):
            with lock:
                events.append(("fsync", None))
            if not waiting.is_set():  # the first write's fsync waits for the others
                waiting.set()
                assert gate.wait(60)
        return real_fsync(fd)

    real_publish = MemoryIndex._publish

    def publish(self, state, stale):
        if self is mem:
            with lock:
                events.append(("publish", sorted(s.meta.id for s in state.segments
                                                 if s.meta.id != "warm")))
        return real_publish(self, state, stale)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(MemoryIndex, "_publish", publish)
    errors: list = []

    def write(c):
        try:
            add(mem, c, "ABCD".index(c), f"w{c}", enc)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    first = threading.Thread(target=write, args=("A",))
    first.start()
    assert waiting.wait(60)
    others = [threading.Thread(target=write, args=(c,)) for c in "BCD"]
    for t in others:
        t.start()
    deadline = time.monotonic() + 60
    while len(mem._pending) < 4 and time.monotonic() < deadline:  # all three queued
        time.sleep(0.005)
    gate.set()
    for t in [first, *others]:
        t.join(60)
    monkeypatch.undo()
    assert not errors, errors
    records = check_documented(folder / "wal")
    order = [f4.record_ops(p)[0]["conversation"] for _, _, p in records]
    n = [lsn for lsn, _, _ in records]
    assert order[0] == "A" and sorted(order) == list("ABCD"), order
    assert [g for _, g, _ in records] == [n[0], n[1], n[1], n[1]], "not one write of three"
    # each publish comes after the fsync covering its record, in log order
    fsyncs = [i for i, e in enumerate(events) if e[0] == "fsync"]
    published = [(i, e[1]) for i, e in enumerate(events) if e[0] == "publish"]
    assert len(fsyncs) == 2, events
    assert [p for _, p in published] == [sorted(order[:k]) for k in range(1, 5)], events
    assert published[0][0] > fsyncs[0] and all(i > fsyncs[1] for i, _ in published[1:]), \
        events
    assert mem.log_stats.appends - base == 4
    assert mem.storage_stats()["lsn"] == n[-1]
    mem.close()


# ---------------------------------------------------------------- a memory's helpers
NO_AUTO = {"checkpoint_bytes": 1 << 40, "checkpoint_seconds": 1e9}
QUESTIONS = ["What breed is Rex?", "When is the violin recital?"]


@pytest.fixture(scope="module")
def bert(tiny_bert) -> str:
    pytest.importorskip("Stemmer")
    return tiny_bert


@pytest.fixture(scope="module")
def enc(bert):
    from memgas_gpu.encode import Encoder

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster on a shared machine
    yield Encoder(bert, device="cpu", max_length=64)
    torch.set_num_threads(threads)


def add(mem, cid: str, p: int, sid: str, enc) -> None:
    from _memory_model import POOL

    from memgas_gpu import Session

    mem.add_session(cid, Session(sid, "2023-06-01", POOL[p].turns), encoder=enc)


def fresh(enc):
    from memgas_gpu import Dataset
    from memgas_gpu.retrieve import MemoryIndex

    return MemoryIndex.build(Dataset([]), enc, device="cpu", progress=False)


def same_memory(a, b, enc, what: str) -> None:
    """``a`` holds what ``b`` holds: conversations, sessions, embeddings, graphs and the
    answers to a few questions."""
    assert [c.id for c in a.conversations] == [c.id for c in b.conversations], what
    for ca, cb in zip(a.conversations, b.conversations):
        assert ca.session_ids == cb.session_ids, (what, ca.id)
        assert ca.session_dates == cb.session_dates, (what, ca.id)
        assert a.sessions(ca.id) == b.sessions(cb.id), (what, ca.id)
        for sid in ca.session_ids:
            assert a.get_session(ca.id, sid) == b.get_session(cb.id, sid), (what, ca.id)
        va, vb = a.view([ca.id]), b.view([cb.id])
        torch.testing.assert_close(va.gran[va.row_slot], vb.gran[vb.row_slot], rtol=0,
                                   atol=1e-5, msg=f"{what} {ca.id}")
        ga, gb = va.graph(), vb.graph()
        assert torch.equal(ga[0], gb[0]) and torch.equal(ga[1], gb[1]), (what, ca.id)
        if ca.session_ids:
            for x, y in zip(a.search(ca.id, QUESTIONS, k=5, encoder=enc),
                            b.search(cb.id, QUESTIONS, k=5, encoder=enc)):
                assert x.session_ids == y.session_ids, (what, ca.id)
