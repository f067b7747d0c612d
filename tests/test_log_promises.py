"""The promises of the write-ahead log and of recovery (docs/index-format.md, "A durable
memory (version 3)"; docs/failure.md, "A durable memory"), each checked against an
oracle that does not use the code under test:

* the log's bytes, parsed here with ``struct`` and ``zlib`` as the format is written
  down (a 24-byte header ``MGAS-WAL | version u32 | first LSN u64 | CRC-32 of those 20
  bytes``; records ``length u32 | CRC-32 of (LSN u64 + payload) u32 | LSN u64 |
  payload``, little-endian), and records framed here the same way;
* the files and fsyncs the operating system saw (``os.fsync`` and ``Path.unlink``
  recorded, each descriptor named by ``/proc/self/fd``);
* a list of the payloads written, a count of the checkpoints the log's size asks for,
  and an in-RAM memory given the same writes.

tests/test_wal.py and tests/test_durable.py check the log and the memory through their
own API; these check what the bytes, the files and the order of events must be.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from memgas_gpu.storage.log import WALCorruptionError, WriteAheadLog

HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------- the format, as documented
MAGIC = b"MGAS-WAL"
HEAD = struct.Struct("<8sIQ")  # magic, format version, first LSN; then CRC-32 (u32)
HEADER_BYTES = 24
REC = struct.Struct("<IIQ")  # length, CRC-32 of (LSN + payload), LSN
REC_BYTES = 16


def doc_header(first_lsn: int, version: int = 1) -> bytes:
    head = HEAD.pack(MAGIC, version, first_lsn)
    return head + struct.pack("<I", zlib.crc32(head))


def doc_crc(lsn: int, payload: bytes) -> int:
    return zlib.crc32(struct.pack("<Q", lsn) + payload)


def doc_frame(lsn: int, payload: bytes, crc: int | None = None) -> bytes:
    crc = doc_crc(lsn, payload) if crc is None else crc
    return REC.pack(len(payload), crc, lsn) + payload


def parse_file(path: Path) -> dict:
    """A log file read as the format says, without trusting its checksums: the header's
    fields and every whole record ``(offset, length, crc, lsn, payload)``; ``end`` is
    where the last whole record ends, ``size`` the file's size."""
    data = path.read_bytes()
    assert len(data) >= HEADER_BYTES, f"{path}: shorter than a header"
    magic, version, first = HEAD.unpack_from(data)
    (hcrc,) = struct.unpack_from("<I", data, HEAD.size)
    records, pos = [], HEADER_BYTES
    while pos + REC_BYTES <= len(data):
        length, crc, lsn = REC.unpack_from(data, pos)
        if pos + REC_BYTES + length > len(data):
            break
        records.append((pos, length, crc, lsn, data[pos + REC_BYTES:pos + REC_BYTES + length]))
        pos += REC_BYTES + length
    return {"magic": magic, "version": version, "first": first, "header_crc": hcrc,
            "head": data[:HEAD.size], "records": records, "end": pos, "size": len(data)}


def log_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".log")


def check_documented(folder: Path) -> list[tuple[int, bytes]]:
    """Every file of the log ``folder`` exactly as documented (name, header, header CRC,
    every record's CRC over LSN + payload, LSNs consecutive within and across files, no
    bytes after the last record); returns ``(LSN, payload)`` of every record."""
    out, expected = [], None
    for path in log_files(folder):
        f = parse_file(path)
        where = path.name
        assert f["magic"] == MAGIC and f["version"] == 1, where
        assert f["header_crc"] == zlib.crc32(f["head"]), \
            f"{where}: the header's CRC is not the CRC-32 of its first 20 bytes"
        assert f["first"] == int(path.stem), f"{where}: header says {f['first']}"
        assert f["end"] == f["size"], f"{where}: {f['size'] - f['end']} bytes after the last record"
        if expected is not None:
            assert f["first"] == expected, f"{where}: starts at {f['first']}, not {expected}"
        lsn = f["first"]
        for offset, length, crc, got, payload in f["records"]:
            assert got == lsn, f"{where} offset {offset}: record {got} where {lsn} belongs"
            assert crc == doc_crc(got, payload), (
                f"{where} offset {offset}: CRC {crc:#010x} is not CRC-32(LSN u64 LE + payload)"
                f" = {doc_crc(got, payload):#010x}"
                + (" (it is the payload's alone)" if crc == zlib.crc32(payload) else ""))
            out.append((got, payload))
            lsn += 1
        expected = lsn
    return out


