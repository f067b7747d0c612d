"""The index folder on disk (format version 2): complete versions behind a pointer,
replaced atomically under a lock; see ``docs/index-format.md`` and ``docs/failure.md``.

``DIR/v-<hex>/`` holds one complete index (``manifest.json`` and
``tensors.safetensors``) and ``DIR/manifest.json`` is a small pointer naming the
current one (and the CRC-32 checksum of its manifest).  A writer takes the lock
(``DIR/.lock``, never followed if it is a symbolic link; a holder that keeps it past a
timeout is reported, not waited for forever), checks that the folder is still at the
version it expects (optimistic concurrency: nothing is silently overwritten), builds
the new version beside the old one, verifies what it wrote, replaces the pointer with
one ``os.replace`` and only then removes the old version and what killed writers left.
A reader follows the pointer and retries if a writer removed the version it was
reading.  So a reader sees the complete old or the complete new index, never none.
Folders of version 1 (the full manifest at the top) still load, and are converted when
saved over.

This module knows files, not index contents: :mod:`.persist` builds the tensors and
the manifest, :mod:`.checks` validates what :func:`read_index_dir` returns.
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import numbers
import os
import re
import shutil
import socket
import stat
import time
import uuid
import zlib
from pathlib import Path
from typing import NamedTuple, Optional

from .._io import (JSONLimitError, atomic_write, find_surrogate, fsync_dir, json_loads,
                   may_hold_surrogate)
from ..errors import MemgasError
from .validate import IndexFormatError

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "DURABLE_VERSION", "NEWEST_VERSION",
           "folder_version", "read_pointer", "writer_lock", "MAX_MANIFEST_BYTES", "LOCK_TIMEOUT",
           "LEGACY_VERSION", "FolderVersion", "StoredIndex", "IndexConflictError",
           "IndexLockError", "current_version", "write_index_dir", "read_index_dir", "check_target",
           "check_lock_timeout"]

FORMAT_NAME = "memgas_gpu.index"
#: what ``save`` writes: 2, versioned subfolders behind a pointer manifest (1: one
#: folder, still read)
FORMAT_VERSION = 2
#: a durable memory's folder (``MemoryIndex.open``): checkpoints and a write-ahead log
DURABLE_VERSION = 3
#: the newest format this version reads
NEWEST_VERSION = DURABLE_VERSION
#: largest version manifest read or written (conversation and question metadata: a
#: LongMemEval-M index needs about 20 MB); a larger file is refused before it is read
MAX_MANIFEST_BYTES = 256 << 20
#: seconds a save waits for another writer's lock before it stops, naming the holder
LOCK_TIMEOUT = 120.0
#: the version name of a version-1 folder (no pointer, no versions)
LEGACY_VERSION = "v1-folder"
_VERSION_DIR = re.compile(r"^v-[0-9a-f]{32}$")
_TMP_PREFIX = ".tmp-"
_LOCK = ".lock"
#: the word after ``PID HOST`` in a lock file its writer released
_RELEASED = "released"
#: the temporary file :func:`memgas_gpu._io.atomic_write` makes for the pointer
_POINTER_TMP = re.compile(r"^\.manifest\.json\.[a-z0-9_]{8}\.tmp$")
_READ_TRIES = 20
#: names a version-2 folder may hold besides ``v-*``, ``.tmp-*`` and pointer temporaries
_OWN = {"manifest.json", "tensors.safetensors", _LOCK, "wal", "data"}
_CHECKPOINT = re.compile(r"^ckpt-[0-9a-f]{32}\.json$")


class IndexConflictError(MemgasError):
    """The folder holds another version than the one the index was loaded from or last
    saved to: another process saved there meanwhile (nothing was written)."""


class IndexLockError(MemgasError):
    """Another writer held the folder's lock past the timeout (nothing was written)."""


class FolderVersion(NamedTuple):
    """Where an index was loaded from or last saved to: the folder (absolute, symbolic
    links resolved) and the version it was at (``"v-<32 hex>"``, or
    :data:`LEGACY_VERSION` for a version-1 folder)."""

    folder: str
    version: str


