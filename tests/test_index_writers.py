"""Writers of one memory folder that go through a second folder, share one index across
threads, or meet a hostile lock file, a full disk or an inherited lock: nothing saved is
lost without an error, and every refusal is one line naming the file."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import _format4 as f4
from _hostile import ROOT, build_small_index, one_line_error, run_cli, version_dir
from _legacy_writers import write_v2
from memgas_gpu.data.model import Session
from memgas_gpu.retrieve import (IndexConflictError, IndexFormatError, IndexLockError,
                                 MemoryIndex)
from memgas_gpu.storage import folder as storage
from memgas_gpu.storage.folder import current_version, save_index
from memgas_gpu.storage.lock import FolderLock

load_index = MemoryIndex.load


@pytest.fixture(scope="module")
def small(tmp_path_factory, locomo_list_path):
    folder = tmp_path_factory.mktemp("index-writers")
    idx = build_small_index(locomo_list_path, folder)
    return idx, save_index(idx, folder / "idx")


def _copy(path: Path, dst: Path) -> Path:
    shutil.copytree(path, dst)
    return dst


def _session(sid: str) -> Session:
    return Session(id=sid, date="2023/06/02 10:00", turns=[f"[B]: {sid} went hiking."])


def _sessions(path: Path) -> list:
    return load_index(path).conversations[0].session_ids


def _data(path: Path) -> dict:
    """Every file of the folder but its lock file (which names the last writer)."""
    return {k: v for k, v in f4.folder_bytes(path).items() if k != ".lock"}


# ---- a save through another folder does not forget the first one ---------------------
def test_a_save_elsewhere_does_not_hide_another_writers_save(tmp_path, small):
    """P1 and P2 load F; P2 saves X to F; P1 saves a backup to B, then Y to F: refused
    (F was changed since P1 loaded it), X kept.  Two loads in one process are two
    independent writers here."""
    _, path = small
    f, b = _copy(path, tmp_path / "F"), tmp_path / "B"
    p1, p2 = load_index(f), load_index(f)
    p2.add_session("conv-30", _session("X"))
    save_index(p2, f)
    save_index(p1, b)  # a backup: another folder, written as asked
    assert p1.folder_version.folder == os.path.realpath(b)  # the last folder, as before
    assert p1.folder_versions == {os.path.realpath(f): load_index(path).folder_version.version,
                                  os.path.realpath(b): current_version(b)}
    p1.add_session("conv-30", _session("Y"))
    with pytest.raises(IndexConflictError, match="another writer saved version") as e:
        save_index(p1, f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)
    assert _sessions(f)[-1] == "X" and "Y" not in _sessions(f)
    # the backup folder is still checked too: another writer there is not overwritten
    p3 = load_index(b)
    p3.add_session("conv-30", _session("Z"))
    save_index(p3, b)
    with pytest.raises(IndexConflictError):
        save_index(p1, b)
    assert _sessions(b)[-1] == "Z"
    save_index(p1, f, force=True)  # force still replaces whatever is there
    assert _sessions(f)[-1] == "Y" and "X" not in _sessions(f)
    save_index(p1, f)  # its own last save is what it expects
    assert p1.folder_versions[os.path.realpath(f)] == current_version(f)


def test_the_folder_versions_do_not_travel_between_copies(tmp_path, small):
    """A copy (pickle, as for a Ray task) carries the versions it knew; a save of one
    does not change what the other expects."""
    import pickle

    _, path = small
    f = _copy(path, tmp_path / "F")
    a = load_index(f)
    b = pickle.loads(pickle.dumps(a))
    assert b.folder_versions == a.folder_versions
    save_index(a, f)
    with pytest.raises(IndexConflictError):
        save_index(b, f)


# ---- saves of one index from several threads ------------------------------------------
def test_a_save_that_starts_after_another_returned_writes_a_state_as_new(tmp_path, small,
                                                                        monkeypatch):
    """Thread A's save is slowed inside its checks; meanwhile a session is added and
    thread B saves.  B's save returned, so the folder must hold B's session at the end:
    A's older snapshot must never become current after it."""
    _, path = small
    f = _copy(path, tmp_path / "F")
    idx = load_index(f)
    a_checking, b_returned = threading.Event(), threading.Event()
    real = storage.check_parts
    first = []

    def slow_check(*args, **kw):
        if not first:  # thread A: wait (at most 2 s) for B's save to return
            first.append(threading.current_thread().name)
            a_checking.set()
            b_returned.wait(2.0)
        return real(*args, **kw)

    monkeypatch.setattr(storage, "check_parts", slow_check)
    errors = []

    def save(then=None):
        try:
            save_index(idx, f)
        except Exception as e:  # reported below
            errors.append(e)
        if then is not None:
            then.set()

    a = threading.Thread(target=save, name="A")
    a.start()
    assert a_checking.wait(60)
    idx.add_session("conv-30", _session("B-session"))
    b = threading.Thread(target=save, args=(b_returned,), name="B")
    b.start()
    a.join(120), b.join(120)
    assert not errors, errors
    assert first == ["A"]
    assert _sessions(f)[-1] == "B-session"
    assert idx.folder_version.version == current_version(f)