def payloads(n: int, salt: int = 0) -> list[bytes]:
    sizes = (0, 1, 7, 16, 100, 333, 1000)
    return [bytes([(i + salt) % 256]) + os.urandom(sizes[i % len(sizes)]) for i in range(n)]


def write_log(folder: Path, data: list[bytes], rotate_every: int = 0, **kw) -> None:
    with WriteAheadLog.open(folder, **kw) as w:
        for i, p in enumerate(data, 1):
            assert w.append(p) == i
            if rotate_every and i % rotate_every == 0 and i < len(data):
                assert w.rotate()


def folder_bytes(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def wal_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "memgas_gpu.wal" and r.levelno >= logging.WARNING]


class Recorder:
    """``os.fsync`` and ``Path.unlink`` recorded as events ``(kind, path)``; each fsync'd
    descriptor named by ``/proc/self/fd`` (its path when it was synced)."""

    def __init__(self, monkeypatch) -> None:
        if not os.path.isdir("/proc/self/fd"):
            pytest.skip("needs /proc/self/fd to name a descriptor")
        self.events: list[tuple[str, str]] = []
        self.fail_unlink_at = None  # the n-th unlink (1-based) raises EIO
        real_fsync, real_unlink = os.fsync, Path.unlink
        rec = self

        def fsync(fd):
            try:
                where = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                where = f"fd {fd}"
            rec.events.append(("fsync", where))
            return real_fsync(fd)

        def unlink(path, missing_ok=False):
            n = sum(1 for k, _ in rec.events if k == "unlink") + 1
            rec.events.append(("unlink", str(path)))
            if rec.fail_unlink_at == n:
                raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
            return real_unlink(path, missing_ok=missing_ok)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(Path, "unlink", unlink)

    def mark(self, what: str) -> None:
        self.events.append((what, ""))

    def index(self, kind: str, path=None) -> int:
        """The position of the first event of ``kind`` (on ``path``), or -1."""
        want = None if path is None else os.path.realpath(path)
        for i, (k, p) in enumerate(self.events):
            if k == kind and (want is None or p == want):
                return i
        return -1


# ================================================================ 1. the record checksum
def test_every_header_and_record_checksum_is_exactly_as_documented(tmp_path):
    """Written by the log (rotated files, a reopen between appends), read here per the
    format: each header's CRC is over its 20 bytes, each record's over its LSN (u64
    little-endian) then its payload; and ``stats.bytes_written`` is what the records
    take on disk."""
    folder = tmp_path / "wal"
    data = payloads(40)
    with WriteAheadLog.open(folder, max_file_bytes=1500) as w:
        for p in data[:25]:
            w.append(p)
    with WriteAheadLog.open(folder, max_file_bytes=1500) as w:
        for p in data[25:]:
            w.append(p)
        written = w.stats.bytes_written
    records = check_documented(folder)
    assert records == list(enumerate(data, 1))
    assert len(log_files(folder)) >= 4  # the checks above crossed rotations
    assert written == sum(REC_BYTES + len(p) for p in data[25:])
    on_disk = sum(p.stat().st_size - HEADER_BYTES for p in log_files(folder))
    assert on_disk == sum(REC_BYTES + len(p) for p in data)


def test_records_framed_as_documented_are_read_back(tmp_path):
    """The reader's side of the same format: records framed here (CRC over LSN +
    payload) appended to a log file are replayed; the same records with a CRC over the
    payload alone are not (the last one: a torn tail, dropped)."""
    folder = tmp_path / "ok"
    write_log(folder, [b"one", b"two"])
    last = log_files(folder)[-1]
    with open(last, "ab") as f:
        f.write(doc_frame(3, b"three") + doc_frame(4, b"") + doc_frame(5, b"five" * 100))
    assert list(WriteAheadLog.read(folder)) == [(1, b"one"), (2, b"two"), (3, b"three"),
                                                (4, b""), (5, b"five" * 100)]
    with WriteAheadLog.open(folder) as w:
        assert [lsn for lsn, _ in w.replay()] == [1, 2, 3, 4, 5]
        assert w.append(b"six") == 6

    bad = tmp_path / "payload-only"
    write_log(bad, [b"one", b"two"])
    with open(log_files(bad)[-1], "ab") as f:
        f.write(doc_frame(3, b"three", crc=zlib.crc32(b"three")))
    assert list(WriteAheadLog.read(bad)) == [(1, b"one"), (2, b"two")]


