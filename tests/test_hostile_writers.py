"""Writers of an index folder that crash, stop, race or are handed a bad index or a bad
folder: nothing acknowledged is lost, and every refusal is one line (round 3 of the
hostile-input issue: items 1, 3, 4, 5, 13 and 24, and leftover pointer temporaries)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from memgas_gpu.data.model import Session
from memgas_gpu.errors import MemgasError
from memgas_gpu.storage.persist import IndexFormatError, load_index, save_index

from _hostile import ROOT, build_small_index, version_dir


@pytest.fixture(scope="module")
def small(tmp_path_factory, locomo_list_path):
    folder = tmp_path_factory.mktemp("writers")
    idx = build_small_index(locomo_list_path, folder)
    return idx, save_index(idx, folder / "idx")


def _versions(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith(("v-", ".tmp")))


def _python(code: str, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


# ---- item 1: a save never replaces a loadable index with one that does not load ---------
@pytest.mark.parametrize("damage", ["int_date", "none_id", "nan_embedding", "surrogate"])
def test_a_save_that_would_not_load_changes_nothing(tmp_path, small, damage):
    """An index damaged in memory (what unchecked add_session arguments did) was saved,
    the old version deleted, and the new one did not load."""
    _, path = small
    dst = tmp_path / "idx"
    shutil.copytree(path, dst)
    before = _versions(dst)
    idx = load_index(dst)
    meta = idx.conversations[0]
    if damage == "int_date":
        meta.session_dates[-1] = 30
        want = "field 'conversations[0].session_dates[5]': expected a string, got int"
    elif damage == "none_id":
        meta.session_ids[0] = None
        want = "field 'conversations[0].session_ids[0]': expected a string, got NoneType"
    elif damage == "nan_embedding":
        idx.snapshot().gran[0, 1, 2] = float("nan")
        want = "tensor 'gran': 1 embedding(s) hold NaN"
    else:
        idx.questions[0] = dataclasses.replace(idx.questions[0], text="x\udfff")
        want = "field 'questions[0].text' holds a lone UTF-16 surrogate"
    with pytest.raises(IndexFormatError) as e:
        save_index(idx, dst)
    assert want in str(e.value) and "\n" not in str(e.value)
    assert str(dst) in str(e.value)
    assert _versions(dst) == before  # nothing written, nothing removed
    load_index(dst)


def test_a_tensor_file_that_reads_back_short_is_never_made_current(tmp_path, small,
                                                                    monkeypatch):
    """What was written is read back (the manifest, the tensor header and size) before
    the pointer moves: a silently short write leaves the previous version current."""
    import safetensors.torch

    _, path = small
    dst = tmp_path / "idx"
    shutil.copytree(path, dst)
    before = _versions(dst)
    real = safetensors.torch.save_file

    def short_write(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) - 100)

    monkeypatch.setattr(safetensors.torch, "save_file", short_write)
    with pytest.raises(IndexFormatError, match="reads back differently than written .*not "
                                               "made current"):
        save_index(load_index(dst), dst)
    assert _versions(dst) == before
    load_index(dst)


def _save_changed_under(tmp_path, small, monkeypatch, damage):
    """Copy the small index, then save it with one session more while ``damage`` is
    patched in; returns (folder, error, pointer before, sessions before, entries before)."""
    _, path = small
    dst = tmp_path / "idx"
    shutil.copytree(path, dst)
    pointer = (dst / "manifest.json").read_bytes()
    sessions = load_index(dst).conversations[0].session_ids
    entries = sorted(p.name for p in dst.iterdir())
    idx = load_index(dst)
    idx.add_session("conv-30", _new_session("added"))
    damage()
    with pytest.raises(IndexFormatError) as e:
        save_index(idx, dst)
    monkeypatch.undo()
    return dst, e.value, pointer, sessions, entries


def _assert_previous_kept(dst, err, pointer, sessions, entries, what):
    assert "reads back differently than written" in str(err), err
    assert what in str(err) and "not made current" in str(err) and "\n" not in str(err)
    assert (dst / "manifest.json").read_bytes() == pointer  # the pointer did not move
    again = load_index(dst)
    assert again.conversations[0].session_ids == sessions and "added" not in sessions
    assert sorted(p.name for p in dst.iterdir()) == entries  # no new version, no .tmp-


@pytest.mark.parametrize("fault", ["short", "flipped"])
def test_a_manifest_that_reads_back_differently_is_never_made_current(tmp_path, small,
                                                                      monkeypatch, fault):
    """The new version's manifest.json is written short (its last 10 bytes lost) or with
    one byte flipped (both still 'written' without an error): the save is refused before
    the pointer moves, the previous version stays current and nothing is left."""
    real = Path.write_bytes

    def bad_write(self, data):
        if self.name == "manifest.json" and self.parent.name.startswith(".tmp-"):
            data = bytes(data)
            data = data[:-10] if fault == "short" else \
                data[:20] + bytes([data[20] ^ 0x01]) + data[21:]
        return real(self, data)

    got = _save_changed_under(tmp_path, small, monkeypatch,
                              lambda: monkeypatch.setattr(Path, "write_bytes", bad_write))
    _assert_previous_kept(*got, what="manifest.json")


@pytest.mark.parametrize("fault", ["shape", "dtype"])
def test_a_tensor_header_that_reads_back_differently_is_never_made_current(
        tmp_path, small, monkeypatch, fault):
    """A tensor file that is a valid safetensors file but holds one tensor with another
    shape (one row less) or dtype (float16 for float32) than the index's: refused before
    the pointer moves, the previous version stays current and nothing is left."""
    import safetensors.torch

    real = safetensors.torch.save_file

    def bad_save(tensors, filename, metadata=None):
        name = "gran"
        assert tensors[name].dtype == torch.float32 and tensors[name].shape[0] > 1
        t = tensors[name]
        tensors = {**tensors, name: t[:-1].contiguous() if fault == "shape" else t.half()}
        real(tensors, filename, metadata=metadata)

    got = _save_changed_under(tmp_path, small, monkeypatch,
                              lambda: monkeypatch.setattr(safetensors.torch, "save_file",
                                                          bad_save))
    _assert_previous_kept(*got, what="tensor 'gran'")


# ---- item 3: optimistic concurrency between processes -----------------------------------
_ADD_AND_SAVE = """
import sys
from memgas_gpu.data.model import Session
from memgas_gpu.errors import MemgasError
from memgas_gpu.storage.persist import load_index, save_index
idx = load_index(sys.argv[1])
idx.add_session("conv-30", Session(id=sys.argv[2], date="2023/06/01 10:00",
                                   turns=["[A]: I bought a violin today."]))
