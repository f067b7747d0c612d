"""The write-ahead log (memgas_gpu/storage/log.py): framing, torn tails, damage,
group commit, rotation and truncation, failed writes, and writers killed at random
moments.  The oracle is always the list of payloads written (and, for a killed writer,
the LSNs it acknowledged)."""
from __future__ import annotations

import errno
import logging
import os
import random
import re
import shutil
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest
from _child import Child
from _wal_child import parse, payload

from memgas_gpu.storage import log as wal_module
from memgas_gpu.storage.lock import IndexLockError
from memgas_gpu.storage.log import (HEADER_BYTES, MAX_RECORD_BYTES, RECORD_HEADER_BYTES,
                                     RecordTooLargeError, WALCorruptionError, WALError,
                                     WriteAheadLog)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _payloads(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    sizes = [0, 1, 3, 16, 100, 1000, 4096]
    return [bytes([i % 256]) + rng.randbytes(rng.choice(sizes)) for i in range(n)]


def _write(folder: Path, payloads, **kw) -> list[int]:
    with WriteAheadLog.open(folder, **kw) as w:
        return [w.append(p) for p in payloads]


def _replayed(folder: Path, **kw) -> list[bytes]:
    with WriteAheadLog.open(folder, **kw) as w:
        records = list(w.replay())
    assert [lsn for lsn, _ in records] == list(range(records[0][0], records[0][0] + len(records))) \
        if records else True
    return [p for _, p in records]


def _logs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".log")


def _join(threads) -> None:
    """Join ``threads``; one still running after 30 s waits forever (a failure, not a
    hung test run)."""
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads), "an appender is still waiting"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "memgas_gpu.wal" and r.levelno == logging.WARNING]


# ---------------------------------------------------------------- round trip
def test_round_trip_keeps_every_payload_and_numbers_them_from_1(tmp_path, caplog):
    folder = tmp_path / "idx" / "wal"
    payloads = _payloads(60) + [b"", b"\x00" * 17, bytes(range(256))]
    assert _write(folder, payloads[:30]) == list(range(1, 31))
    with WriteAheadLog.open(folder) as w:  # a reopened log continues the numbering
        assert (w.first_lsn, w.last_lsn) == (1, 30)
        assert [w.append(p) for p in payloads[30:]] == list(range(31, len(payloads) + 1))
        assert [p for _, p in w.replay()] == payloads
        assert list(w.replay(after_lsn=40)) == list(enumerate(payloads[40:], 41))
        assert list(w.replay(after_lsn=len(payloads))) == []
    assert list(WriteAheadLog.read(folder)) == list(enumerate(payloads, 1))
    assert list(WriteAheadLog.read(folder, after_lsn=62)) == [(63, payloads[62])]
    assert _replayed(folder) == payloads
    assert _warnings(caplog) == []
    assert (folder / "00000000000000000001.log").read_bytes()[:8] == b"MGAS-WAL"


def test_payloads_must_be_bytes_and_lsns_integers(tmp_path):
    with WriteAheadLog.open(tmp_path) as w:
        with pytest.raises(TypeError, match="expected bytes, got str"):
            w.append("text")
        assert w.append(bytearray(b"ab")) == 1 and w.append(memoryview(b"cd")) == 2
        with pytest.raises(TypeError, match="after_lsn"):
            w.replay(-1)
        with pytest.raises(TypeError, match="truncate_through"):
            w.truncate_through(True)
    with pytest.raises(TypeError, match="WriteAheadLog.open"):
        WriteAheadLog(tmp_path)
    with pytest.raises(ValueError, match="max_record_bytes"):
        WriteAheadLog.open(tmp_path, max_record_bytes=MAX_RECORD_BYTES + 1)
    with pytest.raises(ValueError, match="max_file_bytes"):
        WriteAheadLog.open(tmp_path, max_file_bytes=0)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(WALError, match="not a folder"):
        WriteAheadLog.open(tmp_path / "file")