def test_threads_saving_one_index_never_conflict_and_lose_nothing(tmp_path, small):
    """Each thread adds its own sessions and saves after each: every save succeeds
    (a thread's save never conflicts with another thread of the same index) and the
    folder ends with every session (the last save started after every add)."""
    _, path = small
    f = _copy(path, tmp_path / "F")
    idx = load_index(f)
    errors, added = [], []
    go = threading.Barrier(6)

    def work(t):
        go.wait()
        for i in range(3):
            sid = f"t{t}-{i}"
            try:
                idx.add_session("conv-30", _session(sid))
                added.append(sid)
                save_index(idx, f)
            except Exception as e:
                errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, f"{len(errors)} of 18 saves failed: {errors[0]!r}"
    assert len(added) == 18
    assert set(added) <= set(_sessions(f))
    assert idx.folder_version.version == current_version(f)


def test_the_save_lock_is_not_pickled(small):
    import pickle

    idx, _ = small
    state = idx.__getstate__()
    assert "_save_lock" not in state and "_write_lock" not in state
    copy = pickle.loads(pickle.dumps(idx))
    assert copy._save_lock is not idx._save_lock
    with copy._save_lock:  # a working lock of its own
        assert not idx._save_lock.locked()


# ---- the lock file ---------------------------------------------------------------------
def test_a_hard_linked_lock_file_is_refused_and_its_other_name_untouched(tmp_path, small):
    idx, path = small
    f = _copy(path, tmp_path / "F")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (f / ".lock").unlink()
    os.link(victim, f / ".lock")
    before = f4.folder_bytes(f)
    for write in (lambda: save_index(idx, f, force=True), lambda: MemoryIndex.open(f)):
        with pytest.raises(IndexLockError) as e:
            write()
        assert str(e.value).startswith(f"{f / '.lock'}: has 2 hard links"), str(e.value)
        assert "\n" not in str(e.value)
        assert victim.read_text() == "precious\n" and f4.folder_bytes(f) == before
    load_index(f)
    (f / ".lock").unlink()
    save_index(idx, f, force=True)  # a lock file of its own again: saved


def test_a_lock_file_that_is_a_folder_is_one_line(tmp_path, small):
    idx, path = small
    f = _copy(path, tmp_path / "F")
    (f / ".lock").unlink()
    (f / ".lock").mkdir()
    with pytest.raises(IndexLockError) as e:
        save_index(idx, f, force=True)
    assert str(e.value) == f"{f / '.lock'}: a folder, not a lock file (remove it)"
    with pytest.raises(IndexLockError) as e:
        MemoryIndex.open(f)
    assert str(e.value).startswith(f"{f / '.lock'}: a folder, not a lock file (remove it)")


@pytest.mark.parametrize("value, error", [
    (float("nan"), ValueError), (float("inf"), ValueError), (-1, ValueError),
    (True, TypeError), ("5", TypeError), (None, TypeError)])
def test_a_bad_lock_timeout_is_refused_before_anything(tmp_path, small, value, error):
    """NaN waited forever while another writer held the lock."""
    idx, path = small
    f = _copy(path, tmp_path / "F")
    before = f4.folder_bytes(f)
    with pytest.raises(error, match="lock_timeout: expected a finite number of seconds"):
        save_index(idx, f, force=True, lock_timeout=value)
    with pytest.raises(error, match="lock_timeout"):
        FolderLock(f, value)
    assert f4.folder_bytes(f) == before
    save_index(idx, f, force=True, lock_timeout=0)  # 0: try once, fine when free


