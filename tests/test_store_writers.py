"""EmbeddingStore with two writers on one folder: nothing is lost, and a writer that
would overlap another is refused with a clear error (two processes)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from memgas_gpu.encode import EmbeddingStore, StoreError

from _store_writer import StoreEncoder, texts, vector

HERE = Path(__file__).resolve().parent
ENC = StoreEncoder()


def _child(folder, prefix, *hold):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(HERE / "_store_writer.py"), str(folder), prefix,
                             *map(str, hold)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _check_all(folder, prefixes):
    """A fresh reader finds every text of every prefix with its own vector."""
    store = EmbeddingStore(folder, ENC.fingerprint, dtype="float32")
    want = [t for p in prefixes for t in texts(p)]
    assert len(store) == len(want)
    torch.testing.assert_close(store.lookup(want), torch.stack([vector(t) for t in want]))


def test_two_stores_taking_turns_lose_nothing(tmp_path):
    """Both stores are open before either writes (in one process, then across two)."""
    a = EmbeddingStore(tmp_path / "one", ENC.fingerprint, dtype="float32")
    b = EmbeddingStore(tmp_path / "one", ENC.fingerprint, dtype="float32")
    a.encode(ENC, texts("a"), progress=False)
    b.encode(ENC, texts("b") + texts("a"), progress=False)
    assert b.n_encoded == 4  # the texts the other store wrote are read, not encoded again
    _check_all(tmp_path / "one", "ab")

    mine = EmbeddingStore(tmp_path / "two", ENC.fingerprint, dtype="float32")
    child = _child(tmp_path / "two", "child")
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out
    mine.encode(ENC, texts("parent"), progress=False)
    _check_all(tmp_path / "two", ["child", "parent"])


def test_second_writer_is_refused_while_the_first_writes(tmp_path):
    folder = tmp_path / "s"
    started, go = tmp_path / "started", tmp_path / "go"
    child = _child(folder, "child", started, go)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert child.poll() is None, child.communicate()[0]
            assert time.monotonic() < deadline, "the child never started writing"
            time.sleep(0.05)
        mine = EmbeddingStore(folder, ENC.fingerprint, dtype="float32")
        with pytest.raises(StoreError, match="another store is writing to this folder"):
            mine.encode(ENC, texts("parent"), progress=False)
        # reading needs no lock
        assert len(EmbeddingStore(folder, ENC.fingerprint, dtype="float32")) == 0
    finally:
        go.touch()
        out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out
    mine.encode(ENC, texts("parent"), progress=False)  # the lock is free again
    _check_all(folder, ["child", "parent"])
