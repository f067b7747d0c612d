"""A memory kept in a folder: every write logged and synced before it returns,
checkpoints that cost what changed, recovery, compaction that deletes, and read-only
followers (docs/index-format.md; docs/failure.md, "A durable memory").

:class:`DurableMemory` is a :class:`~memgas_gpu.memory.MemoryIndex` with the same
methods and two hooks of its own: :meth:`_commit` hands each write's record to the
write-ahead log (in write order, under the memory's write lock) and publishes the
writes in log order once their records are durable (writers that arrive together share
one fsync); :meth:`_check_writable` refuses writes to a follower, a closed memory, or
one whose log failed.  The folder's files, its lock, the log and the commit format are
:mod:`memgas_gpu.storage`'s.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..settings import Settings, setting
from ..storage import files
from ..storage.commit import POINTER, WAL, Written, cut_uncommitted, read_commit, write_commit
from ..storage.folder import (FORMAT_VERSION, assemble, check_target,
                              commit_folder, folder_format, is_unfinished, pointer_missing,
                              read_snapshot, replay)
from ..storage.legacy import read_legacy, remove_legacy
from ..storage.lock import FolderLock, IndexLockError
from ..storage.log import WALError, WriteAheadLog
from ..storage.records import encode
from ..storage.validate import IndexFormatError
from .lazy import MAX_RESIDENT_BYTES

__all__ = ["Durable", "DurableParams", "CHECKPOINT_BYTES", "CHECKPOINT_SECONDS"]

log = logging.getLogger(__name__)

#: log bytes after which a write runs a checkpoint (default of ``MemoryIndex.open``)
CHECKPOINT_BYTES = 64 << 20
#: seconds after which a write runs a checkpoint, whatever the log holds
CHECKPOINT_SECONDS = 300.0


@dataclass(frozen=True)
class DurableParams(Settings):
    """The options of a memory opened on a folder (:meth:`MemoryIndex.open`).

    Attributes:
        checkpoint_bytes: a write runs a checkpoint once the log has grown by this many
            bytes since the last one.
        checkpoint_seconds: ... or once this many seconds have passed since it.
        lock_timeout: seconds to wait for another writer to close the folder.
        max_resident_bytes: the segments and store chunks read from the folder that the
            memory keeps in RAM at most (least recently used dropped first, read again
            when needed; :mod:`memgas_gpu.memory.lazy`).
    """

    checkpoint_bytes: int = setting(CHECKPOINT_BYTES, "int", lo=1, hi=1 << 62)
    checkpoint_seconds: float = setting(CHECKPOINT_SECONDS, "real", lo=0, lo_open=True,
                                        hi=1e12)
    lock_timeout: float = setting(0.0, "real", lo=0, hi=1e12)
    max_resident_bytes: int = setting(MAX_RESIDENT_BYTES, "int", lo=0, hi=1 << 62)


class Durable:
    """What a memory opened on a folder adds to a memory in RAM (see the module
    docstring): mixed into :class:`~memgas_gpu.memory.DurableMemory`, whose
    ``_plain`` is the in-RAM class a copy becomes."""

    _plain: type

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path, encoder: Any = None, *, readonly: bool = False,
             checkpoint_bytes: Optional[int] = None,
             checkpoint_seconds: Optional[float] = None,
             lock_timeout: float = 0.0,
             max_resident_bytes: Optional[int] = None) -> "Durable":
        """See :meth:`MemoryIndex.open`."""
        opts = DurableParams(
            CHECKPOINT_BYTES if checkpoint_bytes is None else checkpoint_bytes,
            CHECKPOINT_SECONDS if checkpoint_seconds is None else checkpoint_seconds,
            lock_timeout,
            MAX_RESIDENT_BYTES if max_resident_bytes is None else max_resident_bytes)
        folder = Path(path)
        if readonly:
            if not folder.is_dir() or (folder_format(folder) is None
                                       and is_unfinished(folder)):
                raise IndexFormatError(f"{folder}: no memory to open read-only")
            return cls._follow(folder, encoder, opts)
        return cls._open_writer(folder, encoder, opts)

    @classmethod
    def _open_writer(cls, folder: Path, encoder, opts: DurableParams) -> "Durable":
        check_target(folder)
        files.make_dirs(folder)  # each new level durable in its parent
        lock = FolderLock(folder, opts.lock_timeout, what="the memory is open for writing")
        try:
            lock.acquire()
        except IndexLockError as e:
            raise IndexLockError(f"{e}; open it read-only with readonly=True to follow "
                                 "it") from None
        wal = None
        try:
            t0 = time.perf_counter()
            fmt = folder_format(folder)
            if fmt is None and not is_unfinished(folder):
                raise pointer_missing(folder)
            if fmt is None:  # new, or a creation a crash interrupted: made again
                idx = cls._create(folder, encoder)
                written, lsn = idx._written, 0
            elif fmt == FORMAT_VERSION:
                try:
                    parts, written = read_commit(folder)
                except FileNotFoundError as e:  # nobody else writes: a file is missing
                    raise IndexFormatError(f"{e.filename}: missing: the memory's folder is "
                                           "incomplete (nothing was changed)") from None
                idx = assemble(cls, parts, str(folder / POINTER),
                               max_resident_bytes=opts.max_resident_bytes)
                cut_uncommitted(folder, written)  # what an interrupted commit appended
                lsn = written.lsn
            else:  # formats 1 to 3: converted by the first commit below
                from ..storage.legacy import read_json

                top, _ = read_json(folder / POINTER)
                parts, _ = read_legacy(folder, top)
                idx = assemble(cls, parts, str(folder / POINTER))
                written, lsn = Written(), int(parts.header.get("lsn") or 0)
            if encoder is not None:
                idx.use_encoder(encoder)  # checked against the memory's record
            if fmt is not None and fmt < 3:
                wal = _new_log(folder / WAL, lsn)
            else:
                wal = WriteAheadLog.open(folder / WAL, after=lsn, create=fmt is None,
                                         lock=False)
            idx._attach(folder, wal, lock, written, opts, readonly=False)
            n, last = replay(idx, wal.replay(lsn), str(folder / WAL))
            idx._lsn = wal.last_lsn
            if (fmt is not None and fmt < FORMAT_VERSION) or n:  # converted, or a replayed log
                idx._checkpoint(full=fmt is not None and fmt < FORMAT_VERSION)
            if fmt is not None and fmt < FORMAT_VERSION:
                remove_legacy(folder)
            idx.recovery = {"replayed": n, "seconds": time.perf_counter() - t0}
            return idx
        except BaseException:
            if wal is not None:
                wal.close()
            lock.release()
            raise

    @classmethod
    def _create(cls, folder: Path, encoder) -> "Durable":
        """A new, empty memory in ``folder`` (held locked): its first commit, an empty
        log; ``CREATING`` marks the folder until the commit is durable, so that a crash
        in between leaves a folder the next open creates again."""
        from ..data.model import Dataset

        stale = [p for p in (folder / WAL).glob("*.log")] if (folder / WAL).is_dir() else []
        stale += [p for p in (folder / "data").iterdir()] if (folder / "data").is_dir() else []
        stale += [p for p in folder.iterdir() if files.is_temporary(p.name)]
        files.remove(stale)  # what an interrupted creation left (CREATING still there)
        idx = cls.build(Dataset([]), encoder, progress=False)
        _, idx._written = commit_folder(folder, idx.commit_input(), idx.dim)
        return idx

    @classmethod
    def _follow(cls, folder: Path, encoder, opts: Optional[DurableParams] = None
                ) -> "Durable":
        opts = opts or DurableParams()
        snap = read_snapshot(folder)
        idx = assemble(cls, snap.parts, str(folder / POINTER),
                       max_resident_bytes=opts.max_resident_bytes)
        n, last = replay(idx, snap.records, str(folder / WAL))
        written = snap.written or Written()
        idx._attach(folder, None, None, written, opts, readonly=True)
        idx._lsn = last if last is not None else (snap.written.lsn if snap.written else 0)
        idx._follows = snap.version
        if encoder is not None:
            idx.use_encoder(encoder)
        return idx

    def _attach(self, folder: Path, wal: Optional[WriteAheadLog], lock, written: Written,
                opts: DurableParams, readonly: bool) -> None:
        self._folder = folder
        self._log = wal
        self._lock = lock
        self._written = written
        self._opts = opts
        self._readonly = readonly
        self._pending: collections.deque = collections.deque()
        self._publish_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._failed: Optional[str] = None
        self._closed = False
        #: LSN of the last published write (what a checkpoint of the published state
        #: covers)
        self._lsn = written.lsn
        self._bytes_at_checkpoint = wal.stats.bytes_written if wal is not None else 0
        self._last_checkpoint = time.monotonic()
        self._checkpoint_failures = 0
        self._follows = None
        self.recovery = {"replayed": 0, "seconds": 0.0}

    def __reduce_ex__(self, protocol):
        """A copy is a memory in RAM, not the folder's writer."""
        state = {k: v for k, v in self.__getstate__().items() if k not in _DURABLE_FIELDS}
        return (_plain_copy, (self._plain, state))

    # ------------------------------------------------------------------ what it is
    @property
    def folder(self) -> Optional[str]:
        return str(self._folder)

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def log_stats(self):
        """The write-ahead log's counters since the memory was opened (``appends``,
        ``fsyncs``, ``dir_fsyncs``, ``bytes_written``: a
        :class:`~memgas_gpu.storage.log.WALStats`; fewer fsyncs than appends means
        writers shared them), or None for a follower."""
        return self._log.stats if self._log is not None else None

    def storage_stats(self) -> dict:
        """The folder as the memory sees it: the commit number, the LSN it covers and
        the bytes it wrote (0 when it was read, not written, by this process), the last
        LSN published, log bytes since the last checkpoint, checkpoints that
        failed (a full disk: the log keeps every write meanwhile), and the packs'
        garbage and live bytes."""
        garbage, live = self._written.garbage()
        grown = (self._log.stats.bytes_written - self._bytes_at_checkpoint
                 if self._log is not None else 0)
        return {"commit": self._written.commit, "commit_lsn": self._written.lsn,
                "last_commit_bytes": self._written.bytes,
                "lsn": self._lsn, "log_bytes_since_checkpoint": grown,
                "checkpoint_failures": self._checkpoint_failures,
                "garbage_bytes": garbage, "live_bytes": live}

    # ------------------------------------------------------------------ writing
    def _check_writable(self) -> None:
        if self._readonly:
            raise PermissionError(f"{self._folder}: this memory was opened read-only; open "
                                  "it without readonly=True (one writer at a time) to "
                                  "write")
        if self._closed:
            raise ValueError(f"{self._folder}: this memory is closed")
        if self._failed is not None:
            raise WALError(f"{self._folder}: {self._failed}; close the memory and open the "
                           "folder again (recovery replays what the log holds)")

    def _commit(self, ops: list, state, stale):
        ticket = self._log.submit(encode(ops))  # under the write lock: log order
        self._pending.append((ticket, state, stale))
        return lambda: self._settle(ticket)

    def _settle(self, ticket) -> None:
        """Wait until ``ticket``'s record is durable (sharing the fsync of its group),
        then publish, in log order, every state whose record is; then a checkpoint if
        the log grew enough (a failure of it does not fail this write, which is
        durable)."""
        try:
            self._log.wait(ticket)
        except BaseException as e:
            self._failed = (f"a write to the log failed ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:160]}); the writes queued with "
                            "it were not made")
            with self._publish_lock:
                self._pending.clear()
            raise
        self._publish_durable()
        self._maybe_checkpoint()

    def _publish_durable(self) -> None:
        with self._publish_lock:
            while self._pending and self._pending[0][0].done and \
                    self._pending[0][0].error is None:
                t, state, stale = self._pending.popleft()
                self._publish(state, stale)
                self._lsn = t.lsn

    def _drain(self) -> None:
        """Wait (under the write lock) until every queued write is published."""
        while True:
            with self._publish_lock:
                if not self._pending:
                    return
                t = self._pending[-1][0]
            self._settle_quietly(t)

    def _settle_quietly(self, ticket) -> None:
        try:
            self._log.wait(ticket)
        except BaseException:
            self._failed = self._failed or "a write to the log failed"
            with self._publish_lock:
                self._pending.clear()
            raise
        self._publish_durable()

    def _maybe_checkpoint(self) -> None:
        grown = self._log.stats.bytes_written - self._bytes_at_checkpoint
        if grown < self._opts.checkpoint_bytes and \
                time.monotonic() - self._last_checkpoint < self._opts.checkpoint_seconds:
            return
        if not self._checkpoint_lock.acquire(blocking=False):
            return  # another writer is checkpointing
        try:
            self._checkpoint()
        except Exception as e:  # noqa: BLE001 - the write itself is durable
            self._checkpoint_failures += 1
            # try again after as much log again (not at every write)
            self._bytes_at_checkpoint = self._log.stats.bytes_written
            self._last_checkpoint = time.monotonic()
            log.warning("%s: an automatic checkpoint failed (%s: %s); every write is in the "
                        "log, which keeps growing until a checkpoint succeeds",
                        self._folder, type(e).__name__, " ".join(str(e).split())[:200])
        finally:
            self._checkpoint_lock.release()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self) -> None:
        """Write a commit of what the memory holds (the changed conversations and the new
        sessions only) and drop the log that covered it.  Runs by itself as the log
        grows, and on :meth:`close`.

        Raises:
            OSError: writing failed (a full disk): the previous commit and the log still
                hold every write; nothing of this checkpoint is left.
        """
        self._check_writable()
        with self._checkpoint_lock:
            self._checkpoint()

    def _checkpoint(self, full: bool = False) -> None:
        with self._publish_lock:
            state, lsn = self._state, self._lsn
        inp = self.commit_input(state, lsn=lsn)
        self._written = write_commit(self._folder, inp, self._written, full=full)
        self._log.truncate_through(lsn)  # only once the commit naming it is durable
        self._bytes_at_checkpoint = self._log.stats.bytes_written
        self._last_checkpoint = time.monotonic()

    def compact(self) -> int:
        """Drop the sessions no conversation uses now, then write a full commit and
        empty the log: no file of the folder holds the removed sessions' texts or
        embeddings any more (even when an automatic compaction had dropped them from
        memory already).  Returns how many were dropped."""
        self._check_writable()
        with self._write_lock:
            self._drain()
            dropped = super().compact()
            with self._checkpoint_lock:
                self._checkpoint(full=True)
        return dropped

    # ------------------------------------------------------------------ followers
    def refresh(self) -> int:
        """A memory opened read-only: read what its writer made durable since; returns
        how many writes it applied (-1: it read the writer's newer commit).

        Raises:
            ValueError: the memory is its folder's writer, not a follower.
        """
        if not self._readonly:
            raise ValueError("refresh() follows a memory opened with readonly=True")
        from ..storage.commit import read_pointer

        try:
            pointer = read_pointer(self._folder)
        except FileNotFoundError:
            raise pointer_missing(self._folder) from None
        if self._written.root != pointer["root"]:
            return self._reload()
        n = 0
        try:
            records = list(WriteAheadLog.read(self._folder / WAL, self._lsn))
        except WALError as e:
            from ..storage.log import WALCorruptionError

            if isinstance(e, WALCorruptionError):
                raise
            return self._reload()  # a checkpoint truncated the log meanwhile
        for lsn, payload in records:
            if lsn != self._lsn + 1:
                return self._reload()
            replay(self, [(lsn, payload)], str(self._folder / WAL))
            self._lsn = lsn
            n += 1
        return n

    def _reload(self) -> int:
        fresh = type(self)._follow(self._folder, self._encoder, self._opts)
        self._reset(fresh)
        self._written, self._lsn = fresh._written, fresh._lsn
        self.signal_modules = fresh.signal_modules
        return -1

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Wait for the writes in flight, checkpoint, and release the folder (a
        follower releases nothing: it holds nothing).  Reads still work afterwards;
        writes are refused."""
        if self._closed:
            return
        try:
            if not self._readonly and self._failed is None:
                with self._write_lock:
                    self._drain()
                with self._checkpoint_lock:
                    self._checkpoint()
        finally:
            self._closed = True
            if self._log is not None:
                self._log.close()
            if self._lock is not None:
                self._lock.release()

    def abandon(self) -> None:
        """Let the folder go as a killed process would: no checkpoint, the log and the
        lock just closed (crash tests in one process; the folder then recovers from
        what the log holds)."""
        self._closed = True
        self._failed = "abandoned"
        if self._log is not None:
            self._log.close()
        if self._lock is not None:
            self._lock.release()


#: what a durable memory adds to a MemoryIndex (a copy in RAM drops it)
_DURABLE_FIELDS = frozenset({
    "_folder", "_log", "_lock", "_written", "_opts", "_readonly", "_pending",
    "_publish_lock", "_checkpoint_lock", "_failed", "_closed", "_lsn",
    "_bytes_at_checkpoint", "_last_checkpoint", "_checkpoint_failures", "_follows",
    "recovery"})


def _plain_copy(cls: type, state: dict):
    plain = cls.__new__(cls)
    plain.__setstate__(state)
    return plain


def _new_log(wal: Path, lsn: int) -> WriteAheadLog:
    """An empty log for a folder of format 1 or 2 (which had none; a stray one is
    replaced)."""
    if wal.is_dir():
        files.remove([p for p in wal.iterdir() if p.suffix == ".log"])
    return WriteAheadLog.open(wal, after=lsn, create=True, lock=False)