save_index(idx, sys.argv[1])
"""


def _new_session(sid: str) -> Session:
    return Session(id=sid, date="2023/06/02 10:00", turns=["[B]: We went hiking."])


def test_a_save_over_a_folder_another_process_changed_is_refused(tmp_path, small):
    _, path = small
    dst = tmp_path / "idx"
    shutil.copytree(path, dst)
    mine = load_index(dst)
    other = _python(_ADD_AND_SAVE, dst, "from-other")
    assert other.wait(timeout=300) == 0, other.stderr.read()[-2000:]
    mine.add_session("conv-30", _new_session("from-me"))
    with pytest.raises(MemgasError, match="another writer saved version") as e:
        save_index(mine, dst)
    assert type(e.value).__name__ == "IndexConflictError"
    assert "\n" not in str(e.value) and str(dst) in str(e.value)
    now = load_index(dst)  # the other process's session was not lost
    assert now.folder_version.version == version_dir(dst).name
    assert now.conversations[0].session_ids[-1] == "from-other"
    # reload and redo: both sessions are kept
    now.add_session("conv-30", _new_session("from-me"))
    save_index(now, dst)
    save_index(now, dst)  # its own last save is the version it expects
    assert load_index(dst).conversations[0].session_ids[-2:] == ["from-other", "from-me"]
    save_index(mine, dst, force=True)  # force: replace whatever is there
    assert load_index(dst).conversations[0].session_ids[-1] == "from-me"
    assert "from-other" not in load_index(dst).conversations[0].session_ids


def test_saving_elsewhere_or_into_an_empty_folder_is_not_a_conflict(tmp_path, small):
    _, path = small
    idx = load_index(path)
    save_index(idx, tmp_path / "copy")  # another folder: replaced as asked
    assert idx.folder_version.folder == os.path.realpath(tmp_path / "copy")
    shutil.rmtree(tmp_path / "copy")
    save_index(idx, tmp_path / "copy")  # nothing there to lose
    load_index(tmp_path / "copy")


# ---- item 4: glob characters in the folder name ------------------------------------------
def test_glob_characters_in_the_name_touch_no_other_folder(tmp_path, small):
    idx, _ = small
    other = tmp_path / ".idx1.abcdefgh.tmp"  # another index's working folder
    other.mkdir()
    (other / "data").write_text("keep")
    mine = tmp_path / ".idx[1A].abcdefgh.tmp"  # what a version-1 writer of idx[1A] left
    mine.mkdir()
    save_index(idx, tmp_path / "idx[1A]")
    save_index(idx, tmp_path / "idx[1A]")
    assert (other / "data").read_text() == "keep"
    assert not mine.exists()
    load_index(tmp_path / "idx[1A]")


# ---- item 5 and the smaller item: pointer temporaries of killed writers ------------------
_KILLED_AT_THE_POINTER = """
import os, signal, sys
from memgas_gpu.storage.persist import load_index, save_index
idx = load_index(sys.argv[1])
real = os.replace
def replace(src, dst, *a, **k):
    if str(dst).endswith("manifest.json") and ".manifest.json." in str(src):
        os.kill(os.getpid(), signal.SIGKILL)  # killed between the temporary and the rename
    return real(src, dst, *a, **k)