class StoredIndex(NamedTuple):
    """What :func:`read_index_dir` read: the manifest (its file and value), the
    tensors, the folder version, and whether the manifest differs from the checksum the
    pointer recorded when it was written (reported after its contents are checked)."""

    manifest_file: Path
    manifest: dict
    tensors: dict
    folder_version: FolderVersion
    manifest_changed: bool


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _is_own(name: str) -> bool:
    return (name in _OWN or bool(_VERSION_DIR.match(name)) or name.startswith(_TMP_PREFIX)
            or bool(_CHECKPOINT.match(name))
            or bool(_POINTER_TMP.match(name)))


# ---------------------------------------------------------------------------- the lock
def check_lock_timeout(value) -> float:
    """``value`` as seconds to wait for a lock: a finite number from 0 (not a bool).

    Raises:
        TypeError: not a number.
        ValueError: NaN (it waited forever), infinite or negative.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"lock_timeout: expected a finite number of seconds from 0, got "
                        f"{type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"lock_timeout: expected a finite number of seconds from 0, got "
                         f"{value!r}")
    return seconds


def _process_state(pid: int, inherited: str = ": another process inherited its lock") -> str:
    """What ``/proc`` says of ``pid``: its command and whether it runs."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except FileNotFoundError:
        return "no longer running" + inherited
    except OSError:
        return "state unknown"
    comm = raw[raw.find("(") + 1:raw.rfind(")")][:32]
    state = raw[raw.rfind(")") + 2:][:1]
    what = {"T": "stopped (resume it with kill -CONT, or end it)",
            "t": "stopped by a debugger", "Z": "exited (a zombie)", "X": "exited"}
    return f"{comm}, {what.get(state, 'running')}"


def _holder(fd: int) -> str:
    """The holder a lock file names (``PID HOST`` written by the holder, ``PID HOST
    released`` once that writer released it: then whoever holds it now inherited the
    descriptor from it, a process it started or forked while it saved)."""
    try:
        words = os.pread(fd, 256, 0).decode("ascii", "replace").split()
    except OSError:
        words = []
    if not words or not words[0].isdigit() or len(words[0]) > 10:
        return "another writer (it has not written its process id)"
    pid, host = int(words[0]), (words[1][:64] if len(words) > 1 else "")
    if len(words) > 2 and words[2] == _RELEASED:
        where = (f"on host {host!r}" if host and host != socket.gethostname()
                 else _process_state(pid, inherited=""))
        return (f"a process that inherited it from process {pid} ({where}), which wrote the "
                "lock and released it: a process it started or forked while it saved keeps "
                "the lock open (end that process)")
    if host and host != socket.gethostname():
        return f"process {pid} on host {host!r}"
    return f"process {pid} ({_process_state(pid)})"


def _stamp(fd: int, text: str) -> None:
    """Replace the lock file's contents by ``text`` (never empty in between)."""
    data = text.encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


@contextlib.contextmanager
def _locked(path: Path, timeout: float):
    """Hold an exclusive lock on ``path/.lock`` (writers queue; readers never lock).

    The lock file is opened without following a symbolic link and must be a regular
    file of one name (a hard link would make a save overwrite another file); the holder
    writes ``PID HOST`` into it so that a writer that gives up after ``timeout`` seconds
    can name it, and ``PID HOST released`` when it releases it.
    """
    import fcntl

    lock = path / _LOCK
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(lock, flags, 0o666)  # the umask applies
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise IndexFormatError(f"{lock}: a symbolic link; a lock file is never "
                                   "followed (remove it)") from None
        if e.errno == errno.EISDIR:
            raise IndexFormatError(f"{lock}: a folder, not a lock file (remove it)") \
                from None
        raise
    held = False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IndexFormatError(f"{lock}: not a regular file (remove it)")
        if st.st_nlink > 1:
            raise IndexFormatError(f"{lock}: has {st.st_nlink} hard links (another name of "
                                   "the same file, which a save would overwrite); a lock "
                                   "file must be its own file (remove it)")
        deadline = time.monotonic() + timeout
        pause = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise IndexLockError(
                        f"{lock}: held by {_holder(fd)} for more than {timeout:g} s; "
                        "nothing was written") from None
                time.sleep(pause)
                pause = min(2 * pause, 0.2)
        held = True
        me = f"{os.getpid()} {socket.gethostname()}"
        try:
            _stamp(fd, me + "\n")
        except OSError as e:
            raise (_write_failed(e, lock, "the lock file") or e) from None
        yield
    finally:
        if held:
            with contextlib.suppress(OSError):
                _stamp(fd, f"{me} {_RELEASED}\n")
        os.close(fd)  # releases the lock (unless a process inherited the descriptor)


