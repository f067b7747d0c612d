"""A memory opened on a folder: every write logged and synced before it returns,
checkpoints that cost what changed, recovery, compaction that deletes, and read-only
followers (docs/index-format.md, format 3; docs/failure.md, "A durable memory").

:class:`Durable` is the part of a :class:`~memgas_gpu.retrieve.MemoryIndex` that owns
its folder: the writer's lock (``.lock``, held while the memory is open), the
write-ahead log (:mod:`.wal`, records of :mod:`.records`), and the checkpoints
(:mod:`.checkpoint`).  The index builds each write's new state under its write lock and
hands it here with the write's record; the record is queued in that order, synced with
whatever other writers queued meanwhile (one fsync for the group), and the states are
published in log order once their records are durable.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any, Optional

import torch

from ..data.model import Question
from ..storage.commit import (Written, read_checkpoint, remove_replaced, remove_unreferenced,
                         write_checkpoint, written_files)
from ..storage.validate import IndexFormatError
from ..storage.records import decode
from ..storage.folder import (DURABLE_VERSION, FORMAT_NAME, IndexLockError, folder_version,
                      read_pointer, writer_lock)
from ..storage.log import WALError, WriteAheadLog

__all__ = ["Durable", "CHECKPOINT_BYTES", "CHECKPOINT_SECONDS", "open_memory",
           "load_memory"]

log = logging.getLogger(__name__)

#: log bytes after which a write runs a checkpoint (default of ``MemoryIndex.open``)
CHECKPOINT_BYTES = 64 << 20
#: seconds after which a write runs a checkpoint, whatever the log holds
CHECKPOINT_SECONDS = 300.0
_READ_TRIES = 20


class Durable:
    """The folder side of a memory opened with :meth:`MemoryIndex.open` (see the module
    docstring).  Thread-safe; one writer process per folder, any number of readers."""

    def __init__(self, index, folder: Path, wal: Optional[WriteAheadLog], lock,
                 written: Written, checkpoint_bytes: int, checkpoint_seconds: float,
                 readonly: bool) -> None:
        self.index = index
        self.folder = folder
        self.wal = wal
        self.readonly = readonly
        self._lock_cm = lock
        self.written = written
        self.checkpoint_bytes = checkpoint_bytes
        self.checkpoint_seconds = checkpoint_seconds
        self._pending: collections.deque = collections.deque()
        self._publish_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._failed: Optional[str] = None
        self._closed = False
        #: LSN of the last published write (what a checkpoint of the published state
        #: covers)
        self.lsn = written.lsn
        self._bytes_at_checkpoint = wal.stats.bytes_written if wal is not None else 0
        self._swept = False  # whether a checkpoint of this process listed the folder
        self._last_checkpoint = time.monotonic()

    # ------------------------------------------------------------------ writing
    def check_writable(self) -> None:
        if self.readonly:
            raise PermissionError(f"{self.folder}: this memory was opened read-only; open "
                                  "it without readonly=True (one writer at a time) to "
                                  "write")
        if self._closed:
            raise ValueError(f"{self.folder}: this memory is closed")
        if self._failed is not None:
            raise WALError(f"{self.folder}: {self._failed}; close the memory and open the "
                           "folder again (recovery replays what the log holds)")

    def submit(self, record: bytes, state, stale) -> Any:
        """Queue ``record`` (under the index's write lock: log order is write order)."""
        ticket = self.wal.submit(record)
        self._pending.append((ticket, state, stale))
        return ticket

    def commit(self, ticket) -> None:
        """Wait until ``ticket``'s record is durable (sharing the fsync of its group),
        then publish, in log order, every state whose record is."""
        try:
            self.wal.wait(ticket)
        except BaseException as e:
            self._failed = (f"a write to the log failed ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:160]}); the writes queued with "
                            "it were not made")
            with self._publish_lock:
                self._pending.clear()
            raise
        with self._publish_lock:
            while self._pending and self._pending[0][0].done and \
                    self._pending[0][0].error is None:
                t, state, stale = self._pending.popleft()
                self.index._publish(state, stale)
                self.lsn = t.lsn
        self._maybe_checkpoint()

    def drain(self) -> None:
        """Wait (under the index's write lock) until every queued write is published."""
        while True:
            with self._publish_lock:
                if not self._pending:
                    return
                t = self._pending[-1][0]
            self.commit(t)

    def _maybe_checkpoint(self) -> None:
        grown = self.wal.stats.bytes_written - self._bytes_at_checkpoint
        if grown >= self.checkpoint_bytes or \
                time.monotonic() - self._last_checkpoint >= self.checkpoint_seconds:
            if self._checkpoint_lock.acquire(blocking=False):
                try:
                    self._checkpoint()
                finally:
                    self._checkpoint_lock.release()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self) -> None:
        """Write a checkpoint of the published state and drop the log it covers."""
        self.check_writable()
        with self._checkpoint_lock:
            self._checkpoint()

    def _checkpoint(self) -> None:
        idx = self.index
        with self._publish_lock:
            state, lsn = idx.state(), self.lsn
        keys = idx.graph_keys_of(state)
        old = self.written
        self.written = write_checkpoint(self.folder, state, lsn, old,
                                        _header(idx, state), _questions(idx, state), keys)
        self.wal.truncate_through(lsn)
        if self._swept:  # only what this checkpoint replaced (no listing of the folder)
            remove_replaced(self.folder, old, self.written)
        else:  # the first checkpoint of this process: whatever a crash left too
            remove_unreferenced(self.folder, self.written.name, written_files(self.written))
            _remove_format2(self.folder)
            self._swept = True
        self._bytes_at_checkpoint = self.wal.stats.bytes_written
        self._last_checkpoint = time.monotonic()

    def compacted(self) -> None:
        """After a compaction: a checkpoint of every file, and a log emptied of what the
        removed sessions were (every log file the checkpoint covers is removed, the
        current one included: the log starts a new one)."""
        self.check_writable()
        with self._checkpoint_lock:
            self._checkpoint()

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        if self._closed:
            return
        try:
            if not self.readonly and self._failed is None:
                self.drain()
                with self._checkpoint_lock:
                    self._checkpoint()
        finally:
            self._closed = True
            if self.wal is not None:
                self.wal.close()
            if self._lock_cm is not None:
                self._lock_cm.__exit__(None, None, None)

    def abandon(self) -> None:
        """Let the folder go as a killed process would: no checkpoint, the log and the
        lock just closed (crash tests in one process; the folder then recovers from
        what the log holds)."""
        self._closed = True
        self._failed = "abandoned"
        if self.wal is not None:
            self.wal.close()
        if self._lock_cm is not None:
            self._lock_cm.__exit__(None, None, None)

    # ------------------------------------------------------------------ readers
    def refresh(self) -> int:
        """A read-only memory: apply what the writer logged since (or reload its newer
        checkpoint); returns how many writes were applied."""
        pointer = read_pointer(self.folder)
        if pointer.get("current") != self.written.name:
            return -1  # a newer checkpoint: the caller reloads
        n = 0
        for lsn, payload in WriteAheadLog.read(self.folder / "wal", self.lsn):
            if lsn != self.lsn + 1:
                return -1  # records truncated meanwhile: reload
            self.index._apply(decode(payload, f"{self.folder / 'wal'}: record {lsn}"))
            self.lsn = lsn
            n += 1
        return n