def test_a_closed_log_refuses_appends_and_close_is_idempotent(tmp_path):
    w = WriteAheadLog.open(tmp_path)
    w.append(b"a")
    w.close()
    w.close()
    assert w.closed
    with pytest.raises(WALError, match="closed"):
        w.append(b"b")
    with pytest.raises(WALError, match="closed"):
        w.rotate()
    assert _replayed(tmp_path) == [b"a"]


def test_one_writer_at_a_time_and_the_lock_names_it(tmp_path):
    with WriteAheadLog.open(tmp_path) as w:
        w.append(b"a")
        with pytest.raises(IndexLockError, match=rf"\.lock: the log is open for writing by "
                                                 rf"process {os.getpid()}"):
            WriteAheadLog.open(tmp_path)
        assert list(WriteAheadLog.read(tmp_path)) == [(1, b"a")]  # readers take no lock
    with WriteAheadLog.open(tmp_path) as w:  # released on close
        assert w.last_lsn == 1


# ---------------------------------------------------------------- torn tails
def test_a_torn_tail_at_every_byte_of_the_last_record_is_dropped_with_one_warning(tmp_path,
                                                                                 caplog):
    src = tmp_path / "src"
    payloads = _payloads(3, seed=1)[:2] + [b"last record, forty bytes long........."]
    _write(src, payloads)
    log_file = _logs(src)[0]
    full = log_file.read_bytes()
    start = len(full) - RECORD_HEADER_BYTES - len(payloads[-1])
    for cut in range(start, len(full)):
        folder = tmp_path / f"cut{cut}"
        shutil.copytree(src, folder)
        (folder / log_file.name).write_bytes(full[:cut])
        caplog.clear()
        assert _replayed(folder) == payloads[:-1], cut
        warned = _warnings(caplog)
        if cut == start:
            assert warned == []  # nothing torn: the last record was never begun
            continue
        assert len(warned) == 1, (cut, warned)
        assert f"{folder / log_file.name}: dropped {cut - start} bytes " \
               f"after record 2 (offset {start})" in warned[0]
        assert (folder / log_file.name).stat().st_size == start  # truncated on disk
        caplog.clear()
        with WriteAheadLog.open(folder) as w:  # the next LSN is the dropped record's
            assert w.append(b"again") == 3
        assert _replayed(folder) == payloads[:-1] + [b"again"] and _warnings(caplog) == []


def test_garbage_after_the_last_record_is_dropped(tmp_path, caplog):
    payloads = _payloads(5, seed=2)
    for garbage in (b"\x00" * 4096, random.Random(3).randbytes(3000), b"\xff" * 20):
        folder = tmp_path / str(len(garbage))
        _write(folder, payloads)
        with open(_logs(folder)[0], "ab") as f:
            f.write(garbage)
        caplog.clear()
        assert _replayed(folder) == payloads
        assert len(_warnings(caplog)) == 1 and f"{len(garbage)} bytes" in _warnings(caplog)[0]


def test_every_flipped_byte_of_the_last_record_is_dropped(tmp_path, caplog):
    """Its length, checksum, LSN or payload: a crash mid-append can leave any of them."""
    src = tmp_path / "src"
    payloads = _payloads(4, seed=4)[:3] + [b"the last one"]
    _write(src, payloads)
    log_file = _logs(src)[0]
    full = log_file.read_bytes()
    start = len(full) - RECORD_HEADER_BYTES - len(payloads[-1])
    for at in range(start, len(full)):
        folder = tmp_path / f"flip{at}"
        shutil.copytree(src, folder)
        bad = bytearray(full)
        bad[at] ^= 0x40
        (folder / log_file.name).write_bytes(bytes(bad))
        caplog.clear()
        assert _replayed(folder) == payloads[:-1], at
        assert len(_warnings(caplog)) == 1, at