_INHERITS_THE_LOCK = """
import os, subprocess, sys
import memgas_gpu.storage.folder as folder
from memgas_gpu.retrieve import MemoryIndex
idx = MemoryIndex.load(sys.argv[1])
real = folder.commit_folder
def commit_folder(*a, **k):
    lock = [int(fd) for fd in os.listdir("/proc/self/fd")
            if os.path.realpath(f"/proc/self/fd/{fd}").endswith("/.lock")]
    # a child that inherits the locked descriptor and outlives this process
    child = subprocess.Popen(["sleep", "60"], pass_fds=lock, start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    print(os.getpid(), child.pid, flush=True)
    return real(*a, **k)
folder.commit_folder = commit_folder
idx.save(sys.argv[1])
"""


def test_an_inherited_lock_names_the_writer_that_released_it(tmp_path, small):
    """The writer saved and exited; a child it started keeps the locked descriptor."""
    _, path = small
    f = _copy(path, tmp_path / "F")
    w = subprocess.run([sys.executable, "-c", _INHERITS_THE_LOCK, str(f)], text=True,
                       capture_output=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))
    assert w.returncode == 0, w.stderr[-2000:]
    writer, child = map(int, w.stdout.split()[:2])
    try:
        with pytest.raises(IndexLockError) as e:
            save_index(load_index(f), f, lock_timeout=0.2)
        msg = str(e.value)
        assert msg.startswith(f"{f / '.lock'}: the folder is being written by a process that "
                              f"inherited it from process {writer} (no longer running)"), msg
        assert "not written its process id" not in msg and "\n" not in msg
    finally:
        os.kill(child, 9)
    deadline = time.monotonic() + 30
    while True:  # the kill releases the lock (once the child is reaped by init)
        try:
            save_index(load_index(f), f, lock_timeout=1)
            break
        except IndexLockError:
            assert time.monotonic() < deadline
    load_index(f)


# ---- unclear errors --------------------------------------------------------------------
def test_a_manifest_that_is_a_folder_or_a_fifo_is_named(tmp_path, small):
    idx, path = small
    f = _copy(path, tmp_path / "F")
    top = f / "manifest.json"
    top.unlink()
    top.mkdir()
    with pytest.raises(IndexFormatError) as e:
        load_index(f)
    assert str(e.value) == f"{top}: a folder, not a file"
    with pytest.raises(IndexFormatError, match=f"{top}: a folder, not a file"):
        save_index(idx, f, force=True)  # not replaced either
    with pytest.raises(IndexFormatError, match=f"{top}: a folder, not a file"):
        MemoryIndex.open(f)
    assert top.is_dir()
    assert one_line_error(run_cli("eval", f)) == f"error: {top}: a folder, not a file"
    top.rmdir()
    os.mkfifo(top)  # would block a reader for ever
    with pytest.raises(IndexFormatError) as e:
        load_index(f)
    assert str(e.value) == f"{top}: not a regular file"
    with pytest.raises(IndexFormatError, match=f"{top}: not a regular file"):
        save_index(idx, f, force=True)
    g = write_v2(idx, tmp_path / "G")  # a version-2 folder's version manifest
    inner = version_dir(g) / "manifest.json"
    inner.unlink()
    inner.mkdir()
    with pytest.raises(IndexFormatError, match=f"^{inner}: a folder, not a file$"):
        load_index(g)


def test_a_current_version_that_is_a_file_is_named(tmp_path, small):
    """A version-2 pointer naming a file where its version folder belongs."""
    idx, _ = small
    f = write_v2(idx, tmp_path / "F")
    v = version_dir(f)
    shutil.rmtree(v)
    v.write_text("not a folder")
    with pytest.raises(IndexFormatError) as e:
        load_index(f)
    assert str(e.value) == (f"{v}: the current version named by {f / 'manifest.json'} is "
                            "not a folder")


# ---- a write that fails ------------------------------------------------------------------
class _Fail:
    """``os.write``/``os.pwrite`` (or ``os.fsync``) raise ``OSError(code)`` — as the
    system does: no file name — at their ``n``-th call on a file of ``folder``."""

    def __init__(self, monkeypatch, folder: Path, ops: tuple, code: int, n: int) -> None:
        self.root = os.path.realpath(folder) + os.sep
        self.code, self.n, self.calls, self.fired = code, n, 0, None
        for op in ops:
            monkeypatch.setattr(os, op, self._wrap(op, getattr(os, op)))

    def _wrap(self, op, real):
        def call(fd, *a, **k):
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if (path + os.sep).startswith(self.root):
                self.calls += 1
                if self.calls == self.n:
                    self.fired = (op, path)
                    raise OSError(self.code, os.strerror(self.code))
            return real(fd, *a, **k)
        return call