@pytest.mark.parametrize("crc", ["as written", "payload only"])
def test_a_renumbered_file_is_refused_not_replayed(tmp_path, caplog, crc):
    """A copy of the first file put where the second belongs, its header and LSNs
    rewritten (a file moved, or records renumbered) and its CRC fields left as they
    were, or set to what a CRC of the payload alone would be: the checksum covers the
    LSN, so the log is refused (naming the file and the first record's offset) and
    nothing changes; as the last file, none of its records is replayed."""
    folder = tmp_path / "wal"
    data = payloads(9, salt=3)
    write_log(folder, data, rotate_every=3)
    files = log_files(folder)
    assert [int(p.stem) for p in files] == [1, 4, 7]
    src = parse_file(files[0])
    moved = bytearray(doc_header(4))
    for offset, length, old_crc, lsn, payload in src["records"]:
        new_crc = old_crc if crc == "as written" else zlib.crc32(payload)
        moved += REC.pack(length, new_crc, lsn + 3) + payload
    files[1].write_bytes(bytes(moved))
    before = folder_bytes(folder)
    name = str(files[1])
    with pytest.raises(WALCorruptionError, match=rf"^{name}: offset {HEADER_BYTES}: "):
        WriteAheadLog.open(folder)
    with pytest.raises(WALCorruptionError, match=rf"^{name}: offset {HEADER_BYTES}: "):
        list(WriteAheadLog.read(folder))
    assert folder_bytes(folder) == before  # nothing changed
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
def test_opening_a_log_fsyncs_its_last_file_before_it_returns(tmp_path, monkeypatch):
    """Records a killed writer wrote but never synced (framed here, appended without an
    fsync) are made durable by ``open``: the last file is fsync'd before ``open``
    returns, so before anyone can replay them."""
    folder = tmp_path / "wal"
    write_log(folder, [b"a", b"b", b"c"], rotate_every=2)
    last = log_files(folder)[-1]
    assert int(last.stem) == 3
    with open(last, "ab") as f:  # written, never synced: the writer was killed
        f.write(doc_frame(4, b"d") + doc_frame(5, b"e" * 50))
    rec = Recorder(monkeypatch)
    w = WriteAheadLog.open(folder)
    rec.mark("opened")
    try:
        synced = rec.index("fsync", last)
        assert 0 <= synced < rec.index("opened"), \
            f"the last log file was not fsync'd by open: {rec.events}"
        assert [lsn for lsn, _ in w.replay()] == [1, 2, 3, 4, 5]
    finally:
        w.close()


def test_recovery_fsyncs_the_last_log_file_before_replaying_it(tmp_path, monkeypatch, enc):
    """A memory whose writer was killed with its last record written but not synced:
    opening fsyncs the last log file before the first record is applied and before the
    recovery checkpoint writes anything, and that record is replayed."""
    from memgas_gpu.retrieve import MemoryIndex
    from memgas_gpu.storage import log as wal_module

    folder = tmp_path / "m"
    mem = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    add(mem, "A", 0, "s1", enc)
    with monkeypatch.context() as m:  # the last write: in the file, its fsync never ran
        m.setattr(wal_module.os, "fsync", lambda fd: None)
        add(mem, "A", 3, "s2", enc)
    mem._durable.abandon()
    last = log_files(folder / "wal")[-1]
    assert [lsn for lsn, _ in check_documented(folder / "wal")] == [1, 2]

    rec = Recorder(monkeypatch)
    real_apply = MemoryIndex._apply

    def apply(self, record):
        rec.mark("apply")
        return real_apply(self, record)

    monkeypatch.setattr(MemoryIndex, "_apply", apply)
    back = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    try:
        assert back.recovery["replayed"] == 2
        synced, applied = rec.index("fsync", last), rec.index("apply")
        assert synced >= 0, f"the last log file was never fsync'd: {rec.events}"
        assert 0 <= applied and synced < applied, \
            f"a record was applied before the log file was fsync'd: {rec.events}"
        root, logs = str(folder.resolve()), str((folder / "wal").resolve())
        wrote = [i for i, (k, p) in enumerate(rec.events) if k == "fsync"
                 and p.startswith(root + os.sep) and not p.startswith(logs)]
        assert wrote and synced < min(wrote), "the recovery checkpoint wrote first"
        assert [c.session_ids for c in back.conversations] == [["s1", "s2"]]
    finally:
        back._durable.abandon()