def test_a_reader_stops_quietly_at_a_torn_tail_and_changes_nothing(tmp_path, caplog):
    payloads = _payloads(4, seed=5)
    _write(tmp_path, payloads)
    log_file = _logs(tmp_path)[0]
    torn = log_file.read_bytes()[:-3]
    log_file.write_bytes(torn)
    assert [p for _, p in WriteAheadLog.read(tmp_path)] == payloads[:-1]
    assert log_file.read_bytes() == torn and _warnings(caplog) == []


# ---------------------------------------------------------------- damage is refused
def _flip(path: Path, at: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    return bytes(data)


def _offsets(path: Path) -> list[int]:
    """The offset of each record in a log file."""
    data, pos, out = path.read_bytes(), HEADER_BYTES, []
    while pos < len(data):
        out.append(pos)
        pos += RECORD_HEADER_BYTES + int.from_bytes(data[pos:pos + 4], "little")
    return out


def test_a_flipped_byte_in_a_middle_record_is_refused_naming_file_and_offset(tmp_path,
                                                                           caplog):
    payloads = _payloads(6, seed=6)
    for record in range(5):  # every record but the last, in its payload and its header
        for where in (RECORD_HEADER_BYTES, 0, 4, 8):
            folder = tmp_path / f"{record}-{where}"
            _write(folder, payloads)
            log_file = _logs(folder)[0]
            offset = _offsets(log_file)[record]
            if where == RECORD_HEADER_BYTES and not payloads[record]:
                continue
            damaged = _flip(log_file, offset + where)
            with pytest.raises(WALCorruptionError, match=rf"^{re.escape(str(log_file))}: "
                                                         rf"offset {offset}: .*a valid record "
                                                         r".* follows"):
                WriteAheadLog.open(folder)
            assert log_file.read_bytes() == damaged  # nothing changed
            assert _warnings(caplog) == []
    with pytest.raises(WALCorruptionError):  # and refused for good: no silent second try
        WriteAheadLog.open(folder)


def test_a_zeroed_block_followed_by_good_records_is_refused(tmp_path):
    """What a lost page looks like; record 256 after it has a zero byte in its LSN."""
    payloads = [b"%03d" % i for i in range(1, 261)]
    _write(tmp_path, payloads)
    f = _logs(tmp_path)[0]
    offsets = _offsets(f)
    data = bytearray(f.read_bytes())
    data[offsets[250]:offsets[255]] = bytes(offsets[255] - offsets[250])
    f.write_bytes(bytes(data))
    with pytest.raises(WALCorruptionError, match=rf"offset {offsets[250]}: .*a valid record "
                                                 rf"\(256\) of a later write follows at offset {offsets[255]}"):
        WriteAheadLog.open(tmp_path)


def test_a_valid_record_out_of_sequence_is_refused(tmp_path):
    """A second copy of record 2 between records 3 and 4: its checksum is right."""
    payloads = _payloads(5, seed=11)
    _write(tmp_path, payloads)
    f = _logs(tmp_path)[0]
    offsets = _offsets(f)
    data = f.read_bytes()
    f.write_bytes(data[:offsets[3]] + data[offsets[1]:offsets[2]] + data[offsets[3]:])
    with pytest.raises(WALCorruptionError, match=rf"offset {offsets[3]}: record 2 where record "
                                                 r"4 belongs, and a valid record \(4\) of a later write"):
        WriteAheadLog.open(tmp_path)


def test_damage_in_a_file_before_the_last_is_refused_even_at_its_end(tmp_path):
    payloads = _payloads(6, seed=7)
    with WriteAheadLog.open(tmp_path) as w:
        for p in payloads[:3]:
            w.append(p)
        w.rotate()
        for p in payloads[3:]:
            w.append(p)
    first = _logs(tmp_path)[0]
    data = first.read_bytes()
    first.write_bytes(data[:-1])  # the last record of the first file cut short
    name = re.escape(str(first))
    with pytest.raises(WALCorruptionError, match=rf"^{name}: offset \d+: .*before the last"):
        WriteAheadLog.open(tmp_path)
    with pytest.raises(WALCorruptionError, match=rf"^{name}: offset"):
        list(WriteAheadLog.read(tmp_path))
    assert first.read_bytes() == data[:-1]


def test_a_missing_file_or_a_bad_header_is_refused(tmp_path):
    payloads = _payloads(9, seed=8)
    with WriteAheadLog.open(tmp_path) as w:
        for i, p in enumerate(payloads):
            w.append(p)
            if i % 3 == 2:
                w.rotate()
    files = _logs(tmp_path)
    assert [f.name for f in files] == [f"{n:020d}.log" for n in (1, 4, 7, 10)]
    moved = files[1].rename(tmp_path / "aside")
    with pytest.raises(WALCorruptionError, match=r"jumps from record 3 .* to 7"):
        WriteAheadLog.open(tmp_path)
    with pytest.raises(WALCorruptionError, match=r"jumps from record 3"):
        list(WriteAheadLog.read(tmp_path))
    moved.rename(files[1])
    for at, what in ((0, "not a memgas_gpu write-ahead log"), (13, "header's checksum")):
        _flip(files[1], at)
        with pytest.raises(WALCorruptionError, match=rf"{re.escape(str(files[1]))}: .*{what}"):
            WriteAheadLog.open(tmp_path)
        _flip(files[1], at)
    assert _replayed(tmp_path) == payloads


def test_a_newer_format_asks_for_an_upgrade(tmp_path):
    _write(tmp_path, [b"a"])
    f = _logs(tmp_path)[0]
    data = bytearray(f.read_bytes())
    data[8] = 3
    data[20:24] = struct.pack("<I", zlib.crc32(bytes(data[:20])))  # a real newer header
    f.write_bytes(bytes(data))
    with pytest.raises(WALError, match="version 3 is newer .* upgrade memgas_gpu"):
        WriteAheadLog.open(tmp_path)
    data[8] = 4  # a damaged header byte is damage, not a version (its checksum first)
    f.write_bytes(bytes(data))
    with pytest.raises(WALCorruptionError, match="header's checksum"):
        WriteAheadLog.open(tmp_path)


# ---------------------------------------------------------------- the bound on a record
def test_a_record_over_the_bound_is_refused_before_anything_is_written(tmp_path):
    with WriteAheadLog.open(tmp_path, max_record_bytes=100) as w:
        w.append(b"x" * 100)
        size, stats = _logs(tmp_path)[0].stat().st_size, w.stats
        with pytest.raises(RecordTooLargeError, match=r"a record of 101 bytes, more than the "
                                                      r"100 .* nothing was written"):
            w.append(b"x" * 101)
        assert _logs(tmp_path)[0].stat().st_size == size and w.stats == stats
        assert w.append(b"y") == 2
    assert _replayed(tmp_path) == [b"x" * 100, b"y"]


def test_a_length_beyond_the_format_bound_is_damage_not_an_allocation(tmp_path, caplog):
    _write(tmp_path, [b"a", b"b"])
    f = _logs(tmp_path)[0]
    data = bytearray(f.read_bytes())
    data[_offsets(f)[1]:_offsets(f)[1] + 4] = (MAX_RECORD_BYTES + 1).to_bytes(4, "little")
    f.write_bytes(bytes(data))
    assert _replayed(tmp_path) == [b"a"]
    assert "the last write, cut short" in _warnings(caplog)[0]


# ---------------------------------------------------------------- group commit
def _hammer(w: WriteAheadLog, threads: int, each: int) -> dict:
    got: dict = {}
    errors = []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            start.wait()
            got[t] = [(w.append(f"{t}:{i}".encode()), i) for i in range(each)]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    _join(pool)
    assert not errors, errors
    return got


def test_group_commit_8_threads_share_fsyncs_and_every_record_replays_once(tmp_path):
    with WriteAheadLog.open(tmp_path) as w:
        before = w.stats
        got = _hammer(w, 8, 50)
        stats = w.stats
        records = list(w.replay())
    groups = stats.fsyncs - before.fsyncs
    print(f"\ngroup commit: 400 appends from 8 threads, {groups} fsyncs "
          f"({400 / groups:.1f} appends per fsync)")
    assert stats.appends == 400 and groups < 400
    assert stats.bytes_written == sum(RECORD_HEADER_BYTES + len(p) for _, p in records)
    assert [lsn for lsn, _ in records] == list(range(1, 401))
    by_lsn = dict(records)
    for t, acks in got.items():  # each thread's records in its own order, each acknowledged
        assert [i for _, i in acks] == list(range(50))
        lsns = [lsn for lsn, _ in acks]
        assert lsns == sorted(lsns)
        assert all(by_lsn[lsn] == f"{t}:{i}".encode() for lsn, i in acks)
    assert sorted(p for _, p in records) == sorted(f"{t}:{i}".encode() for t in range(8)
                                                   for i in range(50))
    assert _replayed(tmp_path) == [p for _, p in records]


def test_every_append_returns_after_an_fsync_that_covers_its_record(tmp_path, monkeypatch):
    w = WriteAheadLog.open(tmp_path)
    real_fsync, synced, lock = os.fsync, [0], threading.Lock()

    def fsync(fd):  # the log file's size at its latest completed fsync
        real_fsync(fd)
        with lock:
            synced[0] = max(synced[0], os.fstat(fd).st_size)

    monkeypatch.setattr(wal_module.os, "fsync", fsync)
    at_return: dict = {}

    def work(t):
        for i in range(30):
            lsn = w.append(b"%d:%d." % (t, i) * 7)
            at_return[lsn] = synced[0]

    pool = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in pool:
        th.start()
    _join(pool)
    w.close()
    f = _logs(tmp_path)[0]
    ends = _offsets(f)[1:] + [f.stat().st_size]
    assert len(at_return) == len(ends) == 240
    late = [lsn for lsn, size in at_return.items() if size < ends[lsn - 1]]
    assert not late, f"appends returned before their record was fsync'd: {late[:10]}"


class _Disk:
    """os.pwrite / os.fsync stand-ins (made once the log is open): a write or an fsync
    that fails (a full disk), a first write held until released."""

    def __init__(self, monkeypatch) -> None:
        self.real_pwrite, self.real_fsync = os.pwrite, os.fsync
        self.hold = threading.Event()
        self.holding = threading.Event()
        self.fail_write = self.fail_fsync = False
        self.calls = 0
        monkeypatch.setattr(wal_module.os, "pwrite", self.pwrite)
        monkeypatch.setattr(wal_module.os, "fsync", self.fsync)

    def pwrite(self, fd, data, offset):
        self.calls += 1
        if self.calls == 1:
            self.holding.set()
            self.hold.wait(10)
        if self.fail_write and self.calls > 1:  # half reaches the file, then ENOSPC
            self.real_pwrite(fd, bytes(data[:len(data) // 2]), offset)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real_pwrite(fd, data, offset)

    def fsync(self, fd):
        if self.fail_fsync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return self.real_fsync(fd)


def _group_of(w: WriteAheadLog, disk: _Disk, n: int):
    """Start one append held in its write, then ``n`` appends queued behind it (one
    group); release the first. Returns the results: an LSN or the exception, per
    thread (the first one first)."""
    results: dict = {}

    def one(k):
        try:
            results[k] = w.append(f"record {k}".encode() * 3)
        except BaseException as e:
            results[k] = e

    first = threading.Thread(target=one, args=(0,))
    first.start()
    assert disk.holding.wait(10)
    rest = [threading.Thread(target=one, args=(k,)) for k in range(1, n + 1)]
    for th in rest:
        th.start()
    deadline = time.monotonic() + 10
    while len(w._queue) < n and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(w._queue) == n
    return first, rest, results


def test_a_full_disk_fails_every_appender_of_the_group_and_the_log_goes_on(tmp_path,
                                                                           monkeypatch,
                                                                           caplog):
    w = WriteAheadLog.open(tmp_path)
    disk = _Disk(monkeypatch)
    first, rest, results = _group_of(w, disk, 6)
    disk.fail_write = True  # the second group's write: half, then ENOSPC
    disk.hold.set()
    _join([first] + rest)
    assert results[0] == 1
    assert all(isinstance(results[k], OSError) and results[k].errno == errno.ENOSPC
               and "the record was not written" in str(results[k]) for k in range(1, 7)), results
    size = HEADER_BYTES + RECORD_HEADER_BYTES + len(b"record 0" * 3)
    assert _logs(tmp_path)[0].stat().st_size == size  # truncated back to record 1
    disk.fail_write = False
    assert w.append(b"after") == 2  # room again: the numbering goes on
    w.close()
    assert _replayed(tmp_path) == [b"record 0" * 3, b"after"] and _warnings(caplog) == []


def test_a_failed_fsync_fails_the_group_and_stops_the_log_until_reopened(tmp_path,
                                                                         monkeypatch, caplog):
    w = WriteAheadLog.open(tmp_path)
    disk = _Disk(monkeypatch)
    disk.hold.set()
    assert w.append(b"kept") == 1
    disk.fail_fsync = True
    with pytest.raises(OSError, match="Input/output error") as e:
        w.append(b"lost")
    assert e.value.errno == errno.EIO
    disk.fail_fsync = False
    with pytest.raises(WALError, match="an fsync failed .* refuses appends until it is "
                                       "reopened"):
        w.append(b"refused")
    w.close()
    assert _replayed(tmp_path) == [b"kept"] and _warnings(caplog) == []


def test_a_partial_write_that_cannot_be_undone_is_dropped_by_the_next_open(tmp_path,
                                                                          monkeypatch, caplog):
    w = WriteAheadLog.open(tmp_path)
    disk = _Disk(monkeypatch)
    disk.hold.set()
    assert w.append(b"kept") == 1
    disk.fail_write = True

    def no_truncate(fd, size):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(wal_module.os, "ftruncate", no_truncate)
    with pytest.raises(OSError, match="No space left"):
        w.append(b"half written" * 10)
    with pytest.raises(WALError, match="partial record stayed"):
        w.append(b"refused")
    monkeypatch.undo()
    w.close()
    assert _replayed(tmp_path) == [b"kept"]
    assert len(_warnings(caplog)) == 1 and "the last write, cut short" in _warnings(caplog)[0]


# ---------------------------------------------------------------- rotation and truncation
def test_rotation_and_truncate_through_remove_exactly_the_covered_files(tmp_path):
    payloads = _payloads(12, seed=9)
    with WriteAheadLog.open(tmp_path) as w:
        assert w.rotate() is False  # nothing in the current file: nothing to rotate
        for i, p in enumerate(payloads[:9]):
            w.append(p)
            if i % 3 == 2:
                assert w.rotate() is True
        names = lambda: [int(f.stem) for f in _logs(tmp_path)]  # noqa: E731
        assert names() == [1, 4, 7, 10]
        assert w.stats.dir_fsyncs == 4  # the first file and each new one, before use
        with pytest.raises(ValueError, match="the last record .* is 9"):
            w.truncate_through(10)
        assert w.truncate_through(2) == 0 and names() == [1, 4, 7, 10]
        assert w.truncate_through(5) == 1 and names() == [4, 7, 10]  # 6 is in 4..6: kept
        assert w.first_lsn == 4
        assert [lsn for lsn, _ in w.replay(3)] == list(range(4, 10))
        with pytest.raises(WALError, match="records 3 to 3 are not in the log"):
            w.replay(2)
        assert w.truncate_through(6) == 1 and names() == [7, 10]
        assert w.stats.dir_fsyncs == 6  # after each removal
        w.append(payloads[9])
        assert w.truncate_through(10) == 2 and names() == [11]  # covered: rotated, removed
        assert (w.first_lsn, w.last_lsn) == (11, 10)
        assert list(w.replay(10)) == []
    with WriteAheadLog.open(tmp_path) as w:
        assert (w.first_lsn, w.last_lsn) == (11, 10)
        assert w.append(payloads[10]) == 11
    assert list(WriteAheadLog.read(tmp_path, after_lsn=10)) == [(11, payloads[10])]
    with pytest.raises(WALError, match="not in the log"):
        WriteAheadLog.read(tmp_path)


def test_files_rotate_past_the_size_limit(tmp_path):
    payloads = _payloads(80, seed=10)
    limit = 3000
    _write(tmp_path, payloads, max_file_bytes=limit)
    files = _logs(tmp_path)
    assert len(files) > 5
    biggest = max(RECORD_HEADER_BYTES + len(p) for p in payloads)
    assert all(f.stat().st_size < limit + biggest for f in files)  # one append past at most
    assert _replayed(tmp_path) == payloads
    for f in files[:-1]:  # each file's name is its first record, the last file's next one
        assert f.stat().st_size >= limit


def test_a_killed_rotation_leaves_a_temporary_file_that_open_removes(tmp_path):
    _write(tmp_path, [b"a"])
    stray = tmp_path / ".00000000000000000002.log.abcd1234.tmp"
    stray.write_bytes(b"MGAS")
    assert _replayed(tmp_path) == [b"a"] and not stray.exists()


# ---------------------------------------------------------------- writers killed at random
def _child(folder: Path, seed: int, chunked: bool) -> Child:
    return Child([HERE / "_wal_child.py", folder, seed, 4, 16384] + ["chunked"] * chunked)


def _crash_loop(tmp_path: Path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    folder = tmp_path / "wal"
    known: dict[int, tuple] = {}  # LSN -> payload name: acknowledged, or seen on a reopen
    truncated = 0  # the largest truncate_through a child asked for
    acked_total = dropped_tails = 0
    for life in range(kills):
        with _child(folder, life, chunked=life % 2 == 1) as child:
            if rng.random() < 0.2:  # at any moment, opening (and recovery) included
                time.sleep(rng.uniform(0, 0.3))
            else:
                child.wait_ready()
                time.sleep(rng.uniform(0, 0.08))
            lines = child.kill()
        for line in lines:
            word, *rest = line.split()
            if word == "A":
                lsn, name = int(rest[0]), tuple(map(int, rest[1:]))
                assert known.get(lsn, name) == name, (lsn, known.get(lsn), name)
                known[lsn] = name
                acked_total += 1
            elif word == "T":
                truncated = max(truncated, int(rest[0]))
        if not folder.exists():
            continue  # killed before it created the log
        # reopen: every acknowledged record is there; any other is complete and valid
        handler = _Count()
        logging.getLogger("memgas_gpu.wal").addHandler(handler)
        try:
            with WriteAheadLog.open(folder) as w:
                records = list(w.replay(w.first_lsn - 1))
                assert w.first_lsn - 1 <= truncated, (w.first_lsn, truncated)
        finally:
            logging.getLogger("memgas_gpu.wal").removeHandler(handler)
        assert handler.count <= 1
        dropped_tails += handler.count
        present = dict(records)
        for lsn, name in known.items():
            if lsn > truncated:
                assert lsn in present, (life, lsn, name)
        names = set()
        for lsn, data in records:
            name = parse(data)
            assert data == payload(*name), (life, lsn)  # complete and valid
            assert known.get(lsn, name) == name, (life, lsn)
            assert name not in names
            names.add(name)
        known = {lsn: parse(data) for lsn, data in records}
    print(f"\ncrash injection: {kills} kills, {acked_total} acknowledged appends, "
          f"{dropped_tails} torn tails dropped, {len(known)} records kept")
    assert acked_total > kills  # the kills came while it was appending
    assert dropped_tails > 0  # and some of them in the middle of a record


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record) -> None:
        self.count += 1


def test_a_writer_killed_at_random_moments_keeps_every_acknowledged_record(tmp_path):
    _crash_loop(tmp_path, kills=30, seed=11)


@pytest.mark.slow
def test_a_writer_killed_at_random_moments_200_times(tmp_path):
    _crash_loop(tmp_path, kills=200, seed=12)
