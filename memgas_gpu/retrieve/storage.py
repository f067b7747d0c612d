"""The index folder layout (version 2): complete versions behind a pointer, replaced
atomically; see ``docs/index-format.md``.

``DIR/v-<hex>/`` holds one complete index (``manifest.json`` and
``tensors.safetensors``) and ``DIR/manifest.json`` is a small pointer naming the
current one.  A writer builds a new version beside the old one under a lock
(``DIR/.lock``), then replaces the pointer with one ``os.replace``, then removes the
old version and any leftovers of killed writers; a reader follows the pointer and
retries if a writer removed the version it was reading.  So a reader sees the
complete old or the complete new index, never none, and concurrent writers queue.
Folders of version 1 (the full manifest at the top) still load, and are converted
when saved over.

This module knows files, not index contents: :mod:`.persist` builds the tensors and
the manifest, :mod:`.checks` validates what :func:`read_index_dir` returns.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path

from .._io import atomic_write, find_surrogate
from .checks import IndexFormatError

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "write_index_dir", "read_index_dir"]

FORMAT_NAME = "memgas_gpu.index"
#: 2: versioned subfolders behind a pointer manifest; 1: one folder (still read)
FORMAT_VERSION = 2
_VERSION_DIR = re.compile(r"^v-[0-9a-f]{32}$")
_TMP_PREFIX = ".tmp-"
_LOCK = ".lock"
_READ_TRIES = 20
#: names a version-2 folder may hold besides ``v-*`` and ``.tmp-*`` entries
_OWN = {"manifest.json", "tensors.safetensors", _LOCK}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock on ``path/.lock`` (writers queue; readers never lock)."""
    import fcntl

    fd = os.open(path / _LOCK, os.O_RDWR | os.O_CREAT, 0o666)  # the umask applies
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _check_target(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise IndexFormatError(f"{path}: exists and is not a folder; not replaced")
    if path.is_dir() and not (path / "manifest.json").exists():
        foreign = [p.name for p in path.iterdir() if p.name not in _OWN and not
                   _VERSION_DIR.match(p.name) and not p.name.startswith(_TMP_PREFIX)]
        if foreign:
            raise IndexFormatError(f"{path}: a folder that is not an index (holds "
                                   f"{foreign[0]!r}); not replaced")


def _clean(path: Path, keep: str) -> None:
    """Remove every version but ``keep``, unfinished builds, version-1 files and the
    leftovers of the version-1 writer (``.DIR.old``, ``.DIR.*.tmp`` beside DIR).
    Called with the lock held."""
    for p in path.iterdir():
        if p.is_dir() and p.name != keep and (_VERSION_DIR.match(p.name)
                                              or p.name.startswith(_TMP_PREFIX)):
            shutil.rmtree(p, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (path / "tensors.safetensors").unlink()  # a version-1 folder, now converted
    for p in path.parent.glob(f".{path.name}.*"):
        if p.is_dir() and (p.name == f".{path.name}.old" or p.name.endswith(".tmp")):
            shutil.rmtree(p, ignore_errors=True)


def write_index_dir(path: Path, tensors: dict, manifest: dict) -> Path:
    """Write ``tensors`` (safetensors) and ``manifest`` (strict JSON) as a new version
    of the index folder ``path`` and make it the current one atomically.

    Raises:
        IndexFormatError: ``path`` is a file, or a folder that is not an index.
    """
    from safetensors.torch import save_file

    path = Path(path)
    _check_target(path)
    path.mkdir(parents=True, exist_ok=True)
    mode = 0o666 & ~_umask()
    with _locked(path):
        for p in path.iterdir():  # unfinished builds of killed writers
            if p.name.startswith(_TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
        name = f"v-{uuid.uuid4().hex}"
        tmp = path / f"{_TMP_PREFIX}{name}"
        tmp.mkdir(mode=0o777 & ~_umask())
        try:
            save_file({k: v.contiguous().cpu() for k, v in tensors.items()},
                      str(tmp / "tensors.safetensors"), metadata={"format": FORMAT_NAME})
            with open(tmp / "manifest.json", "w", encoding="utf-8") as f:
                json.dump(manifest, f, ensure_ascii=False, indent=1, allow_nan=False)
            for p in tmp.iterdir():  # one mode for every file of the index (the umask)
                os.chmod(p, mode)
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            _fsync_dir(tmp)
            os.replace(tmp, path / name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fsync_dir(path)
        with atomic_write(path / "manifest.json", "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT_NAME, "version": FORMAT_VERSION, "current": name},
                      f, indent=1)
        _fsync_dir(path)
        _clean(path, keep=name)
    return path


def _read_json(mf: Path):
    if not mf.is_file():
        raise FileNotFoundError(mf) if not mf.exists() else \
            IndexFormatError(f"{mf}: not a regular file")
    try:
        m = json.loads(mf.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise IndexFormatError(f"{mf}: not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{mf}: invalid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise IndexFormatError(f"{mf}: JSON nested too deeply") from None
    bad = find_surrogate(m)
    if bad is not None:
        raise IndexFormatError(f"{mf}: field {bad!r}: a lone UTF-16 surrogate escape (not "
                               "valid Unicode text)")
    return m


def _check_header(mf: Path, m) -> None:
    if not isinstance(m, dict):
        raise IndexFormatError(f"{mf}: expected a JSON object, got {type(m).__name__}")
    if m.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{mf}: not a memgas_gpu index (format {m.get('format')!r})")
    version = m.get("version")
    if type(version) is not int:
        raise IndexFormatError(f"{mf}: field 'version': expected an integer, got "
                               f"{json.dumps(version)}")
    if version > FORMAT_VERSION:
        raise IndexFormatError(
            f"{mf}: index format version {version} is newer than this memgas_gpu reads "
            f"({FORMAT_VERSION}); upgrade memgas_gpu (pip install -U memgas_gpu)")
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


def _resolve(path: Path):
    """(manifest file, manifest, tensors) of the current version."""
    top = path / "manifest.json"
    m = _read_json(top)
    _check_header(top, m)
    if "current" in m:
        name = m["current"]
        if not isinstance(name, str) or not _VERSION_DIR.match(name):
            raise IndexFormatError(f"{top}: field 'current': expected 'v-' and 32 hex "
                                   f"digits, got {json.dumps(name)[:80]}")
        folder = path / name
        mf = folder / "manifest.json"
        m = _read_json(mf)
        _check_header(mf, m)
        if "current" in m:
            raise IndexFormatError(f"{mf}: a pointer inside a version folder")
    else:
        folder, mf = path, top
    return mf, m, _load_tensors(folder / "tensors.safetensors")


def read_index_dir(path: Path) -> tuple[Path, dict, dict]:
    """``(manifest file, manifest, tensors)`` of the current version of ``path``
    (version 1 or 2), its header checked; the contents are left to :mod:`.checks`.

    Raises:
        IndexFormatError: no index, an unreadable, incomplete or newer one (one line
            naming the file).
    """
    path = Path(path)
    if not (path / "manifest.json").exists():
        raise IndexFormatError(f"{path}: not an index folder (no manifest.json)")
    for attempt in range(_READ_TRIES):
        try:
            mf, m, t = _resolve(path)
            break
        except FileNotFoundError as e:
            # a writer replaced the version we were reading: follow the new pointer
            missing = e.filename if isinstance(e.filename, str) else str(e.args[0])
            if attempt == _READ_TRIES - 1:
                raise IndexFormatError(f"{missing}: missing: the index folder is "
                                       "incomplete") from None
    return mf, m, t