def _header(idx, state) -> dict:
    """The settings a checkpoint records (nothing here costs more than the memory's
    settings: no view of the whole memory is made)."""
    from ..retrieve.signals import custom_signal_modules

    lex = state.tables.lexical_base
    return {"format": FORMAT_NAME, "params": dataclasses.asdict(idx.params),
            "tables": sorted(state.tables.dense), "config": idx.config,
            "lexical": lex.describe() if lex is not None else None,
            "signal_modules": {**idx.signal_modules, **custom_signal_modules()}}


def _questions(idx, state) -> dict:
    lex = state.tables.lexical_base
    return {"records": [{"id": q.id, "text": q.text, "type": q.type, "date": q.date,
                         "answer": q.answer,
                         "evidence_session_ids": list(q.evidence_session_ids),
                         "evidence_turn_ids": list(q.evidence_turn_ids),
                         "is_abstention": q.is_abstention} for q in idx.questions],
            "conversations": list(idx.question_conversation_ids()),
            "q_emb": idx.q_emb.float(), "terms": lex.queries if lex is not None else None}


def _remove_format2(folder: Path) -> None:
    """A format-2 folder opened for writing: its versions, once a checkpoint replaced
    them."""
    import re
    import shutil

    for p in folder.iterdir():
        if re.fullmatch(r"v-[0-9a-f]{32}", p.name) or p.name == "tensors.safetensors":
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- opening
def _from_checkpoint(cls, folder: Path):
    """A MemoryIndex of the checkpoint the folder's pointer names (retrying when a
    writer replaced it meanwhile), its Written and its parts."""
    for attempt in range(_READ_TRIES):
        try:
            parts = read_checkpoint(folder, read_pointer(folder))
            break
        except FileNotFoundError as e:
            if attempt == _READ_TRIES - 1:
                raise IndexFormatError(f"{e.filename}: missing: the memory's folder is "
                                       "incomplete") from None
    return _assemble(cls, parts), parts