# ================================================================ 3. the checkpoint trigger
def test_the_log_size_trigger_is_reset_by_each_checkpoint(tmp_path, enc):
    """With ``checkpoint_bytes=X`` a write checkpoints once the log grew by X bytes
    since the last checkpoint: the checkpoints counted (the pointer's ``current``
    changing) are exactly what that rule says for the bytes each write logged, about
    bytes / X of them, and each leaves no record it covers in the log."""
    from memgas_gpu.retrieve import MemoryIndex

    folder = tmp_path / "m"
    x = 4500
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=x,
                           checkpoint_seconds=1e9)
    pointer = lambda: json.loads((folder / "manifest.json").read_text())["current"]  # noqa: E731
    current, at_last, expected, seen = pointer(), 0, [], []
    n = 18
    for i in range(n):
        add(mem, f"c{i % 3}", i % 8, f"x{i}", enc)
        logged = mem.log_stats.bytes_written
        if logged - at_last >= x:
            expected.append(i + 1)  # the LSN of this write
            at_last = logged
        now = pointer()
        if now != current:
            seen.append(i + 1)
            current = now
            manifest = json.loads((folder / now).read_text())
            assert manifest["lsn"] == i + 1  # it covers every write so far
            assert check_documented(folder / "wal") == []  # and the log holds none of them
    total = mem.log_stats.bytes_written
    mem._durable.abandon()
    assert seen == expected, f"checkpoints after writes {seen}, the rule says {expected}"
    assert 2 <= len(seen) <= total // x, (len(seen), total, x)


# ================================================================ 4. the LSN after replay
OPS = [("checkpoint",), ("add", "A", 0, "s1"), ("remove", "A", "s1"), ("add", "A", 1, "s1"),
       ("add", "B", 5, "s4")]


def run_ops(mem, enc, ops) -> None:
    for op in ops:
        if op[0] == "add":
            add(mem, op[1], op[2], op[3], enc)
        elif op[0] == "remove":
            mem.remove_session(op[1], op[2])
        elif op[0] == "checkpoint":
            if mem.folder is not None:
                mem.checkpoint()


def checkpoint_lsn(folder: Path) -> int:
    name = json.loads((folder / "manifest.json").read_text())["current"]
    return json.loads((folder / name).read_text())["lsn"]


def crashed_writer(folder: Path, enc):
    """Record 1 covered by a checkpoint; records 2..5 (an add, its removal, the same
    session id with other content, another add) only in the log, the writer let go
    without a checkpoint. Returns the in-RAM memory given the same writes."""
    from memgas_gpu.retrieve import MemoryIndex

    model = fresh(enc)
    mem = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    for m in (mem, model):
        add(m, "B", 3, "s2", enc)
        run_ops(m, enc, OPS)
    mem._durable.abandon()
    return model