os.replace = replace
save_index(idx, sys.argv[2])
"""


def test_a_writer_killed_at_the_pointer_does_not_lock_the_folder_out(tmp_path, small):
    """A writer killed during its first save left .manifest.json.*.tmp and no pointer;
    every later save refused the folder as "not an index"."""
    _, path = small
    for target in (tmp_path / "new", tmp_path / "existing"):
        if target.name == "existing":
            shutil.copytree(path, target)
        w = _python(_KILLED_AT_THE_POINTER, path, target)
        assert w.wait(timeout=300) == -signal.SIGKILL, w.stderr.read()[-2000:]
        stray = [p.name for p in target.iterdir() if p.name.startswith(".manifest.json.")]
        assert len(stray) == 1, list(target.iterdir())
        if target.name == "existing":
            load_index(target)  # the previous version is still the current one
        save_index(load_index(path), target)
        assert not [p for p in target.iterdir() if p.name.startswith(".manifest.json.")]
        assert len(_versions(target)) == 1
        load_index(target)


# ---- item 13: a stopped lock holder ---------------------------------------------------------
_STOPPED_WHILE_SAVING = """
import os, signal, sys
import safetensors.torch
from memgas_gpu.storage.persist import load_index, save_index
idx = load_index(sys.argv[1])
real = safetensors.torch.save_file
def save_file(*a, **k):
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # stopped while it holds the lock
    return real(*a, **k)
safetensors.torch.save_file = save_file
save_index(idx, sys.argv[2])
"""


def _state(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rfind(")") + 2]


def test_a_stopped_lock_holder_is_named_after_the_timeout(tmp_path, small):
    _, path = small
    dst = tmp_path / "idx"
    shutil.copytree(path, dst)
    w = _python(_STOPPED_WHILE_SAVING, path, dst)
    try:
        assert w.stdout.readline().strip() == "holding"
        deadline = time.time() + 60
        while _state(w.pid) != "T" and time.time() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(MemgasError) as e:
            save_index(load_index(path), dst, lock_timeout=1.0)
        waited = time.monotonic() - t0
        msg = str(e.value)
        assert f"{dst / '.lock'}: held by process {w.pid} (python" in msg, msg
        assert "stopped" in msg and "more than 1 s" in msg and "\n" not in msg
        assert waited < 30  # it gave up; it did not wait forever
    finally:
        w.kill()
        w.wait(timeout=30)
    save_index(load_index(path), dst, force=True)  # a dead holder's lock is free
    load_index(dst)


# ---- item 24: the lock file is never followed ------------------------------------------------
def test_a_lock_symlink_is_refused_not_followed(tmp_path, small):
    idx, path = small
    dst = tmp_path / "idx"
    shutil.copytree(path, dst)
    (dst / ".lock").unlink()
    victim = tmp_path / "elsewhere" / "created-by-save"
    victim.parent.mkdir()
    (dst / ".lock").symlink_to(victim)
    with pytest.raises(IndexFormatError, match="a symbolic link; a lock file is never "
                                               "followed"):
        save_index(idx, dst)
    assert not victim.exists()
    (dst / ".lock").unlink()
    os.mkfifo(dst / ".lock")  # a FIFO would block an open for writing
    with pytest.raises(IndexFormatError, match="not a regular file"):
        save_index(idx, dst)
    load_index(dst)


def test_the_lock_file_names_its_holder_while_held_and_nobody_after(tmp_path, small):
    import socket

    idx, path = small
    dst = tmp_path / "idx"
    save_index(idx, dst)
    # released: no stale holder (whoever still holds it inherited it from this process)
    assert (dst / ".lock").read_text() == f"{os.getpid()} {socket.gethostname()} released\n"
    assert json.loads((dst / "manifest.json").read_text())["manifest_crc32"] is not None
    assert torch.equal(load_index(dst).q_emb, idx.q_emb)
