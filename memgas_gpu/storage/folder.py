"""A memory's folder as a whole: which format it holds, what may be written into it,
``save`` (one complete commit, replacing what was there atomically), and reading it
back — any format, as one consistent snapshot even while a writer checkpoints.

Every path that reads a folder (``MemoryIndex.load``, ``open``, ``open(readonly=True)``,
``refresh``) goes through :func:`read_snapshot` (the commit, or an older format, and the
log records after it), :func:`assemble` (the one validation, the one assembler, the
custom signals imported again) and :func:`replay` (each record decoded, checked and
applied).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from ..errors import MemgasError
from . import files
from .commit import (DATA, FORMAT_NAME, FORMAT_VERSION, POINTER, WAL, Written,
                     cut_uncommitted, read_commit, read_pointer, write_commit)
from .legacy import LEGACY_VERSION, read_json, read_legacy, remove_legacy
from .lock import LOCK_NAME, LOCK_TIMEOUT, FolderLock, IndexLockError, check_lock_timeout
from .log import WALCorruptionError, WALError, WriteAheadLog
from .validate import IndexFormatError, check_parts

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "NEWEST_VERSION", "FolderVersion",
           "IndexConflictError", "IndexFormatError", "IndexLockError", "LOCK_TIMEOUT",
           "LEGACY_VERSION", "folder_format", "current_version", "check_target",
           "save_index", "load_index", "read_snapshot", "assemble", "replay", "Snapshot",
           "CREATING"]

#: the newest format this version reads (and the one it writes)
NEWEST_VERSION = FORMAT_VERSION
#: a new folder's marker, there until its first commit is durable: a crash in between
#: leaves a folder the next ``open`` creates again
CREATING = ".creating"
_READ_TRIES = 20
_OWN = {POINTER, LOCK_NAME, DATA, WAL, CREATING, "tensors.safetensors"}
_OLD = re.compile(r"^(v-[0-9a-f]{32}|ckpt-[0-9a-f]{32}\.json|\.tmp-v-.*)$")


class IndexConflictError(MemgasError):
    """The folder holds another version than the one the index was loaded from or last
    saved to: another process saved there meanwhile (nothing was written)."""


class FolderVersion(NamedTuple):
    """Where an index was loaded from or last saved to: the folder (absolute, symbolic
    links resolved) and the version it was at (``"commit-N-<crc>"``, or an older
    format's version name)."""

    folder: str
    version: str


def _is_own(name: str) -> bool:
    return name in _OWN or bool(_OLD.match(name)) or files.is_temporary(name)


# ---------------------------------------------------------------------------- what is there
def _top(path: Path) -> Optional[dict]:
    """The folder's ``manifest.json`` (its header checked), or None without one."""
    top = path / POINTER
    try:
        m, _ = read_json(top)
    except FileNotFoundError:
        return None
    if not isinstance(m, dict):
        raise IndexFormatError(f"{top}: expected a JSON object, got {type(m).__name__}")
    if m.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{top}: not a memgas_gpu index (format "
                               f"{json.dumps(m.get('format'))[:80]})")
    version = m.get("version")
    if type(version) is not int:
        raise IndexFormatError(f"{top}: field 'version': expected an integer, got "
                               f"{json.dumps(version)[:80]}")
    if version > NEWEST_VERSION:
        raise IndexFormatError(
            f"{top}: index format version {version} is newer than this memgas_gpu reads "
            f"({NEWEST_VERSION}); upgrade memgas_gpu (pip install -U memgas_gpu)")
    if version < 1:
        raise IndexFormatError(f"{top}: field 'version': {version} is not a format version")
    return m


def folder_format(path) -> Optional[int]:
    """The format of the memory folder ``path`` (1 to 4), or None when it holds none.

    Raises:
        IndexFormatError: ``manifest.json`` is unreadable or of a newer format.
    """
    m = _top(Path(path))
    return None if m is None else m["version"]


def current_version(path) -> Optional[str]:
    """The version the folder ``path`` is at now (changes with every commit or save),
    or None when it holds no memory."""
    m = _top(Path(path))
    if m is None:
        return None
    if m["version"] == FORMAT_VERSION:
        p = read_pointer(path)
        return f"commit-{p['commit']}-{p['root'][3]:08x}"
    return m.get("current") or LEGACY_VERSION


def check_target(path) -> None:
    """Refuse (:class:`IndexFormatError`) a ``path`` no memory may be written to: a file,
    a ``manifest.json`` that is not a file, or a folder holding files that are not a
    memory's (nothing of the user's is ever replaced)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise IndexFormatError(f"{path}: exists and is not a folder; not replaced")
    top = path / POINTER
    if top.exists() and not top.is_file():
        what = "a folder, not a file" if top.is_dir() else "not a regular file"
        raise IndexFormatError(f"{top}: {what}; the folder is not replaced")
    if path.is_dir() and not top.exists():
        foreign = sorted(p.name for p in path.iterdir() if not _is_own(p.name))
        if foreign:
            raise IndexFormatError(f"{path}: a folder that is not an index (holds "
                                   f"{foreign[0]!r}); not replaced")


def is_unfinished(path) -> bool:
    """Whether ``path`` is a folder a crash left before its first commit (a writer
    creates it again), as opposed to a memory that lost its pointer."""
    path = Path(path)
    if (path / POINTER).exists():
        return False
    if (path / CREATING).exists():
        return True
    data, wal = path / DATA, path / WAL
    return not ((data.is_dir() and any(data.iterdir())) or
                (wal.is_dir() and any(p.suffix == ".log" for p in wal.iterdir())))


def pointer_missing(path) -> IndexFormatError:
    return IndexFormatError(
        f"{Path(path) / POINTER}: missing: the folder holds a memory's data and log but not "
        "the pointer that names its last commit (deleted?); restore it from a backup "
        "(nothing was changed)")


# ---------------------------------------------------------------------------- reading
class Snapshot(NamedTuple):
    """One consistent read of a folder: the parts of its commit (or older format), what
    the commit holds (``written``: None for formats 1 and 2), the log records after it
    ``[(lsn, payload)]``, the version read and the format."""

    parts: object
    written: Optional[Written]
    records: list
    version: str
    format: int


def _read_once(folder: Path, top: dict) -> Snapshot:
    fmt = top["version"]
    if fmt == FORMAT_VERSION:
        pointer = read_pointer(folder)
        parts, written = read_commit(folder, pointer)
        version = f"commit-{pointer['commit']}-{pointer['root'][3]:08x}"
        lsn = written.lsn
    else:
        parts, version = read_legacy(folder, top)
        written, lsn = None, int(parts.header.get("lsn") or 0)
    records = []
    if fmt >= 3:
        wal = folder / WAL
        if not wal.is_dir():
            raise WALCorruptionError(f"{wal}: missing: the records after {lsn} are lost (the "
                                     "log folder was deleted)")
        records = list(WriteAheadLog.read(wal, lsn))
        if fmt == FORMAT_VERSION:
            _check_reaches(wal, lsn, records)
    return Snapshot(parts, written, records, version, fmt)


def _check_reaches(wal: Path, lsn: int, records: list) -> None:
    """The log must hold records up to the commit's LSN at least (its files are named by
    their first record: a log ending before ``lsn`` lost files)."""
    if records:
        return
    names = sorted(int(p.stem) for p in wal.glob("*.log") if p.stem.isdigit())
    if names and names[-1] > lsn + 1:
        raise WALCorruptionError(f"{wal}: the log starts at record {names[-1]}, after the "
                                 f"commit's {lsn}: records are missing")


def read_snapshot(folder) -> Snapshot:
    """Read the folder as one consistent snapshot: its current commit and the log after
    it (a writer's checkpoint that replaced either meanwhile makes it read again, from
    the new pointer, up to 20 times).

    Raises:
        IndexFormatError: no memory, or a damaged one (one line naming the file).
        WALCorruptionError: a damaged log (naming the file and the offset).
    """
    folder = Path(folder)
    last: Optional[BaseException] = None
    for _ in range(_READ_TRIES):
        top = _top(folder)
        if top is None:
            if folder.is_dir() and not is_unfinished(folder):
                raise pointer_missing(folder)
            raise IndexFormatError(f"{folder}: not an index folder (no manifest.json)")
        try:
            return _read_once(folder, top)
        except (FileNotFoundError, WALError) as e:
            if isinstance(e, WALCorruptionError):
                raise
            # a checkpoint removed a pack or truncated the log after we read the pointer:
            # read again if the pointer moved, else the folder is incomplete
            if _top(folder) == top:
                if isinstance(e, FileNotFoundError):
                    name = e.filename if isinstance(e.filename, str) else str(e)
                    raise IndexFormatError(f"{name}: missing: the memory's folder is "
                                           "incomplete") from None
                raise WALCorruptionError(str(e)) from None
            last = e
    raise IndexFormatError(f"{folder}: the writer replaced the commit {_READ_TRIES} times "
                           f"while it was read ({last}); try again")


def assemble(cls, parts, where: str, **options):
    """The memory (a ``cls``) of checked ``parts``: the one validation
    (:func:`~memgas_gpu.storage.validate.check_parts`) and the one assembler
    (``cls.from_parts``); the modules of custom signals the folder records are imported
    again (``MEMGAS_IMPORT_SIGNALS=0`` turns that off), a failure a warning."""
    import logging

    from ..retrieve.signals import import_signal_modules

    check_parts(where, parts)
    try:
        idx = cls.from_parts(parts, **options)
    except (KeyError, TypeError, ValueError, IndexError) as e:  # checks missed something
        raise IndexFormatError(f"{where}: inconsistent index ({type(e).__name__}: {e})") \
            from None
    for line in import_signal_modules(idx.signal_modules):
        logging.getLogger("memgas_gpu.storage").warning("%s: %s", where, line)
    return idx


def replay(idx, records, where: str) -> tuple[int, Optional[int]]:
    """Apply log ``records`` (``(lsn, payload)``) to ``idx`` in order, each decoded and
    checked; ``(records that changed the memory, last lsn)``.

    Raises:
        RecordError: a record that is not one (naming the log and the record).
    """
    from .records import decode

    n, last = 0, None
    for lsn, payload in records:
        ops = decode(payload, f"{where}: record {lsn}")
        for op in ops:
            enc = getattr(op, "encoded", None)
            if enc is not None and enc.row.shape[-1] != idx.dim:
                from .records import RecordError

                raise RecordError(f"{where}: record {lsn}: embeddings of size "
                                  f"{enc.row.shape[-1]}, the memory's are {idx.dim}")
        if idx._replay(ops):
            n += 1
        last = lsn
    return n, last


def load_index(path, cls, **options):
    """The memory in the folder ``path`` (any format) as a ``cls`` (a
    :class:`~memgas_gpu.memory.MemoryIndex`) in memory only: its last commit and the
    log records after it (as its writer made them durable); ``folder_version`` names
    what was read.

    Raises:
        IndexFormatError: not a memory's folder, or a damaged one.
        WALCorruptionError: a damaged log.
    """
    folder = Path(path)
    snap = read_snapshot(folder)
    where = str(folder / POINTER)
    idx = assemble(cls, snap.parts, where, **options)
    replay(idx, snap.records, str(folder / WAL))
    real = os.path.realpath(folder)
    idx.folder_version = FolderVersion(real, snap.version)
    idx.folder_versions = {real: snap.version}
    return idx


# ---------------------------------------------------------------------------- saving
def _expected(index, folder: str) -> Optional[str]:
    """The version ``index`` last saw ``folder`` at (loaded from or saved to), or None."""
    last = index.folder_version
    if last is not None and last.folder == folder:
        return last.version
    return index.folder_versions.get(folder)


def save_index(index, path, dtype: torch.dtype = torch.float32, *, force: bool = False,
               lock_timeout: float = LOCK_TIMEOUT) -> Path:
    """Write ``index`` to the folder ``path`` as one complete commit (format 4, an empty
    log after it); a memory already there (any format) is replaced atomically: readers
    see the old or the new one, never none; the old one's files go once the new commit
    is durable.

    Nothing is written unless the snapshot passes every check a load makes.  An index
    remembers the version of every folder it was loaded from or saved to
    (``index.folder_versions``): saving it into one of them after another writer saved
    there is refused (optimistic concurrency), unless ``force``.  The saves of one
    index run one at a time (``index.saving()``).

    Raises:
        IndexFormatError: ``path`` is a file or a folder that is not an index, a memory
            whose ``manifest.json`` is gone (its packs are not replaced), or the index
            is not valid (one line naming the field; nothing written).
        IndexConflictError: another writer saved to ``path`` since ``index`` was loaded
            from or saved to it.
        IndexLockError: another writer (a save, or a memory open on the folder) held its
            lock for ``lock_timeout`` s.
        OSError: writing failed (a full disk, say), naming the file; the previous
            version is still current.
        TypeError, ValueError: ``lock_timeout`` is not a finite number from 0.
    """
    check_lock_timeout(lock_timeout)
    path = Path(path)
    with index.saving():
        inp = index.commit_input(canonical=True, dtype=dtype)
        _check_input(path, inp)
        check_target(path)
        files.make_dirs(path)
        with FolderLock(path, lock_timeout, what="the folder is being written"):
            check_target(path)
            if _top(path) is None and not is_unfinished(path):
                raise pointer_missing(path)  # a memory whose pointer is gone: not replaced
            real = os.path.realpath(path)
            expect = None if force else _expected(index, real)
            if expect is not None:
                now = current_version(path)
                if now is not None and now != expect:
                    raise IndexConflictError(
                        f"{path}: another writer saved version {now} here since this index "
                        f"was loaded from or saved to version {expect}; nothing was written "
                        "(load the folder again and redo the changes, or save with "
                        "force=True to replace it)")
            name, _ = commit_folder(path, inp, index.dim)
        index.folder_versions = {**index.folder_versions, real: name}
        index.folder_version = FolderVersion(real, name)
    return path


def _check_input(path: Path, inp) -> None:
    """What a save is about to write passes the checks of a load (nothing written
    otherwise)."""
    from .commit import Parts

    try:
        json.dumps(inp.header, ensure_ascii=False, allow_nan=False)
        json.dumps(inp.questions["records"], ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise IndexFormatError(f"{path}: the index cannot be saved: its metadata is not "
                               f"strict JSON ({' '.join(str(e).split())[:200]}); nothing was "
                               "written") from None
    from .._io import find_surrogate

    for what, value in (("header", inp.header), ("questions", inp.questions["records"]),
                        ("conversations", [s.meta.__dict__ for s in inp.segments])):
        bad = find_surrogate(value, what)
        if bad is not None:
            raise IndexFormatError(f"{path}: the index cannot be saved: field {bad!r} holds "
                                   "a lone UTF-16 surrogate (not valid Unicode text); "
                                   "nothing was written")
    t = inp.tables
    lex = t.lexical_base
    store = {"gran": t.gran, "dense": t.dense, "digest": t.digest, "turn_ptr": t.turn_ptr,
             "turns": t.turns, "turn_text": t.turn_text, "lexical": None}
    if lex is not None:
        from .commit import vocab_tensors

        v = vocab_tensors(lex.vocab.terms[:t.n_terms])
        store["lexical"] = ({g: (m.indptr, m.indices, m.tf) for g, m in t.lexical_docs.items()},
                            dict(t.lexical_ptr), v["vocab.bytes"], v["vocab.offsets"])
    header = dict(inp.header, graphs=sorted(inp.graph_keys), dim=int(t.gran.shape[-1]))
    segments = [({"id": s.meta.id, "session_ids": s.meta.session_ids,
                  "session_dates": s.meta.session_dates,
                  "session_metadata": s.meta.session_metadata}, s.slots, s.days,
                 {k: s.graphs[k] for k in inp.graph_keys}) for s in inp.segments]
    q = inp.questions
    terms = q.get("terms")
    check_parts(f"{path} (not saved)", Parts(header, store, segments, {
        "records": q["records"], "conversations": q["conversations"], "q_emb": q["q_emb"],
        "terms": (terms.indptr, terms.indices, terms.tf) if terms is not None else None}))


def commit_folder(path: Path, inp, dim: int) -> tuple[str, Written]:
    """Write ``inp`` as the folder's new complete commit (the caller holds the lock and
    has checked the target); returns the folder's new version and what it holds.  The log is kept past
    every record the folder's log holds (record numbers never go back), and emptied
    once the commit is durable; an older format's files are removed then."""
    top = _top(path)
    fmt = top["version"] if top is not None else None
    new = top is None
    if new and not (path / CREATING).exists():
        files.write_new(path / CREATING, b"", "the folder's creation marker")
        files.sync_dir(path)
    wal = path / WAL
    written = Written()
    if fmt == FORMAT_VERSION:
        try:
            _, written = read_commit(path)
        except (IndexFormatError, FileNotFoundError, OSError):
            written = Written()  # a damaged commit: replaced whole
    log = _fresh_log(wal, written.lsn)
    try:
        lsn = inp.lsn = log.last_lsn
        written = write_commit(path, inp, Written(commit=written.commit, lsn=lsn), full=True)
        cut_uncommitted(path, written)  # what killed writers left (temporaries)
        if lsn >= log.first_lsn:  # records the new commit replaces
            log.truncate_through(lsn)
    finally:
        log.close()
    if fmt is not None and fmt < FORMAT_VERSION:
        remove_legacy(path)
    if new:
        files.remove([path / CREATING])
    return f"commit-{written.commit}-{written.root[3]:08x}", written


def _fresh_log(wal: Path, lsn: int) -> WriteAheadLog:
    """The folder's log, opened: records after the commit's ``lsn`` kept so that the
    next one gets a higher number (a damaged, foreign or missing log is replaced by an
    empty one starting after ``lsn``: a save replaces the whole memory)."""
    names = sorted(int(p.stem) for p in wal.glob("*.log") if p.stem.isdigit()) \
        if wal.is_dir() else []
    if names:
        try:
            log = WriteAheadLog.open(wal, after=names[0] - 1, create=False, lock=False)
            if log.last_lsn >= lsn:
                return log
            log.close()
        except WALError:
            pass
        files.remove([wal / f"{n:020d}.log" for n in names])
    return WriteAheadLog.open(wal, after=lsn, create=True, lock=False)
