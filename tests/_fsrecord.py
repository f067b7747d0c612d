"""A recording, crash-simulating file layer for tests (in-process, Linux).

``FSRecorder(root)`` is a context manager that replaces the ``os`` functions Python
code uses for files (``open``, ``close``, ``write``, ``pwrite``, ``ftruncate``,
``fsync``, ``fdatasync``, ``replace``, ``rename``, ``unlink``, ``remove``, ``rmdir``,
``mkdir``; :mod:`pathlib`, :mod:`shutil` and :mod:`tempfile` call these) and records,
for paths under ``root`` only, an ordered list of :class:`Event` ``(op, path, detail)``
with ``path`` relative to ``root`` (``"."`` is ``root`` itself)::

    open      path  "create" when the call created the file, else None
    close     path  None
    write     path  bytes written (os.write and os.pwrite)
    ftruncate path  the new length
    fsync     path  "file" or "dir" (os.fsync and os.fdatasync)
    rename    src   dst (os.rename and os.replace; a path outside root is absolute)
    unlink    path  None (os.unlink and os.remove)
    mkdir     path  None
    rmdir     path  None
    fail      path  the op an injected error replaced (:meth:`FSRecorder.fail_at`)
    crash     path  the op a simulated crash stopped (:meth:`FSRecorder.crash_at`)

A descriptor's path is read from ``/proc/self/fd`` at each call, so descriptors opened
by any code count (``open()`` file objects too, whose ``fsync`` goes through
``os.fsync``); writes through Python file objects do not pass through ``os.write`` and
are not recorded, but what they wrote is seen at the next fsync.

What a crash leaves:

* :meth:`~FSRecorder.kill_state`: a copy of the folder as it is now (``kill -9``:
  everything written stays);
* :meth:`~FSRecorder.power_loss_state`: the folder as a power loss now would leave it,
  under a strict model: a file holds what it held at its last fsync (by inode; never
  fsync'd: empty), and a folder holds the entries it held at its own last fsync
  (entries created, renamed or removed since revert).  Folders and files that existed
  when recording started are durable as they were then.  ``tear=`` keeps part of an
  append made since the last fsync (a torn write).

Fault injection: :meth:`~FSRecorder.crash_at` snapshots both states at the n-th
write/fsync/rename/unlink and raises :class:`SimulatedCrash` (a ``BaseException``, so
``except Exception`` in library code does not swallow it; the process's objects are
to be abandoned after it); :meth:`~FSRecorder.fail_at` raises ``OSError(ENOSPC)`` from
the n-th call of the chosen kind instead of making it, then lets the calls go on.

Limits of the model: a file created other than by ``os.open`` (``open()``,
``os.link``) is known from its first fsync or folder listing on, so an inode number
reused by such a file may inherit a removed file's durable bytes; symbolic links are
kept as they are, other special files are left out of the states.
"""
from __future__ import annotations

import errno as _errno
import fnmatch
import itertools
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Optional, Union

__all__ = ["FSRecorder", "Event", "SimulatedCrash", "Crash", "CRASH_OPS"]

#: the calls a crash point is counted on by default
CRASH_OPS = ("write", "fsync", "rename", "unlink")
_PATCHED = ("open", "close", "write", "pwrite", "ftruncate", "fsync", "fdatasync",
            "replace", "rename", "unlink", "remove", "rmdir", "mkdir")


class Event(NamedTuple):
    """One recorded call: its kind, the path relative to the root, and a detail."""

    op: str
    path: str
    detail: Any = None


class SimulatedCrash(BaseException):
    """The process "died" at the n-th counted call (nothing after it is durable)."""

    def __init__(self, n: int, event: Event) -> None:
        super().__init__(f"simulated crash at call {n}: {event}")
        self.n, self.event = n, event


class Crash(NamedTuple):
    """Where a :meth:`FSRecorder.crash_at` crash happened and what it left."""

    n: int
    event: Event
    kill: Path
    power: Path
    torn: Optional[Path]
    events_before: int  # how many events were recorded before the crash


class _Schedule:
    def __init__(self, n: int, ops: tuple, kind: str, **kw) -> None:
        if n < 1:
            raise ValueError(f"n: the calls are counted from 1, got {n}")
        self.n, self.ops, self.kind, self.seen, self.kw = n, tuple(ops), kind, 0, kw
        self.fired = False