def check_recovered(folder: Path, model, enc) -> None:
    from memgas_gpu.retrieve import MemoryIndex

    assert checkpoint_lsn(folder) == 1
    assert [lsn for lsn, _ in check_documented(folder / "wal")] == [2, 3, 4, 5]
    back = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    assert back.recovery["replayed"] == 4
    # the recovery checkpoint covers the replayed records and the log holds none of them
    assert checkpoint_lsn(folder) == 5
    assert check_documented(folder / "wal") == []
    assert [int(p.stem) for p in log_files(folder / "wal")] == [6]
    same_memory(back, model, enc, "recovered")
    back._durable.abandon()  # killed again, right after recovery
    again = MemoryIndex.open(folder, encoder=enc, **NO_AUTO)
    try:
        assert again.recovery["replayed"] == 0
        assert checkpoint_lsn(folder) == 5
        same_memory(again, model, enc, "reopened")
        for m in (again, model):  # the next write is record 6
            add(m, "A", 6, "s9", enc)
        assert [lsn for lsn, _ in check_documented(folder / "wal")] == [6]
    except BaseException:
        again._durable.abandon()
        raise
    again.close()
    assert checkpoint_lsn(folder) == 6
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
import json, sys, time
sys.path.insert(0, sys.argv[3])
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
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(folder), bert, str(HERE)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    try:
        line = child.stdout.readline()
        assert line == "acked\n", child.stderr.read()[-3000:] if child.poll() is not None \
            else line
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    model = fresh(enc)
    add(model, "B", 3, "s2", enc)
    run_ops(model, enc, OPS)
    check_recovered(folder, model, enc)


# ================================================================ 5. more promises
def test_lsns_are_consecutive_across_rotated_files_and_replay_starts_anywhere(tmp_path):
    """Files rotated by size, by ``rotate()`` and by reopening: each file is named by its
    first record, the LSNs run 1, 2, 3, ... across files, and replaying (or reading)
    after any LSN gives exactly the records after it, file boundaries included."""
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
        assert check_documented(folder) == want
        firsts = [int(p.stem) for p in log_files(folder)]
        assert len(firsts) >= 6
        for after in range(len(data) + 1):
            assert list(w.replay(after)) == want[after:], after
    for after in [0] + [f - 1 for f in firsts] + [f for f in firsts]:
        assert list(WriteAheadLog.read(folder, after)) == want[after:], after


