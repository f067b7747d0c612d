"""The one lock of a folder: one writer at a time, readers never lock.

A writer holds an exclusive ``flock`` on ``FOLDER/.lock`` (a save while it writes, an
opened memory for its whole life, a standalone write-ahead log on its own folder).  The
lock file is opened without following a symbolic link and must be a regular file of one
name (a hard link would let a writer overwrite another file).  The holder writes ``PID
HOST`` into it, so that a writer that gives up can name it, and ``PID HOST released``
when it lets go.  Every refusal is one :class:`IndexLockError`.
"""
from __future__ import annotations

import errno
import math
import numbers
import os
import socket
import stat
import time
from pathlib import Path

from ..errors import MemgasError

__all__ = ["FolderLock", "IndexLockError", "LOCK_NAME", "LOCK_TIMEOUT",
           "check_lock_timeout"]

#: the lock file's name in the folder it guards
LOCK_NAME = ".lock"
#: seconds a save waits for another writer's lock before it stops, naming the holder
LOCK_TIMEOUT = 120.0
#: the word after ``PID HOST`` in a lock file its writer released
_RELEASED = "released"


class IndexLockError(MemgasError):
    """Another writer holds the folder (past the timeout), or the lock file is not a
    lock file; nothing was written."""


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
    descriptor from it, a process it started or forked while it held it)."""
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
                "lock and released it: a process it started or forked while it held the "
                "lock keeps it open (end that process)")
    if host and host != socket.gethostname():
        return f"process {pid} on host {host!r}"
    return f"process {pid} ({_process_state(pid)})"


def _stamp(fd: int, text: str) -> None:
    """Replace the lock file's contents by ``text`` (never empty in between)."""
    data = text.encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


class FolderLock:
    """The writer's lock of ``folder`` (``folder/.lock``), taken by :meth:`acquire` (or
    ``with``) and released by :meth:`release`; idempotent release.

    Args:
        folder: the folder to guard (it must exist).
        timeout: seconds to wait for another holder (0: refuse at once).
        what: how the refusal names the holder's work (``"the memory is open for
            writing"``).
    """

    def __init__(self, folder, timeout: float = 0.0, what: str = "held") -> None:
        self.path = Path(folder) / LOCK_NAME
        self.timeout = check_lock_timeout(timeout)
        self.what = what
        self._fd = -1
        self._me = ""

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> "FolderLock":
        """Take the lock (waiting at most ``timeout`` seconds).

        Raises:
            IndexLockError: another writer holds it (naming it), or ``.lock`` is a
                symbolic link, a hard link, a folder or not a regular file.
        """
        import fcntl

        lock = self.path
        flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(lock, flags, 0o666)  # the umask applies
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise IndexLockError(f"{lock}: a symbolic link; a lock file is never "
                                     "followed (remove it)") from None
            if e.errno == errno.EISDIR:
                raise IndexLockError(f"{lock}: a folder, not a lock file (remove it)") \
                    from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IndexLockError(f"{lock}: not a regular file (remove it)")
            if st.st_nlink > 1:
                raise IndexLockError(f"{lock}: has {st.st_nlink} hard links (another name "
                                     "of the same file, which a writer would overwrite); a "
                                     "lock file must be its own file (remove it)")
            deadline = time.monotonic() + self.timeout
            pause = 0.005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        waited = (f" for more than {self.timeout:g} s" if self.timeout
                                  else "")
                        raise IndexLockError(f"{lock}: {self.what} by {_holder(fd)}{waited}; "
                                             "one writer at a time") from None
                    time.sleep(pause)
                    pause = min(2 * pause, 0.2)
            self._me = f"{os.getpid()} {socket.gethostname()}"
            _stamp(fd, self._me + "\n")
        except BaseException as e:
            os.close(fd)
            if isinstance(e, OSError) and not isinstance(e, IndexLockError):
                from .files import disk_error

                named = disk_error(e, lock, "the lock file")
                if named is not None:
                    raise named from None
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the lock go (idempotent): the file says ``PID HOST released``."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            _stamp(fd, f"{self._me} {_RELEASED}\n")
        except OSError:
            pass
        os.close(fd)  # releases the flock (unless a child inherited the descriptor)

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:  # pragma: no cover - a lock dropped without release
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