def _fd_of(fd) -> int:
    return fd if isinstance(fd, int) else fd.fileno()


class FSRecorder:
    """See the module docstring.  One recorder at a time per process."""

    def __init__(self, root: Union[str, os.PathLike], *, real_fsync: bool = True) -> None:
        """``real_fsync=False``: an fsync under the root is recorded and modelled but
        not made (the power-loss state is the model's; a crash-point sweep runs faster
        on a slow disk)."""
        self.root = os.path.realpath(os.fspath(root))
        self.real_fsync = real_fsync
        self.events: list[Event] = []
        self.crash: Optional[Crash] = None
        self.failures: list[Event] = []
        self.counts: dict[str, int] = {}
        self._real = {name: getattr(os, name) for name in _PATCHED}
        self._lock = threading.RLock()
        self._local = threading.local()
        self._active = False
        self._dead = False
        self._schedules: list[_Schedule] = []
        self._gen: dict = {}  # (dev, ino) -> generation of that inode number
        self._next_gen = itertools.count(1)
        self._content: dict = {}  # (dev, ino, gen) -> bytes durable
        self._listing: dict = {}  # (dev, ino, gen) of a folder -> {name: (key, kind, link)}
        self._root_key = None
        self._opened: dict = {}  # fd -> (path, (dev, ino)) opened by os.open under root

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "FSRecorder":
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"{self.root}: the recorded root must be a folder")
        with self._inside():
            self._root_key = self._snapshot_tree()
        for name in _PATCHED:
            setattr(os, name, getattr(self, "_os_" + name))
        self._active = True
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._real.items():
            setattr(os, name, fn)
        self._active = False

    # ------------------------------------------------------------------ schedules
    def crash_at(self, n: int, dest: Union[str, os.PathLike], ops: Iterable[str] = CRASH_OPS,
                 tear: Optional[Union[float, Callable]] = None) -> None:
        """At the ``n``-th call (counted from 1, under the root) of one of ``ops``:
        write the kill state to ``dest/kill`` and the power-loss state to
        ``dest/power`` (and, with ``tear``, a torn power-loss state to ``dest/torn``),
        then raise :class:`SimulatedCrash` instead of making the call.  Later calls
        pass through unrecorded (the process is dead; its objects are abandoned)."""
        dest = Path(dest)
        if str(dest.resolve()).startswith(self.root + os.sep):
            raise ValueError(f"{dest}: the crash states must be written outside the root")
        self._schedules.append(_Schedule(n, ops, "crash", dest=dest, tear=tear))

    def fail_at(self, n: int, errno: int = _errno.ENOSPC,
                ops: Iterable[str] = ("write",)) -> None:
        """Raise ``OSError(errno)`` from the ``n``-th call (under the root) of one of
        ``ops`` instead of making it (``ops=("write", "fsync")``: fsyncs fail too);
        the calls after it go through."""
        self._schedules.append(_Schedule(n, ops, "fail", errno=errno))

    def disarm(self) -> None:
        """Drop the crash and failure schedules not reached yet (recording goes on)."""
        self._schedules = [s for s in self._schedules if s.fired]

    def calls(self, ops: Iterable[str] = CRASH_OPS) -> int:
        """How many calls of ``ops`` under the root were counted so far (a crash point
        ``n`` past this number is never reached)."""
        return sum(self.counts.get(op, 0) for op in ops)

    # ------------------------------------------------------------------ queries
    def note(self, label: str, detail: Any = None) -> None:
        """Put a marker into the events (``("note", label, detail)``): a test hooks a
        function to say where in the calls it ran (a replayed record, say)."""
        if self._active and not self._dead:
            with self._lock:
                self.events.append(Event("note", label, detail))

    def leaked_fds(self) -> list[int]:
        """Descriptors opened with ``os.open`` under the root while recording that no
        ``os.close`` closed and that still name the same file (a writer abandoned by a
        crash, or an error path that forgot one); a file object's descriptor closed by
        the object is told apart by its inode, unless the number was reused for it."""
        out = []
        for fd, (path, key) in sorted(self._opened.items()):
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            if self._fd_path(fd) == path and (st.st_dev, st.st_ino) == key:
                out.append(fd)
        return out

    def mark(self) -> int:
        """The number of events so far (``events[mark:]``: what came after)."""
        return len(self.events)

    def find(self, op: Optional[str] = None, pattern: str = "*", detail: Any = ...,
             start: int = 0, stop: Optional[int] = None) -> list[int]:
        """Indexes of the events of kind ``op`` (None: any) whose path matches the
        ``fnmatch`` pattern (``*`` crosses ``/``) and, if given, whose detail equals
        ``detail``, in ``events[start:stop]``."""
        out = []
        for i in range(start, len(self.events) if stop is None else stop):
            e = self.events[i]
            if (op is None or e.op == op) and fnmatch.fnmatchcase(e.path, pattern) and \
                    (detail is ... or e.detail == detail):
                out.append(i)
        return out

    def first(self, *a, **kw) -> Optional[int]:
        got = self.find(*a, **kw)
        return got[0] if got else None

    def last(self, *a, **kw) -> Optional[int]:
        got = self.find(*a, **kw)
        return got[-1] if got else None

    # ------------------------------------------------------------------ crash states
    def kill_state(self, dest: Union[str, os.PathLike]) -> Path:
        """Copy the root as it is now to ``dest`` (a process killed now)."""
        dest = Path(dest)
        with self._inside():
            shutil.copytree(self.root, dest, symlinks=True,
                            ignore=lambda d, names: [n for n in names if _special(d, n)])
        return dest

    def power_loss_state(self, dest: Union[str, os.PathLike],
                         tear: Optional[Union[float, Callable]] = None) -> Path:
        """Write to ``dest`` what the root would hold after a power loss now (the
        strict model of the module docstring).  ``tear``: for a file whose bytes now
        extend its durable bytes (an append not fsync'd), keep the durable bytes and
        part of the appended ones: a fraction (0.5: half of them) or a function
        ``(path, durable, appended) -> bytes kept``."""
        dest = Path(dest)
        with self._inside(), self._lock:
            current = self._current_inodes() if tear is not None else {}
            os.mkdir(dest)
            self._build(self._root_key, dest, "", tear, current, set())
        return dest

    def _build(self, key, dest: Path, rel: str, tear, current: dict, seen: set) -> None:
        if key in seen:  # a stale listing cannot make a cycle in a real tree; be safe
            return
        seen.add(key)
        for name, (child, kind, link) in sorted(self._listing.get(key, {}).items()):
            path, crel = dest / name, f"{rel}{name}"
            if kind == "dir":
                path.mkdir()
                self._build(child, path, crel + "/", tear, current, seen)
            elif kind == "file":
                data = self._content.get(child, b"")
                now = current.get(child)
                if tear is not None and now is not None and len(now) > len(data) and \
                        now.startswith(data):
                    extra = now[len(data):]
                    data += (tear(crel, data, extra) if callable(tear)
                             else extra[:int(len(extra) * tear)])
                path.write_bytes(data)
            elif kind == "link":
                os.symlink(link, path)

    def _current_inodes(self) -> dict:
        out = {}
        for d, _, files in os.walk(self.root):
            for n in files:
                p = os.path.join(d, n)
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode):
                    key = self._key(st)
                    if key not in out:
                        with open(p, "rb") as f:
                            out[key] = f.read()
        return out

    # ------------------------------------------------------------------ bookkeeping
    def _key(self, st, new: bool = False):
        ino = (st.st_dev, st.st_ino)
        if new or ino not in self._gen:
            self._gen[ino] = next(self._next_gen)
            if new:
                if stat.S_ISDIR(st.st_mode):
                    self._listing[(*ino, self._gen[ino])] = {}
                else:
                    self._content[(*ino, self._gen[ino])] = b""
        return (*ino, self._gen[ino])

    def _entries(self, path: str) -> dict:
        out = {}
        with os.scandir(path) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                kind = ("dir" if stat.S_ISDIR(st.st_mode) else
                        "file" if stat.S_ISREG(st.st_mode) else
                        "link" if stat.S_ISLNK(st.st_mode) else "other")
                link = os.readlink(e.path) if kind == "link" else None
                out[e.name] = (self._key(st), kind, link)
        return out

    def _snapshot_tree(self):
        """The root's folders and files as they are: durable (recording starts)."""
        for d, dirs, files in os.walk(self.root):
            self._listing[self._key(os.lstat(d))] = self._entries(d)
            for n in files:
                p = os.path.join(d, n)
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode):
                    with open(p, "rb") as f:
                        self._content[self._key(st)] = f.read()
        return self._key(os.lstat(self.root))

    def _synced(self, fd: int, path: str) -> str:
        st = os.fstat(fd)
        key = self._key(st)
        if stat.S_ISDIR(st.st_mode):
            if os.path.isdir(path):
                self._listing[key] = self._entries(path)
            return "dir"
        if stat.S_ISREG(st.st_mode):
            with open(f"/proc/self/fd/{fd}", "rb") as f:
                self._content[key] = f.read()
        return "file"

    # ------------------------------------------------------------------ paths
    class _Inside:
        def __init__(self, rec) -> None:
            self.rec = rec

        def __enter__(self):
            self.prev = getattr(self.rec._local, "inside", False)
            self.rec._local.inside = True

        def __exit__(self, *exc):
            self.rec._local.inside = self.prev

    def _inside(self):
        return FSRecorder._Inside(self)

    def _passing(self) -> bool:
        return not self._active or self._dead or getattr(self._local, "inside", False)

    def _abs(self, path, dir_fd=None) -> str:
        p = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(p):
            p = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), p)
        p = os.path.abspath(p)
        head, tail = os.path.split(p)
        return os.path.join(os.path.realpath(head), tail) if tail else os.path.realpath(p)

    def _rel(self, abspath: Optional[str]) -> Optional[str]:
        if abspath is None:
            return None
        if abspath == self.root:
            return "."
        if abspath.startswith(self.root + os.sep):
            return abspath[len(self.root) + 1:]
        return None

    def _fd_path(self, fd: int) -> Optional[str]:
        try:
            p = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        if p.endswith(" (deleted)"):
            p = p[:-len(" (deleted)")]
        return p if p.startswith("/") else None

    # ------------------------------------------------------------------ the hooks
    def _before(self, op: str, rel: str, detail=None) -> None:
        """Count the call, and crash or fail it when a schedule says so."""
        self.counts[op] = self.counts.get(op, 0) + 1
        for s in self._schedules:
            if s.fired or op not in s.ops:
                continue
            s.seen += 1
            if s.seen < s.n:
                continue
            s.fired = True
            if s.kind == "fail":
                ev = Event("fail", rel, op)
                self.events.append(ev)
                self.failures.append(ev)
                code = s.kw["errno"]
                raise OSError(code, os.strerror(code), os.path.join(self.root, rel))
            ev = Event(op, rel, detail)
            n_before = len(self.events)
            self.events.append(Event("crash", rel, op))
            dest, tear = s.kw["dest"], s.kw["tear"]
            dest.mkdir(parents=True, exist_ok=True)
            kill = self.kill_state(dest / "kill")
            power = self.power_loss_state(dest / "power")
            torn = self.power_loss_state(dest / "torn", tear=tear) if tear is not None \
                else None
            self.crash = Crash(s.n, ev, kill, power, torn, n_before)
            self._dead = True
            raise SimulatedCrash(s.n, ev)

    def _record(self, op: str, rel: str, detail=None) -> None:
        self.events.append(Event(op, rel, detail))

    def _fd_call(self, op: str, name: str, fd, *args, detail=None):
        real = self._real[name]
        if self._passing():
            return real(fd, *args)
        n = _fd_of(fd)
        rel = self._rel(self._fd_path(n))
        if rel is None:
            return real(fd, *args)
        with self._lock, self._inside():
            self._before(op, rel, detail)
        if op == "fsync" and not self.real_fsync:
            os.fstat(n)  # a bad descriptor still raises
            out = None
        else:
            out = real(fd, *args)
        with self._lock, self._inside():
            if op == "fsync":
                detail = self._synced(n, os.path.join(self.root, rel))
            elif op == "write":
                detail = out
            self._record(op, rel, detail)
        return out

    def _os_write(self, fd, data):
        return self._fd_call("write", "write", fd, data)

    def _os_pwrite(self, fd, data, offset):
        return self._fd_call("write", "pwrite", fd, data, offset)

    def _os_ftruncate(self, fd, length):
        return self._fd_call("ftruncate", "ftruncate", fd, length, detail=length)

    def _os_fsync(self, fd):
        return self._fd_call("fsync", "fsync", fd)

    def _os_fdatasync(self, fd):
        return self._fd_call("fsync", "fdatasync", fd)

    def _os_close(self, fd):
        real = self._real["close"]
        if self._passing():
            self._opened.pop(fd, None)
            return real(fd)
        rel = self._rel(self._fd_path(fd))
        out = real(fd)
        if rel is not None:
            with self._lock:
                self._opened.pop(fd, None)
                self._record("close", rel)
        return out

    def _os_open(self, path, flags, mode=0o777, *, dir_fd=None):
        real = self._real["open"]
        if self._passing():
            return real(path, flags, mode, dir_fd=dir_fd)
        p = self._abs(path, dir_fd)
        rel = self._rel(p)
        if rel is None:
            return real(path, flags, mode, dir_fd=dir_fd)
        existed = os.path.lexists(p) if flags & os.O_CREAT else True
        with self._lock, self._inside():
            self._before("open", rel)
        fd = real(path, flags, mode, dir_fd=dir_fd)
        with self._lock, self._inside():
            created = not existed and os.path.lexists(p)
            if created:
                self._key(os.fstat(fd), new=True)
            st = os.fstat(fd)
            self._opened[fd] = (self._fd_path(fd), (st.st_dev, st.st_ino))
            self._record("open", rel, "create" if created else None)
        return fd

    def _path_call(self, op: str, name: str, path, *args, dir_fd=None):
        real = self._real[name]
        kw = {} if dir_fd is None else {"dir_fd": dir_fd}
        if self._passing():
            return real(path, *args, **kw)
        p = self._abs(path, dir_fd)
        rel = self._rel(p)
        if rel is None:
            return real(path, *args, **kw)
        with self._lock, self._inside():
            self._before(op, rel)
        out = real(path, *args, **kw)
        with self._lock, self._inside():
            if op == "mkdir":
                self._key(os.lstat(p), new=True)
            self._record(op, rel)
        return out

    def _os_unlink(self, path, *, dir_fd=None):
        return self._path_call("unlink", "unlink", path, dir_fd=dir_fd)

    def _os_remove(self, path, *, dir_fd=None):
        return self._path_call("unlink", "remove", path, dir_fd=dir_fd)

    def _os_rmdir(self, path, *, dir_fd=None):
        return self._path_call("rmdir", "rmdir", path, dir_fd=dir_fd)

    def _os_mkdir(self, path, mode=0o777, *, dir_fd=None):
        return self._path_call("mkdir", "mkdir", path, mode, dir_fd=dir_fd)

    def _rename_call(self, name: str, src, dst, src_dir_fd=None, dst_dir_fd=None):
        real = self._real[name]
        kw = {k: v for k, v in (("src_dir_fd", src_dir_fd), ("dst_dir_fd", dst_dir_fd))
              if v is not None}
        if self._passing():
            return real(src, dst, **kw)
        a, b = self._abs(src, src_dir_fd), self._abs(dst, dst_dir_fd)
        ra, rb = self._rel(a), self._rel(b)
        if ra is None and rb is None:
            return real(src, dst, **kw)
        ra, rb = ra or a, rb or b
        with self._lock, self._inside():
            self._before("rename", ra, rb)
        out = real(src, dst, **kw)
        with self._lock:
            self._record("rename", ra, rb)
        return out

    def _os_rename(self, src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        return self._rename_call("rename", src, dst, src_dir_fd, dst_dir_fd)

    def _os_replace(self, src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        return self._rename_call("replace", src, dst, src_dir_fd, dst_dir_fd)


def _special(folder: str, name: str) -> bool:
    """A socket, FIFO or device: left out of a kill state."""
    try:
        mode = os.lstat(os.path.join(folder, name)).st_mode
    except OSError:
        return True
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))