def _assemble(cls, parts):
    from ..lexical import LexicalIndex, TermMatrix, Tokenizer
    from ..lexical.tokenize import Vocabulary
    from ..ops.csr import join_csr
    from .meta import ConversationMeta
    from ..retrieve.params import GraphParams

    m, st = parts.manifest, parts.store
    lexical = None
    if st["lexical"] is not None:
        docs, ptr, terms = st["lexical"]
        b = parts.base
        queries = TermMatrix(b["lexical.q.indptr"], b["lexical.q.indices"],
                             b["lexical.q.tf"].float())
        lexical = LexicalIndex(Tokenizer.from_config(m["lexical"]["tokenizer"]),
                               Vocabulary(terms),
                               {g: TermMatrix(*v) for g, v in docs.items()}, ptr, queries)
    metas = [ConversationMeta(meta["id"], list(meta["session_ids"]),
                              list(meta["session_dates"]), meta.get("session_metadata"))
             for meta, *_ in parts.segments]
    sizes = torch.tensor([len(x.session_ids) for x in metas], dtype=torch.long)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    row_slot = (torch.cat([slots for _, slots, _, _ in parts.segments]) if metas
                else torch.zeros(0, dtype=torch.long))
    keys = list(m["graphs"])
    graphs = {k: join_csr([g[k] for *_, g in parts.segments]) for k in keys} if metas \
        else {}
    ids = {x.id: i for i, x in enumerate(metas)}
    q_conv = torch.tensor([ids[c] for c in m["question_conversations"]], dtype=torch.long)
    questions = [Question(id=q["id"], text=q["text"], type=q["type"], date=q["date"],
                          answer=q["answer"],
                          evidence_session_ids=tuple(q["evidence_session_ids"]),
                          evidence_turn_ids=tuple(q.get("evidence_turn_ids", ())),
                          is_abstention=q["is_abstention"]) for q in m["questions"]]
    idx = cls(conversations=metas, questions=questions, conv_offsets=offsets,
              row_slot=row_slot, gran=st["gran"], concat=None, tables=st["dense"],
              q_emb=parts.base["q_emb"].float(), q_conv=q_conv, graphs=graphs,
              params=GraphParams(**m["params"]), config=m["config"], lexical=lexical,
              turns=st["turns"], turn_ptr=st["turn_ptr"], turn_text=st["turn_text"],
              digest=st["digest"], generation=int(m["generation"]),
              segment_days=[days for _, _, days, _ in parts.segments])
    idx.signal_modules = dict(m.get("signal_modules") or {})
    return idx


