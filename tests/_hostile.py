"""Helpers for the hostile-input tests: a small real index, CLI runs in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def small_dataset(locomo_list_path):
    """conv-30 cut to its first 6 sessions and the questions answerable from them."""
    from memgas_gpu import Dataset, load_dataset
    from memgas_gpu.data.model import Conversation

    conv = load_dataset(locomo_list_path).get("conv-30")
    keep = conv.sessions[:6]
    ids = {s.id for s in keep}
    qs = [q for q in conv.questions if q.evidence_session_ids
          and set(q.evidence_session_ids) <= ids][:12]
    small = Conversation(conv.id, keep, qs, {k: v for k, v in conv.source_summaries.items()
                                            if k in ids})
    return Dataset([small], format="locomo", source=str(locomo_list_path))


def tiny_encoder(folder: Path):
    from memgas_gpu.encode import Encoder
    from memgas_gpu.encode.tiny import make_random_bert

    return Encoder(make_random_bert(str(folder)), device="cpu", max_length=64)


def build_small_index(locomo_list_path, folder: Path, **kw):
    from memgas_gpu.retrieve import MemoryIndex

    return MemoryIndex.build(small_dataset(locomo_list_path), tiny_encoder(folder / "bert"),
                             summaries="source", device="cpu", progress=False, m=4,
                             skip_sessions=1, **kw)


def version_dir(path: Path) -> Path:
    """The current version folder of a version-2 folder (written by
    ``tests/_legacy_writers.write_v2``; ``save`` writes format 4, see
    ``tests/_format4.py``)."""
    import json

    return path / json.loads((path / "manifest.json").read_text())["current"]


def rewrite_index(path: Path, manifest=None, tensors=None) -> None:
    """Replace a version-2 folder's current manifest and/or tensors *and* every checksum
    that covers them: what a hostile editor can do, so the content checks must catch it
    (the same checks run on every format; ``tests/_format4.py``'s ``edit_*`` and
    ``rewrite`` do this to a format-4 folder)."""
    import json
    import zlib

    import torch
    from safetensors.torch import save_file

    vdir = version_dir(path)
    m = manifest if manifest is not None else json.loads(
        (vdir / "manifest.json").read_text())
    if tensors is not None:
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(vdir / "tensors.safetensors"))
        m["tensor_crc32"] = {k: zlib.crc32(v.contiguous().reshape(-1).view(
            torch.uint8).numpy()) for k, v in tensors.items()}
    raw = json.dumps(m).encode()
    (vdir / "manifest.json").write_bytes(raw)
    top = json.loads((path / "manifest.json").read_text())
    top["manifest_crc32"] = zlib.crc32(raw)
    (path / "manifest.json").write_text(json.dumps(top))


def run_cli(*args, timeout: float = 120, env=None, **kw) -> subprocess.CompletedProcess:
    """``python -m memgas_gpu.cli ARGS`` with this worktree's code (not an installed one)."""
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "memgas_gpu.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT,
                          **kw)


def one_line_error(res: subprocess.CompletedProcess) -> str:
    """Assert exit 2 with exactly one non-empty stderr line and no traceback; return it."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert len(lines) == 1, res.stderr[-2000:]
    return lines[0]