def writer_lock(path: Path, timeout: float = 0.0):
    """The folder's writer lock (``path/.lock``), held until the context exits: what a
    save holds while it writes, and a durable memory for its whole life.

    Raises:
        IndexLockError: another writer held it for ``timeout`` seconds (naming it).
    """
    return _locked(Path(path), timeout)


# ------------------------------------------------------------------------- writing
def _write_failed(e: BaseException, where: Path, what: str) -> Optional[OSError]:
    """The error to raise for ``e``, a write that failed in the operating system (an
    ``OSError``, or safetensors' error carrying an ``os error N``), naming ``where`` and
    keeping the error number (and so ``OSError``'s subclass); None for other errors."""
    if isinstance(e, OSError) and e.errno is not None:
        code = e.errno
    else:
        found = (re.search(r"\(os error (\d+)\)", str(e))
                 if type(e).__name__ == "SafetensorError" else None)
        if found is None:
            return None
        code = int(found.group(1))
    return OSError(code, f"{os.strerror(code)} (writing {what}); the index was not saved "
                         "and the previous version is still current", str(where))


def _check_target(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise IndexFormatError(f"{path}: exists and is not a folder; not replaced")
    top = path / "manifest.json"
    if top.exists() and not top.is_file():
        what = "a folder, not a file" if top.is_dir() else "not a regular file"
        raise IndexFormatError(f"{top}: {what}; the folder is not replaced")
    if path.is_dir() and not (path / "manifest.json").exists():
        foreign = [p.name for p in path.iterdir() if not _is_own(p.name)]
        if foreign:
            raise IndexFormatError(f"{path}: a folder that is not an index (holds "
                                   f"{foreign[0]!r}); not replaced")


def _remove_leftovers(path: Path, keep: Optional[str] = None) -> None:
    """Remove what killed writers left in ``path`` (unfinished builds, pointer
    temporaries) and, when ``keep`` is given, every version but ``keep``.  Called with
    the lock held: no other writer is working in ``path`` then."""
    for p in path.iterdir():
        name = p.name
        if _POINTER_TMP.match(name):
            with contextlib.suppress(OSError):
                p.unlink()
        elif name.startswith(_TMP_PREFIX) or (keep is not None and name != keep
                                              and _VERSION_DIR.match(name)):
            shutil.rmtree(p, ignore_errors=True)


def _clean(path: Path, keep: str) -> None:
    """Remove every version but ``keep``, leftovers of killed writers, version-1 files
    and the leftovers of the version-1 writer (``.DIR.old`` and ``.DIR.<8 random>.tmp``
    beside DIR, matched by exact name: no glob, so ``idx[1]`` never matches ``idx1``).
    Called with the lock held."""
    _remove_leftovers(path, keep)
    with contextlib.suppress(FileNotFoundError):
        (path / "tensors.safetensors").unlink()  # a version-1 folder, now converted
    sibling = re.compile(re.escape(f".{path.name}.") + r"(old|[a-z0-9_]{8}\.tmp)")
    for p in path.parent.iterdir():
        if sibling.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
              "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
              "bool": "BOOL"}