def _replay(idx, records) -> tuple[int, int]:
    """Apply log records after the checkpoint; ``(applied, last lsn)``."""
    n, last = 0, None
    for lsn, payload in records:
        rec = decode(payload, f"log record {lsn}")
        if idx._apply(rec):
            n += 1
        last = lsn
    return n, last


def open_memory(cls, path, *, encoder=None, readonly: bool = False,
                checkpoint_bytes: int = CHECKPOINT_BYTES,
                checkpoint_seconds: float = CHECKPOINT_SECONDS,
                lock_timeout: float = 0.0):
    """:meth:`MemoryIndex.open` (see there)."""
    from ..data.model import Dataset
    from ..retrieve.signals import import_signal_modules
    from ..storage.folder import check_target

    folder = Path(path)
    version = folder_version(folder) if folder.is_dir() else None
    if readonly:
        if version is None:
            raise IndexFormatError(f"{folder}: no memory to open read-only")
        return load_memory(cls, folder, follow=True)
    check_target(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = writer_lock(folder, lock_timeout)
    try:
        lock.__enter__()
    except IndexLockError as e:
        raise IndexLockError(f"{e}; one process writes a memory at a time (open it "
                             "read-only with readonly=True to follow it)") from None
    try:
        t0 = time.perf_counter()
        if version == DURABLE_VERSION:
            idx, parts = _from_checkpoint(cls, folder)
            written = parts.written
            for line in import_signal_modules(idx.signal_modules):
                log.warning("%s: %s", folder, line)
        elif version is not None:  # format 1 or 2: converted by the first checkpoint
            from ..storage.persist import load_index

            idx = load_index(folder, cls)
            written = Written()
        else:
            idx = cls.build(Dataset([]), encoder, progress=False)
            written = Written()
        if encoder is not None:
            idx.use_encoder(encoder)  # checked against the memory's record
        wal = WriteAheadLog.open(folder / "wal")
        n, last = _replay(idx, wal.replay(written.lsn))
        d = Durable(idx, folder, wal, lock, written, checkpoint_bytes, checkpoint_seconds,
                    False)
        d.lsn = max(written.lsn, last or 0, wal.last_lsn if wal.last_lsn else 0)
        idx._durable = d
        if written.name is None or n:  # a new or converted folder, or a replayed log
            d.checkpoint()
        idx.recovery = {"replayed": n, "seconds": time.perf_counter() - t0}
        _sync_written_segments(d)
        return idx
    except BaseException:
        lock.__exit__(None, None, None)
        raise


def _sync_written_segments(d: Durable) -> None:
    """After a load: the checkpoint's segment files belong to the loaded segments'
    versions (so an unchanged conversation is not written again)."""
    if d.written.segments:
        return
    name = d.written.name
    if name is None:
        return
    import json

    m = json.loads((d.folder / name).read_text(encoding="utf-8"))
    by_id = {e["id"]: e for e in m["segments"]}
    d.written.segments = {s.id: (s.version, by_id[s.id]) for s in d.index.state().segments
                          if s.id in by_id}


def load_memory(cls, path, follow: bool = False):
    """A memory of a durable folder as its writer last made it durable: the checkpoint
    and the log after it (the writer keeps writing; :meth:`MemoryIndex.refresh` reads
    what it adds when ``follow``)."""
    folder = Path(path)
    idx, parts = _from_checkpoint(cls, folder)
    n, last = _replay(idx, WriteAheadLog.read(folder / "wal", parts.written.lsn))
    if follow:
        d = Durable(idx, folder, None, None, parts.written, 0, 0.0, True)
        d.lsn = last if last is not None else parts.written.lsn
        idx._durable = d
    return idx

