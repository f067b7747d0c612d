"""A write-ahead log: checksummed records in numbered files, appended with group
commit, each one durable before :meth:`WriteAheadLog.append` returns.

A log folder (a memory keeps its log in ``FOLDER/wal``)::

    00000000000000000001.log   records 1 .. 1234 (complete: written before a rotation)
    00000000000000001235.log   records 1235 .. (the file being written)

A file is named by the sequence number (LSN) of its first record, in 20 digits; LSNs
increase by one across files.  Each file starts with a 24-byte header, then holds
records; all numbers are little-endian::

    header:  magic b"MGAS-WAL" | format version u32 | first LSN u64 | CRC-32 of those 20 bytes u32
    record:  payload length u32 | CRC-32 of (LSN + group + payload) u32 | LSN u64 | group u64 | payload

``group`` is the LSN of the first record of the write the record went out with (records
appended together share one write and one fsync).  Files of format version 1 (written
before groups were recorded) have no ``group`` field and a CRC-32 of (LSN + payload); they
are read, never appended to.

Durability.  ``append`` returns once its record is written and the file fsync'd.  Threads
appending at the same time share one write and one fsync (group commit): the first to
find no write in progress writes every queued record, fsyncs once and wakes the others,
each with its own LSN, in the order they queued.  A group is written only after the
previous group's fsync returned.  A new file is written under a temporary name, fsync'd,
renamed and the folder fsync'd before any record goes into it, so a header is never
torn.  When a write or an fsync fails, every appender of that group gets the error and
the file is truncated back to its last acknowledged record (after a failed fsync, or
when that truncation fails too, the log refuses appends until it is reopened).

Recovery.  :meth:`WriteAheadLog.open` reads every record.  The last file may end in a
group whose write a crash cut short: short or invalid records with no valid record of a
*later* group after them (a group's pages may reach the disk in any order, so valid
records of the same group may follow the damage).  Such a tail was never acknowledged
(its fsync never returned): it is cut off, the file fsync'd, and one warning logged
(logger ``memgas_gpu.wal``) naming the file and the bytes dropped.  Anything else (damage
followed by a record of a later group, a damaged earlier file, a missing file, a bad
header) is damage no crash leaves: the log is not opened (:class:`WALCorruptionError`
names the file and the offset) and nothing is changed, so no data is lost silently.
Opening also fsyncs the last file, so records a killed writer wrote but never synced
are durable before anyone replays them.

One writer per folder: it holds the folder's lock (:mod:`.lock`) from open to close,
unless its caller holds the lock of a folder around it (a memory's).  Readers
(:meth:`WriteAheadLog.read`) take no lock; they stop quietly at a tail a writer may
still be appending to, and refuse damage followed by a later group, as a writer does.

Standard library only (no torch).
"""
from __future__ import annotations

import logging
import os
import re
import struct
import threading
import zlib
from pathlib import Path
from typing import Iterator, NamedTuple, Optional, Union

from ..errors import MemgasError
from . import files
from .lock import FolderLock

__all__ = ["WriteAheadLog", "WALStats", "WALError", "WALCorruptionError",
           "RecordTooLargeError", "MAGIC", "FORMAT_VERSION", "HEADER_BYTES",
           "RECORD_HEADER_BYTES", "MAX_RECORD_BYTES", "DEFAULT_FILE_BYTES"]

log = logging.getLogger("memgas_gpu.wal")

MAGIC = b"MGAS-WAL"
#: the format this version writes (1: no group field; read only)
FORMAT_VERSION = 2
#: largest payload a record may hold: the writer refuses a larger one before writing
#: anything, a reader takes a larger length for damage
MAX_RECORD_BYTES = 64 << 20
#: size past which the writer starts a new file (before the next group's write)
DEFAULT_FILE_BYTES = 64 << 20
_HEAD = struct.Struct("<8sIQ")  # magic, version, first LSN; then their CRC-32 (u32)
HEADER_BYTES = _HEAD.size + 4
_RECORD = struct.Struct("<IIQQ")  # payload length, CRC-32, LSN, group
_RECORD_V1 = struct.Struct("<IIQ")  # payload length, CRC-32 of (LSN + payload), LSN
RECORD_HEADER_BYTES = _RECORD.size
_U32 = struct.Struct("<I")
_NAME = re.compile(r"^([0-9]{20})\.log$")
_NONZERO = re.compile(rb"[^\x00]")


