"""The recording, crash-simulating file layer of tests/_fsrecord.py, on small cases whose
outcome is computed by hand: what is recorded, what a kill and a power loss leave
(a file's bytes as of its last fsync, a folder's entries as of the folder's own last
fsync), and the injected crash and full disk."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from _fsrecord import CRASH_OPS, Event, FSRecorder, SimulatedCrash


def _tree(folder: Path) -> dict:
    """relative path -> bytes (files) or None (folders)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        out[p.relative_to(folder).as_posix()] = p.read_bytes() if p.is_file() else None
    return out


def _write(path, data: bytes, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    (r / "old").write_bytes(b"old bytes")
    (r / "sub").mkdir()
    (r / "sub" / "kept").write_bytes(b"kept")
    return r


def test_events_are_recorded_for_the_root_only_and_the_os_is_restored(root, tmp_path):
    real = {n: getattr(os, n) for n in ("open", "write", "fsync", "replace", "unlink")}
    outside = tmp_path / "outside"
    with FSRecorder(root) as rec:
        assert os.open is not real["open"]
        _write(root / "a", b"12345", sync=True)
        _write(outside, b"not recorded", sync=True)
        os.replace(root / "a", root / "b")
        os.replace(outside, root / "c")  # from outside into the root: recorded
        with open(root / "b", "ab") as f:  # a file object: its fsync is recorded
            f.write(b"678")
            f.flush()
            os.fsync(f.fileno())
        Path(root / "c").unlink()
        (root / "d").mkdir()
        os.rmdir(root / "d")
        _sync_dir(root)
    assert {n: getattr(os, n) for n in real} == real
    assert rec.events == [
        Event("open", "a", "create"), Event("write", "a", 5), Event("fsync", "a", "file"),
        Event("close", "a"), Event("rename", "a", "b"),
        Event("rename", str(outside), "c"), Event("fsync", "b", "file"),
        Event("unlink", "c"), Event("mkdir", "d"), Event("rmdir", "d"),
        Event("open", "."), Event("fsync", ".", "dir"), Event("close", ".")]
    assert rec.find("fsync", "*", "dir") == [11]
    assert rec.first("rename", "a") == 4 and rec.last("fsync") == 11
    assert rec.calls(CRASH_OPS) == 7  # 1 write, 3 fsyncs, 2 renames, 1 unlink


def test_shutil_rmtree_is_recorded_through_its_folder_descriptors(root):
    with FSRecorder(root) as rec:
        shutil.rmtree(root / "sub")
    assert ("unlink", "sub/kept", None) in rec.events
    assert ("rmdir", "sub", None) in rec.events


def test_a_file_written_but_never_fsynced_is_empty_after_a_power_loss(root, tmp_path):
    with FSRecorder(root) as rec:
        _write(root / "new", b"hello")
        _sync_dir(root)  # the entry is durable, its bytes are not
        rec.kill_state(tmp_path / "kill")
        rec.power_loss_state(tmp_path / "power")
    assert _tree(tmp_path / "kill")["new"] == b"hello"
    assert _tree(tmp_path / "power") == {"new": b"", "old": b"old bytes", "sub": None,
                                         "sub/kept": b"kept"}


def test_a_new_file_fsynced_without_its_folder_is_gone_after_a_power_loss(root, tmp_path):
    with FSRecorder(root) as rec:
        _write(root / "new", b"hello", sync=True)
        rec.power_loss_state(tmp_path / "p1")
        _sync_dir(root)
        rec.power_loss_state(tmp_path / "p2")
    assert "new" not in _tree(tmp_path / "p1")
    assert _tree(tmp_path / "p2")["new"] == b"hello"


def test_a_rename_without_a_folder_fsync_leaves_the_old_name(root, tmp_path):
    """The atomic replace: the new file is synced and renamed over ``old``; until the
    folder is synced a power loss gives back ``old`` with its old bytes (and no
    temporary file, whose entry was never durable)."""
    with FSRecorder(root) as rec:
        _write(root / ".old.tmp", b"new bytes", sync=True)
        os.replace(root / ".old.tmp", root / "old")
        rec.power_loss_state(tmp_path / "p1")
        _sync_dir(root)
        rec.power_loss_state(tmp_path / "p2")
    assert _tree(tmp_path / "p1") == {"old": b"old bytes", "sub": None, "sub/kept": b"kept"}
    assert _tree(tmp_path / "p2") == {"old": b"new bytes", "sub": None, "sub/kept": b"kept"}


def test_an_unlink_or_rename_into_another_folder_needs_that_folders_fsync(root, tmp_path):
    with FSRecorder(root) as rec:
        os.unlink(root / "old")
        os.rename(root / "sub" / "kept", root / "moved")
        _sync_dir(root / "sub")  # "kept" is gone from sub; "moved" not yet in root
        rec.power_loss_state(tmp_path / "p1")
        _sync_dir(root)
        rec.power_loss_state(tmp_path / "p2")
    assert _tree(tmp_path / "p1") == {"old": b"old bytes", "sub": None}
    assert _tree(tmp_path / "p2") == {"moved": b"kept", "sub": None}


def test_a_new_folder_needs_its_parents_fsync_and_its_own(root, tmp_path):
    with FSRecorder(root) as rec:
        (root / "d").mkdir()
        _write(root / "d" / "f", b"x", sync=True)
        _sync_dir(root / "d")
        rec.power_loss_state(tmp_path / "p1")  # the parent never synced: no d
        _sync_dir(root)
        rec.power_loss_state(tmp_path / "p2")
        (root / "e").mkdir()
        _write(root / "e" / "f", b"y", sync=True)
        _sync_dir(root)  # e is durable, but empty: e itself was never synced
        rec.power_loss_state(tmp_path / "p3")
    assert "d" not in _tree(tmp_path / "p1")
    assert _tree(tmp_path / "p2")["d/f"] == b"x"
    got = _tree(tmp_path / "p3")
    assert got["e"] is None and "e/f" not in got


def test_bytes_written_after_the_last_fsync_are_lost_or_torn(root, tmp_path):
    with FSRecorder(root) as rec:
        with open(root / "log", "wb") as f:  # writes that bypass os.write
            f.write(b"AAAA")
            f.flush()
            os.fsync(f.fileno())
            f.write(b"BBBBBBBB")
            f.flush()
        _sync_dir(root)
        rec.power_loss_state(tmp_path / "p")
        rec.power_loss_state(tmp_path / "half", tear=0.5)
        rec.power_loss_state(tmp_path / "one", tear=lambda path, old, new: new[:1])
        _write(root / "old", b"shorter")  # not an append: torn or not, the old bytes
        rec.power_loss_state(tmp_path / "t2", tear=0.5)
    assert _tree(tmp_path / "p")["log"] == b"AAAA"
    assert _tree(tmp_path / "half")["log"] == b"AAAABBBB"
    assert _tree(tmp_path / "one")["log"] == b"AAAAB"
    assert _tree(tmp_path / "t2")["old"] == b"old bytes"


def test_a_file_recreated_under_its_name_starts_empty(root, tmp_path):
    """Durable bytes belong to an inode: a new file of the same name (perhaps the same
    inode number, reused) holds nothing durable before its own fsync."""
    with FSRecorder(root) as rec:
        _write(root / "f", b"first", sync=True)
        _sync_dir(root)
        os.unlink(root / "f")
        _write(root / "f", b"second")
        _sync_dir(root)
        rec.power_loss_state(tmp_path / "p")
    assert _tree(tmp_path / "p")["f"] == b""


def test_crash_at_snapshots_both_states_and_raises_past_except_exception(root, tmp_path):
    with FSRecorder(root) as rec:
        rec.crash_at(3, tmp_path / "crash")
        with pytest.raises(SimulatedCrash) as got:
            try:
                _write(root / "a", b"one", sync=True)  # write 1, fsync 2
                _write(root / "b", b"two")  # write 3: the crash, not made
            except Exception:  # noqa: BLE001 - library code must not swallow it
                pytest.fail("SimulatedCrash was caught by except Exception")
        assert got.value.n == 3 and got.value.event == Event("write", "b", None)
        os.unlink(root / "a")  # after the crash: not recorded, not counted
    c = rec.crash
    assert c.n == 3 and c.event.op == "write" and rec.events[-1] == Event("crash", "b",
                                                                          "write")
    assert ("unlink", "a", None) not in rec.events
    assert _tree(c.kill)["a"] == b"one" and _tree(c.kill)["b"] == b""
    assert "a" not in _tree(c.power) and "b" not in _tree(c.power)  # root never synced
    assert _tree(c.power)["old"] == b"old bytes"


def test_crash_points_past_the_end_are_not_reached(root, tmp_path):
    with FSRecorder(root) as rec:
        rec.crash_at(99, tmp_path / "crash", ops=("fsync",))
        _write(root / "a", b"one", sync=True)
    assert rec.crash is None and rec.calls(("fsync",)) == 1


def test_fail_at_raises_enospc_once_and_goes_on(root):
    with FSRecorder(root) as rec:
        rec.fail_at(2)
        _write(root / "a", b"one")
        with pytest.raises(OSError) as got:
            _write(root / "b", b"two")
        assert got.value.errno == errno.ENOSPC
        _write(root / "c", b"three")
        rec.fail_at(1, errno.EIO, ops=("fsync",))
        with pytest.raises(OSError, match="Input/output"):
            _write(root / "d", b"four", sync=True)
    assert (root / "b").read_bytes() == b"" and (root / "c").read_bytes() == b"three"
    assert rec.failures == [Event("fail", "b", "write"), Event("fail", "d", "fsync")]
    assert Event("write", "b", 3) not in rec.events


def test_notes_disarm_leaked_descriptors_and_a_model_only_fsync(root, tmp_path):
    with FSRecorder(root, real_fsync=False) as rec:
        rec.note("here", 1)
        kept = os.open(root / "held", os.O_WRONLY | os.O_CREAT, 0o666)  # never closed
        _write(root / "a", b"one", sync=True)  # modelled, though not really synced
        _sync_dir(root)
        rec.crash_at(1, tmp_path / "crash")
        rec.disarm()
        _write(root / "b", b"two")  # the disarmed crash does not happen
        assert rec.leaked_fds() == [kept]
        os.close(kept)
        assert rec.leaked_fds() == []
        rec.power_loss_state(tmp_path / "p")
    assert rec.events[0] == Event("note", "here", 1) and rec.crash is None
    assert _tree(tmp_path / "p")["a"] == b"one"
    with pytest.raises(ValueError, match="outside the root"):
        FSRecorder(root).crash_at(1, root / "states")