def test_a_torn_tail_is_cut_at_the_last_whole_record_with_one_warning(tmp_path, caplog):
    """A record framed here and cut short at several lengths: ``open`` truncates the
    file exactly where the last whole record ends (its offset computed here), logs one
    warning naming the file, the bytes dropped and the offset; a reopen warns no more,
    and the next record goes where the torn one began."""
    frame = doc_frame(4, b"the torn record" * 4)
    for cut in (1, REC_BYTES - 1, REC_BYTES, REC_BYTES + 1, len(frame) - 1):
        folder = tmp_path / f"cut{cut}"
        write_log(folder, [b"one", b"two" * 10, b"three"])
        path = log_files(folder)[0]
        end = parse_file(path)["end"]
        with open(path, "ab") as f:
            f.write(frame[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="memgas_gpu.wal"):
            with WriteAheadLog.open(folder) as w:
                assert w.last_lsn == 3
            warned = wal_warnings(caplog)
            assert len(warned) == 1, (cut, warned)
            assert warned[0].startswith(f"{path}: dropped a torn tail of {cut} bytes "), warned
            assert f"(offset {end})" in warned[0], warned
            assert path.stat().st_size == end, cut
            caplog.clear()
            with WriteAheadLog.open(folder) as w:
                assert w.append(b"four") == 4
            assert wal_warnings(caplog) == []
        assert check_documented(folder) == [(1, b"one"), (2, b"two" * 10), (3, b"three"),
                                            (4, b"four")]


def test_truncate_through_removes_exactly_the_covered_files(tmp_path, monkeypatch):
    """For every LSN: the files whose records are all at or before it go, oldest first,
    the one holding the next record stays, and every later record still replays."""
    src = tmp_path / "src"
    data = payloads(10, salt=9)
    write_log(src, data, rotate_every=3)
    spans = [(1, 3), (4, 6), (7, 9), (10, 10)]
    assert [int(p.stem) for p in log_files(src)] == [a for a, _ in spans]
    rec = Recorder(monkeypatch)
    for lsn in range(len(data) + 1):
        folder = tmp_path / f"t{lsn}"
        shutil.copytree(src, folder)
        if lsn == len(data):
            keep = [len(data) + 1]  # all covered: a new empty file keeps the next LSN
        else:
            keep = [a for a, b in spans if b > lsn]
        gone = [a for a, b in spans if a not in keep]
        rec.events.clear()
        with WriteAheadLog.open(folder) as w:
            assert w.truncate_through(lsn) == len(gone), lsn
            assert [int(p.stem) for p in log_files(folder)] == keep, lsn
            assert list(w.replay(lsn)) == list(enumerate(data, 1))[lsn:], lsn
        unlinked = [int(Path(p).stem) for k, p in rec.events
                    if k == "unlink" and p.endswith(".log")]
        assert unlinked == gone, f"truncate_through({lsn}) removed {unlinked}, in that order"
        assert list(WriteAheadLog.read(folder, lsn)) == list(enumerate(data, 1))[lsn:]


def test_a_truncation_cut_short_leaves_a_log_that_opens(tmp_path, monkeypatch):
    """Files are removed oldest first, so a truncation that stops halfway (here the
    second removal fails) leaves a suffix of the log, which opens and replays."""
    folder = tmp_path / "wal"
    data = payloads(10, salt=11)
    write_log(folder, data, rotate_every=3)
    rec = Recorder(monkeypatch)
    rec.fail_unlink_at = 2
    with WriteAheadLog.open(folder) as w:
        with pytest.raises(OSError):
            w.truncate_through(9)
    monkeypatch.undo()
    with WriteAheadLog.open(folder) as w:
        first = w.first_lsn
        assert first in (4, 7)
        assert list(w.replay(first - 1)) == list(enumerate(data, 1))[first - 1:]
    check_documented(folder)


def test_records_are_published_in_log_order_once_their_group_is_synced(tmp_path,
                                                                        monkeypatch):
    """Three writes queued before one group's write: their states are published after
    the group's fsync, in the order of their records, and the memory's LSN is the
    last one's."""
    from memgas_gpu.storage.commit import Written
    from memgas_gpu.memory.durable import Durable

    class Index:
        def __init__(self) -> None:
            self.published = []

        def _publish(self, state, stale):
            rec.mark(f"publish {state}")
            self.published.append(state)

    wal = WriteAheadLog.open(tmp_path / "wal")
    rec = Recorder(monkeypatch)
    idx = Index()
    d = Durable(idx, tmp_path, wal, None, Written(), 1 << 40, 1e12, False)
    try:
        tickets = [d.submit(f"record {i}".encode(), f"state {i}", ()) for i in (1, 2, 3)]
        d.commit(tickets[-1])
        assert idx.published == ["state 1", "state 2", "state 3"]
        assert [t.lsn for t in tickets] == [1, 2, 3] and d.lsn == 3
        synced = rec.index("fsync", tmp_path / "wal" / f"{1:020d}.log")
        assert 0 <= synced < rec.index("publish state 1"), rec.events
        assert check_documented(tmp_path / "wal") == [(i, f"record {i}".encode())
                                                       for i in (1, 2, 3)]
        d.submit(b"record 4", "state 4", ())
        d.drain()
        assert idx.published[-1] == "state 4" and d.lsn == 4
    finally:
        d.abandon()


# ---------------------------------------------------------------- a memory's helpers
NO_AUTO = {"checkpoint_bytes": 1 << 40, "checkpoint_seconds": 1e9}
QUESTIONS = ["What breed is Rex?", "When is the violin recital?"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> str:
    pytest.importorskip("Stemmer")
    from memgas_gpu.encode.tiny import make_random_bert

    return make_random_bert(str(tmp_path_factory.mktemp("bert")))


@pytest.fixture(scope="module")
def enc(bert):
    from memgas_gpu.encode import Encoder

    return Encoder(bert, device="cpu", max_length=64)


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
        va, vb = a.view([ca.id]), b.view([cb.id])
        torch.testing.assert_close(va.gran[va.row_slot], vb.gran[vb.row_slot], rtol=0,
                                   atol=1e-5, msg=f"{what} {ca.id}")
        ga, gb = va.graph(), vb.graph()
        assert torch.equal(ga[0], gb[0]) and torch.equal(ga[1], gb[1]), (what, ca.id)
        if ca.session_ids:
            for x, y in zip(a.search(ca.id, QUESTIONS, k=5, encoder=enc),
                            b.search(cb.id, QUESTIONS, k=5, encoder=enc)):
                assert x.session_ids == y.session_ids, (what, ca.id)