class WALError(MemgasError):
    """A write-ahead log that cannot be opened, read or appended to as asked."""


class WALCorruptionError(WALError):
    """A log damaged where no crash during an append could have damaged it (the message
    names the file and the offset); nothing was changed."""


class RecordTooLargeError(WALError, ValueError):
    """A payload larger than the log's bound on a record (nothing was written)."""


class WALStats(NamedTuple):
    """What a writer did since it was opened."""

    #: records acknowledged (``append`` returned their LSN)
    appends: int
    #: fsyncs of log files (one per group of appends, one per new file, one on open)
    fsyncs: int
    #: fsyncs of the log folder (new files, removed files)
    dir_fsyncs: int
    #: bytes of the acknowledged records, headers included
    bytes_written: int


def _name(first_lsn: int) -> str:
    return f"{first_lsn:020d}.log"


def _header(first_lsn: int) -> bytes:
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, first_lsn)
    return head + _U32.pack(zlib.crc32(head))


def _frame(lsn: int, group: int, payload: bytes) -> bytes:
    tail = struct.pack("<QQ", lsn, group)
    crc = zlib.crc32(payload, zlib.crc32(tail))
    return _U32.pack(len(payload)) + _U32.pack(crc) + tail + payload


def _check_header(path: Path, raw: bytes, first_lsn: int) -> int:
    """The format version of a log file's header (checked: its checksum first)."""
    if len(raw) < HEADER_BYTES:
        raise WALCorruptionError(f"{path}: {len(raw)} bytes, shorter than the "
                                 f"{HEADER_BYTES}-byte header of a log file")
    magic, version, lsn = _HEAD.unpack_from(raw)
    if magic != MAGIC:
        raise WALCorruptionError(f"{path}: not a memgas_gpu write-ahead log file (magic "
                                 f"{magic!r})")
    if zlib.crc32(raw[:_HEAD.size]) != _U32.unpack_from(raw, _HEAD.size)[0]:
        raise WALCorruptionError(f"{path}: offset 0: the header's checksum does not match "
                                 "(a damaged header)")
    if version > FORMAT_VERSION:
        raise WALError(f"{path}: log format version {version} is newer than this "
                       f"memgas_gpu reads ({FORMAT_VERSION}); upgrade memgas_gpu")
    if version < 1:
        raise WALCorruptionError(f"{path}: offset 8: {version} is not a format version")
    if lsn != first_lsn:
        raise WALCorruptionError(f"{path}: offset 12: the header says the first record is "
                                 f"{lsn}, the file name says {first_lsn}")
    return version