def _count(monkeypatch, f: Path, idx, ops) -> int:
    probe = _Fail(monkeypatch, f, ops, errno.EIO, 0)
    save_index(idx, f, force=True)
    monkeypatch.undo()
    return probe.calls


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_a_full_disk_at_any_write_names_the_file_and_changes_nothing(tmp_path, small,
                                                                     monkeypatch, code):
    """A write that fails (a full disk, a file-size limit) at any point of a save: an
    OSError with its errno, naming the file it was writing and what, in one line; the
    previous memory is still current and nothing of the new one is left behind; the
    index can be saved again.  Each blob is written by a write of its own here (a commit
    writes its blobs in runs of up to 1 MiB: a failure between two blobs is a failure
    of a run's write too)."""
    from memgas_gpu.storage import pack

    with pytest.MonkeyPatch.context() as runs:
        runs.setattr(pack, "WRITE_BYTES", 1)
        _full_disk_at_any_write(tmp_path, small, monkeypatch, code)


def _full_disk_at_any_write(tmp_path, small, monkeypatch, code):
    _, path = small
    f = _copy(path, tmp_path / "F")
    idx = load_index(f)
    idx.add_session("conv-30", _session("new"))
    writes = _count(monkeypatch, _copy(path, tmp_path / "probe"), idx, ("write", "pwrite"))
    assert writes >= 9  # the lock, the pack's header and blobs, the pointer, the release
    before, sessions, failed = _data(f), _sessions(f), 0
    for n in range(1, writes + 1):
        fail = _Fail(monkeypatch, f, ("write", "pwrite"), code, n)
        try:
            save_index(idx, f)
        except OSError as e:
            monkeypatch.undo()
            failed += 1
            msg = str(e)
            assert e.errno == code and e.filename and e.filename.startswith(str(f)), (n, msg)
            assert os.strerror(code) in msg and "(writing " in msg and "\n" not in msg, msg
            assert not isinstance(e, IndexFormatError)
            assert _data(f) == before, (n, fail.fired)  # nothing half-written
            assert _sessions(f) == sessions
            continue
        monkeypatch.undo()
        # only the lock's release may fail without failing the save (it was saved)
        assert fail.fired and fail.fired[1].endswith("/.lock"), (n, fail.fired)
        assert _sessions(f)[-1] == "new"
        save_index(load_index(path), f, force=True)  # back to the previous memory
        before = _data(f)
        idx = load_index(f)
        idx.add_session("conv-30", _session("new"))
    assert failed >= writes - 1
    save_index(idx, f)  # no conflict with itself: the failed saves changed nothing
    assert _sessions(f)[-1] == "new"
    assert len(list((f / "data").iterdir())) == 1


def test_a_failed_fsync_leaves_the_old_or_the_new_memory(tmp_path, small, monkeypatch):
    """An fsync that fails (EIO) at any point of a save: the save raises or returns;
    either way the folder then holds the old memory or the new one, complete, and the
    next save leaves one pack."""
    _, path = small
    f = _copy(path, tmp_path / "F")
    idx = load_index(f)
    idx.add_session("conv-30", _session("new"))
    syncs = _count(monkeypatch, _copy(path, tmp_path / "probe"), idx, ("fsync",))
    assert syncs >= 4
    old = _sessions(path)
    for n in range(1, syncs + 1):
        _Fail(monkeypatch, f, ("fsync",), errno.EIO, n)
        try:
            save_index(idx, f, force=True)
        except OSError as e:
            assert e.errno == errno.EIO and "\n" not in str(e)
        finally:
            monkeypatch.undo()
        assert _sessions(f) in (old, old + ["new"]), n
    save_index(idx, f, force=True)
    assert _sessions(f)[-1] == "new" and len(list((f / "data").iterdir())) == 1


def test_a_full_disk_at_the_lock_names_the_lock_file(tmp_path, small, monkeypatch):
    """The holder's process id cannot be written into the lock file: refused naming the
    lock file, nothing written."""
    from memgas_gpu.storage import lock

    _, path = small
    f = _copy(path, tmp_path / "F")
    before = _data(f)
    idx = load_index(f)
    real = lock._stamp

    def stamp(fd, text):
        if not text.endswith("released\n"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, text)

    monkeypatch.setattr(lock, "_stamp", stamp)
    with pytest.raises(OSError) as e:
        save_index(idx, f)
    monkeypatch.undo()
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(f / ".lock")
    assert "(writing the lock file)" in str(e.value) and "\n" not in str(e.value)
    assert _data(f) == before
    save_index(idx, f)