def _verify_written(folder: Path, manifest: bytes, tensors: dict) -> None:
    """The files of a new version hold what was meant: the manifest byte for byte, the
    tensor file every tensor with its dtype and shape (safetensors checks, from the
    header, that the data covers the file exactly; the data is not read)."""
    from safetensors import SafetensorError, safe_open

    if (folder / "manifest.json").read_bytes() != manifest:
        raise IndexFormatError(f"{folder / 'manifest.json'}: reads back differently "
                               "than written; not made current")
    tf = folder / "tensors.safetensors"
    try:
        with safe_open(str(tf), framework="pt") as f:
            names = set(f.keys())
            bad = names ^ set(tensors)
            for name in sorted(names & set(tensors)):
                s, x = f.get_slice(name), tensors[name]
                want = _ST_DTYPES.get(str(x.dtype).replace("torch.", ""))
                if list(s.get_shape()) != list(x.shape) or (want and s.get_dtype() != want):
                    bad.add(name)
    except (SafetensorError, OSError) as e:
        raise IndexFormatError(f"{tf}: reads back differently than written ("
                               f"{' '.join(str(e).split())[:200]}); not made current") \
            from None
    if bad:
        raise IndexFormatError(f"{tf}: tensor {sorted(bad)[0]!r} reads back differently "
                               "than written; not made current")


def write_index_dir(path: Path, tensors: dict, manifest: bytes, *,
                    expect: Optional[str] = None,
                    lock_timeout: float = LOCK_TIMEOUT) -> str:
    """Write ``tensors`` (safetensors) and ``manifest`` (UTF-8 JSON text) as a new
    version of the index folder ``path``, make it the current one atomically and return
    its name.

    Args:
        expect: the version the folder must still be at (the one the index was loaded
            from); None: replace whatever is there.  A folder without an index is
            always written.
        lock_timeout: seconds to wait for another writer's lock (a finite number from
            0).

    Raises:
        IndexFormatError: ``path`` is a file, a folder that is not an index, its lock
            file is a symbolic link, a hard link or a folder, or the manifest is larger
            than :data:`MAX_MANIFEST_BYTES`.
        IndexConflictError: the folder is at another version than ``expect``.
        IndexLockError: the lock stayed held for ``lock_timeout`` seconds.
        OSError: writing failed (a full disk, say): the error names ``path`` and keeps
            its number; nothing of the new version is left and the previous one is
            still current.
        TypeError, ValueError: ``lock_timeout`` is not a finite number from 0.
    """
    import safetensors.torch

    lock_timeout = check_lock_timeout(lock_timeout)
    path = Path(path)
    if len(manifest) > MAX_MANIFEST_BYTES:
        raise IndexFormatError(f"{path}: the manifest would take {len(manifest)} bytes, more "
                               f"than the {MAX_MANIFEST_BYTES} a reader accepts; not saved")
    _check_target(path)
    if folder_version(path) == DURABLE_VERSION:
        raise IndexFormatError(f"{path}: a durable memory's folder (format "
                               f"{DURABLE_VERSION}): its writer checkpoints it "
                               "(MemoryIndex.open, checkpoint()); save a copy elsewhere")
    path.mkdir(parents=True, exist_ok=True)
    mode = 0o666 & ~_umask()
    with _locked(path, lock_timeout):
        _remove_leftovers(path)
        if expect is not None:
            now = current_version(path)
            if now is not None and now != expect:
                raise IndexConflictError(
                    f"{path}: another writer saved version {now} here since this index was "
                    f"loaded from or saved to version {expect}; nothing was written (load "
                    "the folder again and redo the changes, or save with force=True to "
                    "replace it)")
        name = f"v-{uuid.uuid4().hex}"
        tmp = path / f"{_TMP_PREFIX}{name}"
        what = "the new version's files"
        try:
            tmp.mkdir(mode=0o777 & ~_umask())
            what = "tensors.safetensors"
            safetensors.torch.save_file(tensors, str(tmp / "tensors.safetensors"),
                                        metadata={"format": FORMAT_NAME})
            what = "manifest.json"
            (tmp / "manifest.json").write_bytes(manifest)
            what = "the new version's files"
            for p in tmp.iterdir():  # one mode for every file of the index (the umask)
                os.chmod(p, mode)
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            fsync_dir(tmp)
            _verify_written(tmp, manifest, tensors)
            os.replace(tmp, path / name)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            named = _write_failed(e, path, what)
            if named is not None:
                raise named from None
            raise
        fsync_dir(path)
        try:
            with atomic_write(path / "manifest.json", "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT_NAME, "version": FORMAT_VERSION, "current": name,
                           "manifest_crc32": zlib.crc32(manifest)}, f, indent=1)
        except BaseException as e:
            # the pointer still names the previous version: the new one goes (unless an
            # interruption came after the rename)
            with contextlib.suppress(Exception):
                if current_version(path) != name:
                    shutil.rmtree(path / name, ignore_errors=True)
            named = _write_failed(e, path, "the pointer manifest.json")
            if named is not None:
                raise named from None
            raise
        fsync_dir(path)
        _clean(path, keep=name)
    return name