class _Bad(Exception):
    """The first short or invalid record of a file: where, and why."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(offset, why)
        self.offset, self.why = offset, why


def _layout(version: int) -> tuple[struct.Struct, int]:
    rec = _RECORD if version >= 2 else _RECORD_V1
    return rec, rec.size


def _records(f, first_lsn: int, end: int, version: int
             ) -> Iterator[tuple[int, int, int, bytes]]:
    """``(offset, LSN, group, payload)`` of each record of the log file ``f``
    (positioned after its header) up to offset ``end`` (version-1 records: group 0).

    Raises:
        _Bad: at the first record that is cut short or invalid.
    """
    rec, size = _layout(version)
    pos, lsn = HEADER_BYTES, first_lsn
    while pos < end:
        head = f.read(size) if end - pos >= size else b""
        if len(head) < size:
            raise _Bad(pos, f"a record cut short ({end - pos} bytes, less than a record "
                            "header)")
        fields = rec.unpack(head)
        length, crc, got = fields[0], fields[1], fields[2]
        group = fields[3] if version >= 2 else 0
        if length > MAX_RECORD_BYTES:
            raise _Bad(pos, f"a record length of {length} bytes, more than the "
                            f"{MAX_RECORD_BYTES} a record may hold")
        payload = f.read(length) if pos + size + length <= end else b""
        if len(payload) < length:
            raise _Bad(pos, f"a record of {length} bytes cut short at {end - pos - size}")
        if zlib.crc32(payload, zlib.crc32(head[8:])) != crc:
            raise _Bad(pos, "a record whose checksum does not match")
        if got != lsn:
            raise _Bad(pos, f"record {got} where record {lsn} belongs")
        if version >= 2 and not (0 < group <= lsn):
            raise _Bad(pos, f"record {lsn} names group {group}")
        yield pos, lsn, group, payload
        pos += size + length
        lsn += 1


def _valid_after(buf: bytes, lsn: int, version: int) -> Optional[tuple[int, int, int]]:
    """``(offset, LSN, group)`` of a valid record in ``buf`` (the rest of a file from a
    bad record on, whose LSN should have been ``lsn``) past offset 0 that shows the
    damage is not a torn last write: a record of a write begun after ``lsn``, or record
    ``lsn`` itself (version 2); any valid record (version 1); None when there is
    none."""
    rec, size = _layout(version)
    hi = lsn + len(buf) // size
    q, last = 1, len(buf) - size
    while q <= last:
        fields = rec.unpack_from(buf, q)
        length, crc, got = fields[0], fields[1], fields[2]
        if got == 0:  # no record has LSN 0: skip runs of zeros at C speed
            m = _NONZERO.search(buf, q + 8)
            if m is None:
                return None
            q = max(q + 1, m.start() - 15)
            continue
        if (lsn <= got <= hi and q + size + length <= len(buf)
                and zlib.crc32(buf[q + size:q + size + length],
                               zlib.crc32(buf[q + 8:q + size])) == crc):
            group = fields[3] if version >= 2 else 0
            # a later write's record, or the record that belongs where the damage is
            # (a write's records lie end to end from where it began): damage
            if version < 2 or group > lsn or got == lsn:
                return q, got, group
            q += size + length  # same group as the damage: part of the torn write
            continue
        q += 1
    return None


def _list(folder: Path) -> list[tuple[int, Path]]:
    """``(first LSN, path)`` of the log files in ``folder``, in order."""
    out = []
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def _check_lsn(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{what}: expected an LSN (an integer from 0), got {value!r}")
    return value


def _damage(path: Path, bad: "_Bad", f, expected: int, version: int) -> Optional[str]:
    """The refusal for a bad record of the last file when a later group's valid record
    follows it (damage, not a torn write), else None."""
    f.seek(bad.offset)
    found = _valid_after(f.read(), expected, version)
    if found is None:
        return None
    return (f"{path}: offset {bad.offset}: {bad.why}, and a valid record ({found[1]}) of a "
            f"later write follows at offset {bad.offset + found[0]}: the log is damaged, "
            "not cut short by a crash; not opened (nothing was changed)")


def _iter_log(files_: list[tuple[int, Path, Optional[int]]], after_lsn: int,
              tolerant_tail: bool) -> Iterator[tuple[int, bytes]]:
    """``(LSN, payload)`` of the records after ``after_lsn`` in ``files_`` (first LSN,
    path, end offset or None for the file's size).  A bad record in the last file ends
    the iteration quietly when ``tolerant_tail`` and no later write's record follows it
    (a writer may be appending to it); otherwise it is damage."""
    for i, (first, path, end) in enumerate(files_):
        last = i == len(files_) - 1
        if not last and files_[i + 1][0] <= after_lsn + 1:
            continue  # every record of this file is at or before after_lsn
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise WALError(f"{path}: removed while it was read (a checkpoint truncated the "
                           "log): read again from the newer checkpoint") from None
        with f:
            size = os.fstat(f.fileno()).st_size if end is None else end
            version = _check_header(path, f.read(HEADER_BYTES), first)
            expected = first
            try:
                for _, lsn, _, payload in _records(f, first, size, version):
                    expected = lsn + 1
                    if lsn > after_lsn:
                        yield lsn, payload
            except _Bad as bad:
                if last and tolerant_tail:
                    why = _damage(path, bad, f, expected, version)
                    if why is None:
                        return
                    raise WALCorruptionError(why) from None
                raise WALCorruptionError(f"{path}: offset {bad.offset}: {bad.why}") from None
        if not last and expected != files_[i + 1][0]:
            raise WALCorruptionError(
                f"{files_[i + 1][1]}: the log jumps from record {expected - 1} (the last of "
                f"{path.name}) to {files_[i + 1][0]}: records are missing")


def _first_after(files_, after_lsn: int, folder: Path) -> None:
    if not files_:
        raise WALCorruptionError(f"{folder}: holds no log file: the records after "
                                 f"{after_lsn} are missing (a log file was deleted)")
    if after_lsn + 1 < files_[0][0]:
        raise WALError(f"{folder}: records {after_lsn + 1} to {files_[0][0] - 1} are not in "
                       "the log (removed by a checkpoint that covers them, or deleted)")


def _failure(e: BaseException, path: Path) -> BaseException:
    """A fresh error for one appender of a group whose write failed with ``e`` (each
    thread raises its own exception object); an ``OSError`` keeps its number."""
    if isinstance(e, OSError) and e.errno is not None:
        err = OSError(e.errno, f"{os.strerror(e.errno)} (appending to the write-ahead log); "
                               "the record was not written", str(path))
    else:
        err = WALError(f"{path}: appending failed ({type(e).__name__}: {e}); the record was "
                       "not written")
    err.__cause__ = e
    return err


class _Pending:
    """One append waiting for its group's write."""

    __slots__ = ("payload", "lsn", "error", "done")

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.lsn = 0
        self.error: Optional[BaseException] = None
        self.done = False


class WriteAheadLog:
    """The writer of a log folder (see the module docstring): open it with
    :meth:`open`, read a log without writing with :meth:`read`.

    Thread-safe: any number of threads may :meth:`append` at once (they share fsyncs);
    :meth:`rotate`, :meth:`truncate_through` and :meth:`close` wait for the write in
    progress.
    """

    def __init__(self, *args, **kwargs) -> None:
        raise TypeError("open a log with WriteAheadLog.open(folder), or read one with "
                        "WriteAheadLog.read(folder)")

    # ---------------------------------------------------------------- opening
    @classmethod
    def open(cls, folder: Union[str, os.PathLike], *,
             max_file_bytes: int = DEFAULT_FILE_BYTES,
             max_record_bytes: int = MAX_RECORD_BYTES, after: Optional[int] = None,
             create: bool = True, lock: bool = True) -> "WriteAheadLog":
        """Open the log in ``folder`` for appending, after checking every record and
        dropping a torn tail.

        Args:
            max_file_bytes: the size past which the next group of appends goes to a
                new file.
            max_record_bytes: the largest payload :meth:`append` accepts (at most
                :data:`MAX_RECORD_BYTES`).
            after: the log must hold every record after this LSN (a checkpoint covers
                the ones before): its first file starts at ``after + 1`` or earlier, and
                its records reach ``after``; a new log starts at ``after + 1`` (None: no
                such requirement; a new log starts at 1).
            create: make the folder and a first file when the folder holds none (else
                that is an error: records may be missing).
            lock: take the folder's lock (False: the caller holds the lock of a folder
                around this one).

        Raises:
            IndexLockError: another writer holds the log.
            WALError: ``folder`` is a file, a file is of a newer format.
            WALCorruptionError: damage no crash during an append leaves, or records
                after ``after`` missing (names the file and the offset); nothing was
                changed.
            OSError: reading or writing the folder failed.
        """
        for name, value, top in (("max_file_bytes", max_file_bytes, None),
                                 ("max_record_bytes", max_record_bytes, MAX_RECORD_BYTES)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 \
                    or (top is not None and value > top):
                bound = f"from 1 to {top}" if top else "from 1"
                raise ValueError(f"{name}: expected an integer {bound}, got {value!r}")
        required = after is not None
        after = _check_lsn(after, "after") if required else 0
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise WALError(f"{folder}: exists and is not a folder")
        if not folder.exists():
            if not create:
                raise WALCorruptionError(f"{folder}: missing: the records after {after} "
                                         "are lost (the log folder was deleted)")
            files.make_dirs(folder)
        self = object.__new__(cls)
        self._folder = folder
        self._max_file = max_file_bytes
        self._max_record = max_record_bytes
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Pending] = []
        self._busy = False  # a thread is writing (a group, a rotation, a truncation)
        self._closing = self._closed = False
        self._failed: Optional[str] = None
        self._fd = -1
        self._files: list[tuple[int, Path]] = []
        self._size = 0  # the current file's acknowledged end
        self._next_lsn = after + 1
        self._appends = self._fsyncs = self._dir_fsyncs = self._bytes = 0
        self._lock = FolderLock(folder, what="the log is open for writing") if lock else None
        if self._lock is not None:
            self._lock.acquire()
        try:
            self._recover(after, create, required)
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
            if self._lock is not None:
                self._lock.release()
            raise
        return self

    def _recover(self, after: int, create: bool, required: bool) -> None:
        folder = self._folder
        leftovers = [p for p in folder.iterdir() if files.is_temporary(p.name)]
        if leftovers:  # a new file a killed writer never renamed into place
            files.remove(leftovers)
            self._dir_fsyncs += 1
        found = _list(folder)
        if not found:
            if not create:
                raise WALCorruptionError(f"{folder}: holds no log file: the records after "
                                         f"{after} are missing (a log file was deleted)")
            self._create(after + 1)
            return
        if required and found[0][0] > after + 1:
            raise WALCorruptionError(
                f"{found[0][1]}: the log starts at record {found[0][0]}, but records from "
                f"{after + 1} on are not in the last checkpoint: a log file was deleted")
        expected, torn = found[0][0], None
        version = FORMAT_VERSION
        for i, (first, path) in enumerate(found):
            if first != expected:
                raise WALCorruptionError(
                    f"{path}: the log jumps from record {expected - 1} (the last of "
                    f"{found[i - 1][1].name}) to {first}: records are missing")
            last = i == len(found) - 1
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                version = _check_header(path, f.read(HEADER_BYTES), first)
                end = HEADER_BYTES
                try:
                    for pos, lsn, _, payload in _records(f, first, size, version):
                        expected = lsn + 1
                        end = pos + _layout(version)[1] + len(payload)
                except _Bad as bad:
                    where = f"{path}: offset {bad.offset}: {bad.why}"
                    if not last:
                        raise WALCorruptionError(
                            f"{where}, in a file before the last: the log is damaged, not "
                            "cut short by a crash; not opened (nothing was changed)") \
                            from None
                    why = _damage(path, bad, f, expected, version)
                    if why is not None:
                        raise WALCorruptionError(why) from None
                    torn = (end, size - end)
        if required and expected - 1 < after:
            raise WALCorruptionError(
                f"{found[-1][1]}: the log ends at record {expected - 1}, before record "
                f"{after} that the checkpoint covers: log files were deleted or replaced")
        path = found[-1][1]
        self._files = found
        self._fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        if torn is not None:
            os.ftruncate(self._fd, torn[0])
        os.fsync(self._fd)  # what a killed writer wrote but never synced: durable now
        self._fsyncs += 1
        if torn is not None:
            at = f"record {expected - 1}" if expected > found[-1][0] else "the header"
            log.warning(f"{path}: dropped {torn[1]} bytes after {at} (offset {torn[0]}): the "
                        "last write, cut short by a crash before its fsync returned")
        self._size, self._next_lsn = end, expected
        if version < FORMAT_VERSION:  # never append to a file of an older format
            if expected == found[-1][0]:  # it holds no record: the new file replaces it
                self._files = found[:-1]  # (listed once, so never removed as covered)
            self._create(expected)

    def _sync_dir(self) -> None:
        files.sync_dir(self._folder)
        self._dir_fsyncs += 1

    def _create(self, first_lsn: int) -> None:
        """Start the file of records from ``first_lsn`` on and make it the current one."""
        path = self._folder / _name(first_lsn)
        new = not os.path.lexists(path)
        try:
            files.replace(path, _header(first_lsn), "a new log file")  # fsync'd, renamed
        except BaseException:
            # the rename may have happened before the folder's fsync failed: a file this
            # log does not use must not stay under a name that claims the next records
            if new:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            raise
        self._fsyncs += 1
        self._dir_fsyncs += 1
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        if self._fd >= 0:
            os.close(self._fd)  # synced with its last group
        self._fd = fd
        self._files.append((first_lsn, path))
        self._size = HEADER_BYTES

    # ---------------------------------------------------------------- appending
    def append(self, payload: Union[bytes, bytearray, memoryview]) -> int:
        """Append one record and return its LSN once it is durable (written and
        fsync'd, possibly by another thread's write of the same group).

        Raises:
            RecordTooLargeError: ``payload`` is larger than ``max_record_bytes``
                (nothing was written).
            TypeError: ``payload`` is not bytes-like.
            OSError: the group's write or fsync failed (a full disk): the record was
                not written; the file is truncated back to the last acknowledged record.
            WALError: the log is closed, or an earlier fsync failed (reopen it).
        """
        return self.wait(self.submit(payload))

    def submit(self, payload: Union[bytes, bytearray, memoryview]) -> "_Pending":
        """Queue one record without waiting: records are written in the order they are
        submitted (a caller that submits under its own lock gets its order), and
        :meth:`wait` returns once the record is durable.  Raises what :meth:`append`
        raises before anything is queued."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload: expected bytes, got {type(payload).__name__}")
        data = bytes(payload)
        if len(data) > self._max_record:
            raise RecordTooLargeError(
                f"{self._folder}: a record of {len(data)} bytes, more than the "
                f"{self._max_record} a record may hold; nothing was written")
        req = _Pending(data)
        with self._cond:
            self._check_usable()
            self._queue.append(req)
        return req

    def wait(self, req: "_Pending") -> int:
        """The LSN of a :meth:`submit`-ted record once it is durable (this thread may
        write and fsync the group itself, or wait for the thread that does).

        Raises:
            OSError, WALError: as :meth:`append`.
        """
        with self._cond:
            while not req.done:
                if self._busy:
                    self._cond.wait()
                else:
                    self._lead()
        if req.error is not None:
            raise req.error
        return req.lsn

    def _check_usable(self) -> None:
        if self._closing:
            raise WALError(f"{self._folder}: the log is closed")
        if self._failed is not None:
            raise WALError(f"{self._folder}: {self._failed}; the log refuses appends until "
                           "it is reopened (opening drops a partial record)")

    def _lead(self) -> None:
        """Write and fsync every queued record as one group (called with the condition
        held and no write in progress; released during the write)."""
        self._busy = True
        batch, self._queue = self._queue, []
        first = self._next_lsn
        error: Optional[BaseException] = None
        self._cond.release()
        try:
            self._write_group(batch, first)
        except BaseException as e:
            error = e
        finally:
            self._cond.acquire()
        try:
            if error is None:
                for k, req in enumerate(batch):
                    req.lsn = first + k
                self._next_lsn += len(batch)
                self._appends += len(batch)
            else:
                path = self._files[-1][1]
                for req in batch:
                    req.error = _failure(error, path)
        finally:  # whatever happens here, no appender waits forever or gets a made-up LSN
            for req in batch:
                if req.lsn == 0 and req.error is None:
                    req.error = WALError(f"{self._folder}: the group's write ended without "
                                         "an outcome; the record may not be written")
                req.done = True
            self._busy = False
            self._cond.notify_all()
        if error is not None and not isinstance(error, Exception):
            raise error  # KeyboardInterrupt and the like stop the leader itself

    def _write_group(self, batch: list[_Pending], first: int) -> None:
        if self._failed is not None:
            raise WALError(f"{self._folder}: {self._failed}; the log refuses appends until "
                           "it is reopened")
        if self._size >= self._max_file and self._size > HEADER_BYTES:
            self._create(first)
        frames = b"".join(_frame(first + k, first, req.payload)
                          for k, req in enumerate(batch))
        start = self._size
        path = self._files[-1][1]
        try:
            files.append_at(self._fd, frames, start, path, "a log record")
        except BaseException:
            self._undo(start, None)
            raise
        try:
            os.fsync(self._fd)
        except BaseException as e:
            # after a failed fsync the kernel may have dropped the pages: do not trust
            # this file handle again
            self._undo(start, f"an fsync failed ({e})")
            raise
        self._fsyncs += 1
        self._size += len(frames)
        self._bytes += len(frames)

    def _undo(self, start: int, failed: Optional[str]) -> None:
        """Truncate the current file back to ``start`` (its last acknowledged record)
        after a failed write; when that fails too, or ``failed`` says why the handle is
        not to be trusted, refuse appends until the log is reopened."""
        try:
            os.ftruncate(self._fd, start)
            os.fsync(self._fd)
        except OSError as e:
            failed = failed or f"a write failed and its partial record stayed ({e})"
        if failed is not None:
            self._failed = failed

    # ---------------------------------------------------------------- exclusive work
    def _begin(self) -> None:
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._check_usable()
            self._busy = True

    def _end(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def rotate(self) -> bool:
        """Start a new file for the next records; False (nothing done) when the current
        file holds no record yet.

        Raises:
            WALError: the log is closed or failed.
            OSError: creating the file failed (the current file stays current).
        """
        self._begin()
        try:
            return self._rotate()
        finally:
            self._end()

    def _rotate(self) -> bool:
        if self._size == HEADER_BYTES:
            return False
        self._create(self._next_lsn)
        return True

    def truncate_through(self, lsn: int) -> int:
        """Remove the files whose records are all at or before ``lsn`` (call it once a
        checkpoint covering them is durable) and return how many were removed.  The file
        being written is rotated first when every record in it is covered, so
        truncating through the last LSN leaves one empty file (whose name keeps the
        next LSN).

        Raises:
            ValueError: ``lsn`` is after the last record written.
            WALError: the log is closed or failed.
        """
        lsn = _check_lsn(lsn, "truncate_through")
        self._begin()
        try:
            if lsn >= self._next_lsn:
                raise ValueError(f"truncate_through({lsn}): the last record of "
                                 f"{self._folder} is {self._next_lsn - 1}")
            if lsn == self._next_lsn - 1:
                self._rotate()
            removed = 0
            while len(self._files) > 1 and self._files[1][0] - 1 <= lsn:
                os.unlink(self._files[0][1])  # oldest first: a crash leaves a suffix
                del self._files[0]
                removed += 1
            if removed:
                self._sync_dir()
            return removed
        finally:
            self._end()

    # ---------------------------------------------------------------- reading
    def replay(self, after_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        """``(LSN, payload)`` of every acknowledged record after ``after_lsn``, in order
        (the records acknowledged when this is called).

        Raises:
            WALError: records after ``after_lsn`` were removed by :meth:`truncate_through`.
            WALCorruptionError: a file changed under the writer.
        """
        after_lsn = _check_lsn(after_lsn, "after_lsn")
        with self._cond:
            if self._closed:
                raise WALError(f"{self._folder}: the log is closed")
            files_ = [(first, path, None) for first, path in self._files[:-1]]
            files_.append((*self._files[-1], self._size))
        _first_after(files_, after_lsn, self._folder)
        return _iter_log(files_, after_lsn, tolerant_tail=False)

    @staticmethod
    def read(folder: Union[str, os.PathLike], after_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        """``(LSN, payload)`` of the records after ``after_lsn`` in the log ``folder``,
        without the lock and without changing anything: a writer may be appending, so
        the last file is read up to a tail it may still be writing, quietly; damage
        followed by a later write's record is refused, as a writer refuses it.

        Raises:
            WALError: no such folder, or records after ``after_lsn`` were removed.
            WALCorruptionError: damage, or files are missing.
        """
        after_lsn = _check_lsn(after_lsn, "after_lsn")
        folder = Path(folder)
        if not folder.is_dir():
            raise WALError(f"{folder}: no such log folder")
        files_ = [(first, path, None) for first, path in _list(folder)]
        _first_after(files_, after_lsn, folder)
        return _iter_log(files_, after_lsn, tolerant_tail=True)

    # ---------------------------------------------------------------- state
    @property
    def folder(self) -> Path:
        return self._folder

    @property
    def first_lsn(self) -> int:
        """The LSN of the oldest record kept (the next LSN when none is kept)."""
        return self._files[0][0]

    @property
    def last_lsn(self) -> int:
        """The LSN of the last acknowledged record (the LSN before the log's first when
        it holds none)."""
        return self._next_lsn - 1

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def stats(self) -> WALStats:
        with self._cond:
            return WALStats(self._appends, self._fsyncs, self._dir_fsyncs, self._bytes)

    def close(self) -> None:
        """Write what is queued, then release the files and the lock (idempotent)."""
        with self._cond:
            if self._closing:
                while not self._closed:
                    self._cond.wait()
                return
            self._closing = True
            try:
                while self._queue or self._busy:
                    if self._busy:
                        self._cond.wait()
                    else:
                        self._lead()
            finally:
                if self._fd >= 0:
                    os.close(self._fd)
                if self._lock is not None:
                    self._lock.release()
                self._fd = -1
                self._closed = True
                self._cond.notify_all()

    def __enter__(self) -> "WriteAheadLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"last LSN {self.last_lsn}"
        return f"WriteAheadLog({str(self._folder)!r}, {state})"
