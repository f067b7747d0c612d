"""The one place where a memory's folder changes on disk: files created, appended to,
replaced and removed, each made durable in the order the commit protocol needs.

Every function here says what is durable when it returns:

* :func:`make_dirs` — the folder exists, and so does its entry in its parent (the
  parent is fsync'd after each level it creates);
* :func:`write_new` — a new file holds exactly ``data``, fsync'd (its directory entry
  is durable only after :func:`sync_dir` of its folder);
* :func:`replace` — ``path`` holds ``data``: written to a temporary sibling, fsync'd,
  renamed over ``path``, and the folder fsync'd;
* :func:`remove` — the files are gone and the folders that held them fsync'd;
* :func:`append_at` — ``data`` written at an offset of an open file (not yet fsync'd:
  the caller fsyncs once for a whole group of appends).

A failure of the operating system (a full disk above all) is raised as an ``OSError``
that keeps its number and names the file and what was being written
(:func:`disk_error`); a function that fails leaves no file of its own behind.
Standard library only.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from pathlib import Path
from typing import Iterable, Optional, Union

__all__ = ["make_dirs", "write_new", "replace", "remove", "append_at", "sync_dir",
           "sync_file", "disk_error", "read_file", "TMP_SUFFIX", "is_temporary",
           "file_mode"]

PathLike = Union[str, os.PathLike]
#: what :func:`replace` names its temporary file: ``.<name>.<8 characters>.tmp``
TMP_SUFFIX = ".tmp"
_TMP = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


def file_mode() -> int:
    """The mode of every file a memory writes: ``0666`` minus the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary file :func:`replace` makes (a crash may leave
    one; the folder's writer removes it)."""
    return bool(_TMP.match(name))


def disk_error(e: BaseException, path: PathLike, what: str) -> Optional[OSError]:
    """The ``OSError`` to raise for ``e`` (an ``OSError``, or safetensors' error carrying
    an ``os error N``): it keeps the error number (so ``OSError``'s subclass), names
    ``path`` and says what was being written; None for any other error."""
    if isinstance(e, OSError) and e.errno is not None:
        code = e.errno
    else:
        found = (re.search(r"\(os error (\d+)\)", str(e))
                 if type(e).__name__ == "SafetensorError" else None)
        if found is None:
            return None
        code = int(found.group(1))
    hint = "; free some space" if code in (errno.ENOSPC, errno.EDQUOT) else ""
    return OSError(code, f"{os.strerror(code)} (writing {what}){hint}", str(path))


def sync_dir(path: PathLike) -> None:
    """fsync the folder ``path``: the entries created, renamed or removed in it are
    durable once this returns.

    Raises:
        OSError: the folder cannot be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file(path: PathLike) -> None:
    """fsync an existing file by name (what a killed writer wrote but never synced is
    durable once this returns)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: PathLike) -> list[Path]:
    """Create the folder ``path`` and its missing parents, each level's entry made
    durable in its parent; returns the folders created (outermost first)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    made = []
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o777)
        except FileExistsError:
            continue
        made.append(d)
        sync_dir(d.parent)
    return made


def _write_all(fd: int, data) -> None:
    view, done = memoryview(data), 0
    while done < len(view):
        done += os.write(fd, view[done:])


def write_new(path: PathLike, data, what: Optional[str] = None) -> None:
    """Create the file ``path`` (it must not exist), write ``data`` and fsync it.  On any
    failure the file is removed and the error names it (:func:`disk_error`)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, file_mode())
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException as e:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        named = disk_error(e, path, what or path.name)
        if named is not None:
            raise named from None
        raise
    os.close(fd)


def replace(path: PathLike, data, what: Optional[str] = None) -> None:
    """Make ``path`` hold ``data`` atomically and durably: a temporary sibling written
    and fsync'd, renamed over ``path``, then the folder fsync'd.  A reader sees the old
    or the new contents, never a mixture; a failure leaves the old contents and no
    temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    write_new(tmp, data, what or path.name)
    try:
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        named = disk_error(e, path, what or path.name)
        if named is not None:
            raise named from None
        raise
    sync_dir(path.parent)


def remove(paths: Iterable[PathLike]) -> int:
    """Remove the files ``paths`` (missing ones are skipped) and fsync each folder that
    held one; returns how many were removed."""
    folders, n = set(), 0
    for p in paths:
        p = Path(p)
        try:
            os.unlink(p)
        except FileNotFoundError:
            continue
        folders.add(p.parent)
        n += 1
    for d in sorted(folders):
        sync_dir(d)
    return n


def append_at(fd: int, data, offset: int, path: PathLike, what: str) -> None:
    """Write ``data`` at ``offset`` of the open file ``fd`` (not fsync'd).

    Raises:
        OSError: the write failed (:func:`disk_error` names ``path``); the caller
            truncates back to ``offset``.
    """
    view, done = memoryview(data), 0
    try:
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)
    except BaseException as e:
        named = disk_error(e, path, what)
        if named is not None:
            raise named from None
        raise


def read_file(path: PathLike, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refusing (``ValueError``) one larger than
    ``limit`` or one that is not a regular file (a FIFO would block) before reading."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("a folder, not a file" if stat.S_ISDIR(st.st_mode)
                             else "not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{st.st_size} bytes, more than the {limit} accepted")
        chunks, left = [], st.st_size + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 24))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > limit:
            raise ValueError(f"more than the {limit} bytes accepted")
        return data
    finally:
        os.close(fd)