# ------------------------------------------------------------------------- reading
def _read_json(mf: Path, cap: int):
    """The JSON value of ``mf`` (at most ``cap`` bytes, strict numbers) and its bytes."""
    fd = os.open(mf, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # checked before fdopen, whose error names the fd
            raise IndexFormatError(f"{mf}: a folder, not a file" if stat.S_ISDIR(st.st_mode)
                                   else f"{mf}: not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    with f:
        raw = f.read(cap + 1) if st.st_size <= cap else b""
    if st.st_size > cap or len(raw) > cap:
        raise IndexFormatError(f"{mf}: {max(st.st_size, len(raw))} bytes, more than the "
                               f"{cap} a manifest may hold; not read")
    try:
        text = raw.decode("utf-8")
        m = json_loads(text)
    except UnicodeDecodeError as e:
        raise IndexFormatError(f"{mf}: not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{mf}: invalid JSON ({e.msg} at line {e.lineno})") from None
    except JSONLimitError as e:
        raise IndexFormatError(f"{mf}: invalid JSON ({e})") from None
    except RecursionError:
        raise IndexFormatError(f"{mf}: JSON nested too deeply") from None
    bad = find_surrogate(m) if may_hold_surrogate(text) else None
    if bad is not None:
        raise IndexFormatError(f"{mf}: field {bad!r}: a lone UTF-16 surrogate escape (not "
                               "valid Unicode text)")
    return m, raw


def _check_header(mf: Path, m) -> None:
    if not isinstance(m, dict):
        raise IndexFormatError(f"{mf}: expected a JSON object, got {type(m).__name__}")
    if m.get("format") != FORMAT_NAME:
        fmt = json.dumps(m.get("format"))[:80]
        raise IndexFormatError(f"{mf}: not a memgas_gpu index (format {fmt})")
    version = m.get("version")
    if type(version) is not int:
        raise IndexFormatError(f"{mf}: field 'version': expected an integer, got "
                               f"{json.dumps(version)[:80]}")
    if version > NEWEST_VERSION:
        raise IndexFormatError(
            f"{mf}: index format version {version} is newer than this memgas_gpu reads "
            f"({NEWEST_VERSION}); upgrade memgas_gpu (pip install -U memgas_gpu)")
    if version < 1:
        raise IndexFormatError(f"{mf}: field 'version': {version} is not a format version")


def _load_tensors(tf: Path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not tf.is_file():  # a FIFO or a device would block or stream forever
        raise FileNotFoundError(tf) if not tf.exists() else \
            IndexFormatError(f"{tf}: not a regular file")
    try:
        return load_file(str(tf))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        if isinstance(e, FileNotFoundError) or not tf.exists():
            raise FileNotFoundError(tf) from None  # removed by a writer: the caller retries
        msg = " ".join(str(e).split())[:200]
        raise IndexFormatError(f"{tf}: unreadable safetensors file ({msg})") from None


def folder_version(path) -> Optional[int]:
    """The format version of the index folder ``path`` (1, 2, or 3 for a durable memory),
    or None when it holds no index.

    Raises:
        IndexFormatError: the pointer is unreadable or of a newer format.
    """
    top = Path(path) / "manifest.json"
    try:
        m, _ = _read_json(top, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        return None
    _check_header(top, m)
    return m["version"]


def read_pointer(path) -> dict:
    """The folder's pointer manifest (its header checked)."""
    top = Path(path) / "manifest.json"
    m, _ = _read_json(top, MAX_MANIFEST_BYTES)
    _check_header(top, m)
    return m


def _pointer(top: Path) -> tuple[dict, bool]:
    """The top manifest of a folder and whether it is a version-2 pointer."""
    m, _ = _read_json(top, MAX_MANIFEST_BYTES)
    _check_header(top, m)
    if m["version"] == DURABLE_VERSION:
        raise IndexFormatError(f"{top}: a durable memory's folder (format "
                               f"{DURABLE_VERSION}): read it with MemoryIndex.load or "
                               "MemoryIndex.open")
    if "current" not in m:
        return m, False
    name = m["current"]
    if not isinstance(name, str) or not _VERSION_DIR.match(name):
        raise IndexFormatError(f"{top}: field 'current': expected 'v-' and 32 hex "
                               f"digits, got {json.dumps(name)[:80]}")
    crc = m.get("manifest_crc32")
    if crc is not None and (type(crc) is not int or not 0 <= crc < 1 << 32):
        raise IndexFormatError(f"{top}: field 'manifest_crc32': expected an integer from 0 "
                               f"to 2**32 - 1, got {json.dumps(crc)[:80]}")
    return m, True


def _resolve(path: Path) -> tuple:
    """(manifest file, manifest, tensors, version name, manifest changed) of the
    current version."""
    top = path / "manifest.json"
    m, is_pointer = _pointer(top)
    if not is_pointer:
        return top, m, _load_tensors(path / "tensors.safetensors"), LEGACY_VERSION, False
    name = m["current"]
    mf = path / name / "manifest.json"
    try:
        full, raw = _read_json(mf, MAX_MANIFEST_BYTES)
    except NotADirectoryError:
        raise IndexFormatError(f"{path / name}: the current version named by {top} is not "
                               "a folder") from None
    _check_header(mf, full)
    if "current" in full:
        raise IndexFormatError(f"{mf}: a pointer inside a version folder")
    crc = m.get("manifest_crc32")
    changed = crc is not None and zlib.crc32(raw) != crc
    return mf, full, _load_tensors(path / name / "tensors.safetensors"), name, changed


def current_version(path) -> Optional[str]:
    """The version the index folder ``path`` is at now (``"v-<32 hex>"``, or
    :data:`LEGACY_VERSION` for a version-1 folder), or None when it holds no index.

    Raises:
        IndexFormatError: the pointer is unreadable.
    """
    top = Path(path) / "manifest.json"
    try:
        m, is_pointer = _pointer(top)
    except FileNotFoundError:
        return None
    return m["current"] if is_pointer else LEGACY_VERSION


def read_index_dir(path: Path) -> StoredIndex:
    """The current version of ``path`` (version 1 or 2), its header checked; the
    contents are left to :mod:`.checks`.

    Raises:
        IndexFormatError: no index, an unreadable, incomplete, changed or newer one (one
            line naming the file).
    """
    path = Path(path)
    if not (path / "manifest.json").exists():
        raise IndexFormatError(f"{path}: not an index folder (no manifest.json)")
    for attempt in range(_READ_TRIES):
        try:
            mf, m, t, name, changed = _resolve(path)
            break
        except FileNotFoundError as e:
            # a writer replaced the version we were reading: follow the new pointer
            missing = e.filename if isinstance(e.filename, str) else str(e.args[0])
            if attempt == _READ_TRIES - 1:
                raise IndexFormatError(f"{missing}: missing: the index folder is "
                                       "incomplete") from None
    return StoredIndex(mf, m, t, FolderVersion(os.path.realpath(path), name), changed)


def check_target(path) -> None:
    """Raise :class:`IndexFormatError` if :func:`write_index_dir` would refuse ``path``
    (a file, or a folder that is not an index): callers check before a long build."""
    _check_target(Path(path))
