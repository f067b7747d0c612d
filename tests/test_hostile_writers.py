"""Writers of a memory folder that crash, stop, race or are handed a bad index or a bad
folder: nothing acknowledged is lost, and every refusal is one line (round 3 of the
hostile-input issue: items 1, 3, 4, 5, 13 and 24, and leftover pointer temporaries), in
the one folder format (4) ``save`` writes."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import _format4 as f4
from _hostile import ROOT, build_small_index
from memgas_gpu.data.model import Session
from memgas_gpu.errors import MemgasError
from memgas_gpu.retrieve import IndexFormatError, IndexLockError, MemoryIndex
from memgas_gpu.storage.folder import save_index

load_index = MemoryIndex.load


@pytest.fixture(scope="module")
def small(tmp_path_factory, locomo_list_path):
    folder = tmp_path_factory.mktemp("writers")
    idx = build_small_index(locomo_list_path, folder)
    return idx, save_index(idx, folder / "idx")


def _python(code: str, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _new_session(sid: str) -> Session:
    return Session(id=sid, date="2023/06/02 10:00", turns=["[B]: We went hiking."])


def _copy(path: Path, dst: Path) -> Path:
    shutil.copytree(path, dst)
    return dst


def _data(path: Path) -> dict:
    """Every file of the folder but its lock file (which names the last writer)."""
    return {k: v for k, v in f4.folder_bytes(path).items() if k != ".lock"}


def _layout(path: Path) -> list:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ---- item 1: a save never replaces a loadable index with one that does not load ---------
@pytest.mark.parametrize("damage", ["int_date", "none_id", "nan_embedding", "surrogate",
                                    "metadata"])
def test_a_save_that_would_not_load_changes_nothing(tmp_path, small, damage):
    """An index damaged in memory (what unchecked add_session arguments did) was saved,
    the old version deleted, and the new one did not load: the snapshot is checked as a
    load checks it before a byte is written."""
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    before = f4.folder_bytes(dst)
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
    elif damage == "surrogate":
        idx.questions[0] = dataclasses.replace(idx.questions[0], text="x\udfff")
        want = "field 'questions[0].text' holds a lone UTF-16 surrogate"
    else:
        idx.config["dataset"] = {"source": float("nan")}
        want = "its metadata is not strict JSON"
    with pytest.raises(IndexFormatError) as e:
        save_index(idx, dst)
    msg = str(e.value)
    assert want in msg and "\n" not in msg, msg
    assert msg.startswith(str(dst)) and ("nothing was written" in msg or "(not saved)" in msg)
    assert f4.folder_bytes(dst) == before  # nothing written, nothing removed
    load_index(dst)


# ---- what is written is what the commit names ------------------------------------------
def _short_writes(monkeypatch, folder: Path, most: int) -> list:
    """``os.write`` and ``os.pwrite`` write at most ``most`` bytes per call to a file of
    ``folder`` (a short write, which POSIX allows: the caller must write the rest)."""
    real_write, real_pwrite = os.write, os.pwrite
    root = os.path.realpath(folder) + os.sep
    seen = []

    def mine(fd) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(root)
        except OSError:
            return False

    def write(fd, data):
        if mine(fd) and len(data) > most:
            seen.append(len(data))
            data = memoryview(data)[:most]
        return real_write(fd, data)

    def pwrite(fd, data, offset):
        if mine(fd) and len(data) > most:
            seen.append(len(data))
            data = memoryview(data)[:most]
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "pwrite", pwrite)
    return seen


@pytest.mark.parametrize("most", [1, 4096])
def test_short_writes_are_completed_never_committed_short(tmp_path, small, monkeypatch,
                                                         most):
    """The pack's blobs and the pointer are written in several calls when the system
    writes less than asked: the commit names whole blobs (each checksum right), and the
    folder loads the index written."""
    idx, path = small
    dst = _copy(path, tmp_path / "idx")
    seen = _short_writes(monkeypatch, dst, most)
    save_index(idx, dst, force=True)
    monkeypatch.undo()
    assert seen, "no write was cut short"
    assert len(f4.commit_blobs(dst)) >= 6  # every blob whole, its CRC-32 right
    back = load_index(dst)
    assert torch.equal(back.q_emb, idx.q_emb)
    assert torch.equal(back.snapshot().gran, idx.snapshot().gran)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_embeddings_are_stored_in_the_dtype_asked_and_load_as_float32(tmp_path, small,
                                                                      dtype):
    """``save(dtype=)``: every embedding table of the store and the questions is stored
    in that dtype (half the bytes), and a load returns float32 (docs/index-format.md)."""
    idx, _ = small
    out = save_index(idx, tmp_path / "idx", dtype=dtype)
    chunk, _ = f4.blob_tensors(out, f4.root(out)["chunks"][0]["ref"])
    questions, _ = f4.blob_tensors(out, f4.root(out)["questions"])
    for name, x in (("gran", chunk["gran"]), ("dense.concat", chunk["dense.concat"]),
                    ("turns", chunk["turns"]), ("q_emb", questions["q_emb"])):
        assert x.dtype == dtype, name
    assert chunk["lexical.S.tf"].dtype == torch.float32  # term counts stay exact
    back = load_index(out)
    assert back.snapshot().gran.dtype == torch.float32 and back.q_emb.dtype == torch.float32
    assert torch.equal(back.snapshot().gran, idx.snapshot().gran.to(dtype).float())
    assert torch.equal(back.q_emb, idx.q_emb.to(dtype).float())


def test_a_saved_folder_opens_without_losing_its_commit(tmp_path, small):
    """The root records each pack's end *including the root itself*: the writer that
    opens the folder cuts every pack back to that end (what an interrupted commit
    appended), and a reader meanwhile, or after it, still reads the saved commit."""
    idx, _ = small
    out = save_index(idx, tmp_path / "idx")
    size = {k: v for k, v in f4.pack_sizes(out).items()}
    assert f4.root(out)["packs"] == {str(k): {"end": v, "live": v - f4.PACK_HEADER}
                                     for k, v in size.items()}
    m = MemoryIndex.open(out)
    try:
        assert f4.pack_sizes(out) == size  # nothing of the commit cut
        assert torch.equal(load_index(out).q_emb, idx.q_emb)  # a reader meanwhile
    finally:
        m.close()
    assert torch.equal(load_index(out).q_emb, idx.q_emb)


# ---- item 3: optimistic concurrency between processes -----------------------------------
_REMOVE_AND_SAVE = """
import sys
from memgas_gpu.retrieve import MemoryIndex
idx = MemoryIndex.load(sys.argv[1])
idx.remove_session("conv-30", sys.argv[2])
idx.save(sys.argv[1])
"""


def test_a_save_over_a_folder_another_process_changed_is_refused(tmp_path, small):
    """Another process removed a session and saved; this one, loaded before, added one:
    its save is refused (the other's change would be lost without a word)."""
    from memgas_gpu.storage.folder import current_version

    _, path = small
    dst = _copy(path, tmp_path / "idx")
    mine = load_index(dst)
    gone = mine.conversations[0].session_ids[2]
    other = _python(_REMOVE_AND_SAVE, dst, gone)
    assert other.wait(timeout=300) == 0, other.stderr.read()[-2000:]
    mine.add_session("conv-30", _new_session("from-me"))
    before = _data(dst)
    with pytest.raises(MemgasError, match="another writer saved version") as e:
        save_index(mine, dst)
    assert type(e.value).__name__ == "IndexConflictError"
    assert "\n" not in str(e.value) and str(dst) in str(e.value)
    assert "nothing was written" in str(e.value)
    assert _data(dst) == before
    now = load_index(dst)  # the other process's change was not lost
    assert now.folder_version.version == current_version(dst)
    assert gone not in now.conversations[0].session_ids
    # reload and redo: both changes are kept
    now.add_session("conv-30", _new_session("from-me"))
    save_index(now, dst)
    save_index(now, dst)  # its own last save is the version it expects
    ids = load_index(dst).conversations[0].session_ids
    assert ids[-1] == "from-me" and gone not in ids
    save_index(mine, dst, force=True)  # force: replace whatever is there
    ids = load_index(dst).conversations[0].session_ids
    assert ids[-1] == "from-me" and gone in ids


def test_saving_elsewhere_or_into_an_empty_folder_is_not_a_conflict(tmp_path, small):
    _, path = small
    idx = load_index(path)
    save_index(idx, tmp_path / "copy")  # another folder: replaced as asked
    assert idx.folder_version.folder == os.path.realpath(tmp_path / "copy")
    shutil.rmtree(tmp_path / "copy")
    save_index(idx, tmp_path / "copy")  # nothing there to lose
    (tmp_path / "empty").mkdir()
    save_index(idx, tmp_path / "empty")  # an empty folder: written
    load_index(tmp_path / "copy")
    load_index(tmp_path / "empty")


# ---- item 4: glob characters in the folder name ------------------------------------------
def test_glob_characters_in_the_name_touch_no_other_folder(tmp_path, small):
    """A save touches nothing outside its folder, whatever its name: another index's
    working folder whose name a glob of ``idx[1A]`` would match is kept."""
    idx, _ = small
    other = tmp_path / ".idx1.abcdefgh.tmp"  # another index's working folder
    other.mkdir()
    (other / "data").write_text("keep")
    third = tmp_path / "idx1"
    save_index(idx, third)
    third_bytes = f4.folder_bytes(third)
    save_index(idx, tmp_path / "idx[1A]")
    save_index(idx, tmp_path / "idx[1A]")
    assert (other / "data").read_text() == "keep"
    assert f4.folder_bytes(third) == third_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == [".idx1.abcdefgh.tmp", "idx1",
                                                          "idx[1A]"]
    load_index(tmp_path / "idx[1A]")


# ---- item 5 and the smaller item: pointer temporaries of killed writers ------------------
_KILLED_AT_THE_POINTER = """
import os, signal, sys
from memgas_gpu.retrieve import MemoryIndex
idx = MemoryIndex.load(sys.argv[1])
real = os.replace
def replace(src, dst, *a, **k):
    if str(dst).endswith("manifest.json") and ".manifest.json." in str(src):
        os.kill(os.getpid(), signal.SIGKILL)  # killed between the temporary and the rename
    return real(src, dst, *a, **k)
os.replace = replace
idx.save(sys.argv[2])
"""


def test_a_writer_killed_at_the_pointer_does_not_lock_the_folder_out(tmp_path, small):
    """A writer killed during its first save left .manifest.json.*.tmp (and its pack)
    and no pointer; every later save refused the folder as "not an index".  Over an
    existing memory, the previous commit stays current."""
    _, path = small
    for target in (tmp_path / "new", tmp_path / "existing"):
        if target.name == "existing":
            shutil.copytree(path, target)
        w = _python(_KILLED_AT_THE_POINTER, path, target)
        assert w.wait(timeout=300) == -signal.SIGKILL, w.stderr.read()[-2000:]
        stray = [p.name for p in target.iterdir() if p.name.startswith(".manifest.json.")]
        assert len(stray) == 1, _layout(target)
        if target.name == "existing":
            assert len(list((target / "data").iterdir())) == 2  # the killed commit's pack
            load_index(target)  # the previous version is still the current one
        else:
            with pytest.raises(IndexFormatError, match="no manifest.json"):
                load_index(target)
        save_index(load_index(path), target)
        assert not [p for p in _layout(target) if p.endswith(".tmp") or "creating" in p]
        assert len(list((target / "data").iterdir())) == 1, _layout(target)
        load_index(target)


# ---- item 13: a stopped or busy lock holder ---------------------------------------------------
_STOPPED_WHILE_SAVING = """
import os, signal, sys
import memgas_gpu.storage.folder as folder
from memgas_gpu.retrieve import MemoryIndex
idx = MemoryIndex.load(sys.argv[1])
real = folder.commit_folder
def commit_folder(*a, **k):
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # stopped while it holds the lock
    return real(*a, **k)
folder.commit_folder = commit_folder
idx.save(sys.argv[2])
"""


def _state(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rfind(")") + 2]


def test_a_stopped_lock_holder_is_named_after_the_timeout(tmp_path, small):
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    w = _python(_STOPPED_WHILE_SAVING, path, dst)
    try:
        assert w.stdout.readline().strip() == "holding"
        deadline = time.time() + 60
        while _state(w.pid) != "T" and time.time() < deadline:
            time.sleep(0.05)
        before = f4.folder_bytes(dst)
        t0 = time.monotonic()
        with pytest.raises(IndexLockError) as e:
            save_index(load_index(path), dst, lock_timeout=1.0)
        waited = time.monotonic() - t0
        msg = str(e.value)
        assert msg.startswith(f"{dst / '.lock'}: the folder is being written by process "
                              f"{w.pid} (python"), msg
        assert "stopped (resume it with kill -CONT, or end it)" in msg
        assert "for more than 1 s" in msg and "\n" not in msg
        assert 1.0 <= waited < 30  # it waited, then gave up; not forever
        assert f4.folder_bytes(dst) == before
    finally:
        w.kill()
        w.wait(timeout=30)
    save_index(load_index(path), dst, force=True)  # a dead holder's lock is free
    load_index(dst)


def test_a_save_over_a_memory_open_for_writing_waits_then_names_it(tmp_path, small):
    """A memory opened on the folder holds its lock for its whole life: a save waits
    ``lock_timeout`` for it, then stops with IndexLockError naming the holder, having
    written nothing; once the memory is closed the save goes through."""
    idx, path = small
    dst = _copy(path, tmp_path / "idx")
    m = MemoryIndex.open(dst)
    try:
        before = f4.folder_bytes(dst)
        assert before[".lock"] == f"{os.getpid()} {socket.gethostname()}\n".encode()
        for timeout in (0, 0.3):
            t0 = time.monotonic()
            with pytest.raises(IndexLockError) as e:
                save_index(idx, dst, force=True, lock_timeout=timeout)
            waited = time.monotonic() - t0
            msg = str(e.value)
            assert msg.startswith(f"{dst / '.lock'}: the folder is being written by process "
                                  f"{os.getpid()} ("), msg
            assert "one writer at a time" in msg and "\n" not in msg
            assert waited >= timeout
            assert f4.folder_bytes(dst) == before
    finally:
        m.close()
    save_index(idx, dst, force=True)
    load_index(dst)


# ---- item 24: the lock file is never followed ------------------------------------------------
def test_a_lock_symlink_is_refused_not_followed(tmp_path, small):
    idx, path = small
    dst = _copy(path, tmp_path / "idx")
    (dst / ".lock").unlink()
    victim = tmp_path / "elsewhere" / "created-by-save"
    victim.parent.mkdir()
    (dst / ".lock").symlink_to(victim)
    before = f4.folder_bytes(dst)
    with pytest.raises(IndexLockError, match="a symbolic link; a lock file is never "
                                             "followed"):
        save_index(idx, dst)
    assert not victim.exists() and f4.folder_bytes(dst) == before
    (dst / ".lock").unlink()
    os.mkfifo(dst / ".lock")  # a FIFO would block an open for writing
    with pytest.raises(IndexLockError, match="not a regular file"):
        save_index(idx, dst)
    with pytest.raises(IndexLockError, match="not a regular file"):
        MemoryIndex.open(dst)
    load_index(dst)


def test_the_lock_file_names_its_holder_while_held_and_nobody_after(tmp_path, small,
                                                                   monkeypatch):
    import memgas_gpu.storage.folder as folder

    idx, _ = small
    dst = tmp_path / "idx"
    held = []
    real = folder.commit_folder

    def commit_folder(path, *a, **k):
        held.append((Path(path) / ".lock").read_text())
        return real(path, *a, **k)

    monkeypatch.setattr(folder, "commit_folder", commit_folder)
    save_index(idx, dst)
    me = f"{os.getpid()} {socket.gethostname()}"
    assert held == [f"{me}\n"]
    # released: no stale holder (whoever still holds it inherited it from this process)
    assert (dst / ".lock").read_text() == f"{me} released\n"
    ptr = json.loads((dst / "manifest.json").read_text())
    assert set(ptr) == {"format", "version", "commit", "root"}
    assert ptr["format"] == "memgas_gpu.index" and ptr["version"] == 4
    assert torch.equal(load_index(dst).q_emb, idx.q_emb)
