"""A memory of many conversations on disk (``memgas bench --stages scale``): what
opening it costs, what it holds in RAM, the first search of a conversation no read has
touched (cold) against a second one (warm), the first add after the open (with its
encoding), and what a checkpoint after one add writes,
at 1,000 / 10,000 / 100,000 conversations.

The folders are written through the library in one piece (``MemoryIndex`` of random
embeddings and block-diagonal graphs, then ``save``): adding 500,000 sessions one at a
time would take hours and measure the encoder, not the folder.  Each point is measured
in a fresh process (``python -m memgas_gpu.bench.scale measure FOLDER``), so that
nothing of the build is in its RAM; the tiny random encoder encodes the questions.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from .timing import Record

__all__ = ["build_folder", "measure", "scale_points"]


def _rss() -> int:
    """This process's resident set, bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_folder(folder: str, n_conv: int, sessions: int = 5, dim: int = 32,
                 seed: int = 0) -> dict:
    """Save a memory of ``n_conv`` conversations of ``sessions`` sessions (random
    embeddings of size ``dim``, every session's nodes linked to the previous session's,
    no lexical data) into ``folder``; ``{"seconds", "bytes"}``."""
    from ..memory.index import MemoryIndex
    from ..memory.meta import ConversationMeta
    from ..retrieve.params import GraphParams

    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    rows = n_conv * sessions
    gran = torch.randn(rows, 4, dim, generator=g)
    gran = gran / gran.norm(dim=-1, keepdim=True)
    # each node of session j (j >= 1) linked to the same granularity of session j - 1
    node = torch.arange(rows * 4)
    row = node // 4
    has_prev = (row % sessions) > 0
    src, dst = node[has_prev], node[has_prev] - 4
    edges = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    order = torch.argsort(edges[0] * (rows * 4) + edges[1])
    edges = edges[:, order]
    indptr = torch.zeros(rows * 4 + 1, dtype=torch.long)
    indptr[1:] = torch.bincount(edges[0], minlength=rows * 4).cumsum(0)
    days = [f"2024-{1 + j % 12:02d}-{1 + j % 28:02d}" for j in range(sessions)]
    metas = [ConversationMeta(f"user-{c:06d}", [f"s{j}" for j in range(sessions)], days)
             for c in range(n_conv)]
    idx = MemoryIndex(conversations=metas, questions=[],
                      conv_offsets=torch.arange(0, rows + 1, sessions, dtype=torch.long),
                      row_slot=torch.arange(rows), gran=gran, concat=None,
                      q_emb=torch.zeros(0, dim), q_conv=torch.zeros(0, dtype=torch.long),
                      graphs={"gmm": (indptr, edges[1].contiguous())}, params=GraphParams(),
                      config={})
    idx.save(folder)
    size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
    return {"seconds": time.perf_counter() - t0, "bytes": size}


def measure(folder: str, encoder_dir: str, searches: int = 20) -> dict:
    """In this (fresh) process: open the folder for writing, the RSS it added, a cold
    and a warm search of conversations no read touched, the bytes and time of a
    checkpoint after one add; ``max_resident_bytes`` is reported by the memory when it
    has one."""
    from ..data.model import Session
    from ..encode import Encoder
    from ..memory.index import MemoryIndex

    enc = Encoder(encoder_dir, device="cpu", max_length=64)
    q = enc.encode(["warm up the encoder"], progress=False)  # noqa: F841 - not timed
    import gc

    gc.collect()
    rss0 = _rss()
    t0 = time.perf_counter()
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=1 << 40,
                           checkpoint_seconds=1e9)
    open_s = time.perf_counter() - t0
    gc.collect()
    rss_open = _rss() - rss0
    n = len(mem.conversation_ids()) if hasattr(mem, "conversation_ids") \
        else mem.n_conversations
    ids = [f"user-{(k * 7919) % n:06d}" for k in range(searches)]
    cold, warm = [], []
    question = ["what did I say about the garden?"]
    q_emb_s = []
    for cid in ids:
        t = time.perf_counter()
        enc.encode(question, progress=False)
        q_emb_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        mem.search(cid, question, k=3, method="memgas", encoder=enc, device="cpu")
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        mem.search(cid, question, k=3, method="memgas", encoder=enc, device="cpu")
        warm.append(time.perf_counter() - t)
    gc.collect()
    rss_search = _rss() - rss0
    cid = ids[0]
    t = time.perf_counter()  # the first write after the open
    mem.add_session(cid, Session("added", "2024-12-01", ("[user]: a new one",)),
                    summary="a new one", keywords="new", encoder=enc)
    add_s = time.perf_counter() - t
    t = time.perf_counter()
    mem.checkpoint()
    ckpt_s = time.perf_counter() - t
    ckpt_bytes = mem.storage_stats()["last_commit_bytes"]
    residency = mem.residency() if hasattr(mem, "residency") else None
    mem.close()
    files = sum(1 for p in Path(folder).rglob("*") if p.is_file())
    enc_s = sorted(q_emb_s)[len(q_emb_s) // 2]
    med = (lambda xs: sorted(xs)[len(xs) // 2])
    return {"open_s": open_s, "rss_open": rss_open, "rss_after_searches": rss_search,
            "cold_ms": 1e3 * (med(cold) - enc_s), "warm_ms": 1e3 * (med(warm) - enc_s),
            "encode_ms": 1e3 * enc_s, "first_add_s": add_s, "checkpoint_s": ckpt_s,
            "checkpoint_bytes": ckpt_bytes, "files": files, "residency": residency}


def stream(folder: str, encoder_dir: str, max_resident_bytes: int, batch: int = 64) -> dict:
    """In this (fresh) process: open the folder read-only with ``max_resident_bytes``,
    then search every conversation once (``batch`` conversations per
    ``search_many``), sampling the RSS it added after each batch; ``{"rss_peak",
    "rss_end", "seconds", "residency"}``."""
    from ..encode import Encoder
    from ..memory.index import MemoryIndex
    from ..retrieve.search import SearchRequest

    enc = Encoder(encoder_dir, device="cpu", max_length=64)
    enc.encode(["warm up the encoder"], progress=False)
    import gc

    gc.collect()
    rss0 = _rss()
    t0 = time.perf_counter()
    mem = MemoryIndex.open(folder, readonly=True, max_resident_bytes=max_resident_bytes)
    ids = mem.conversation_ids()
    peak = 0
    for a in range(0, len(ids), batch):
        reqs = [SearchRequest(c, ["what did I say about the garden?"], 3, "memgas")
                for c in ids[a:a + batch]]
        mem.search_many(reqs, encoder=enc, device="cpu")
        peak = max(peak, _rss() - rss0)
    return {"rss_peak": peak, "rss_end": _rss() - rss0,
            "seconds": time.perf_counter() - t0, "residency": mem.residency()}


def scale_points(counts, tmp: str, encoder_dir: str, sessions: int = 5,
                 log: Callable[[str], None] = print) -> list:
    """Build a folder per count, measure each in a fresh process; one Record per
    count (open seconds as its time)."""
    out = []
    for n in counts:
        folder = str(Path(tmp) / f"scale-{n}")
        built = build_folder(folder, n, sessions)
        root = str(Path(__file__).resolve().parents[2])  # this memgas_gpu, not another
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        res = subprocess.run([sys.executable, "-m", "memgas_gpu.bench.scale", "measure",
                              folder, encoder_dir], capture_output=True, text=True, env=env,
                             timeout=3600)
        if res.returncode != 0:
            raise RuntimeError(f"scale point {n}: {res.stderr[-2000:]}")
        m = json.loads(res.stdout.strip().splitlines()[-1])
        m.update(built_s=built["seconds"], folder_bytes=built["bytes"])
        log(f"  scale {n} conversations: open {m['open_s']:.3f} s, +{m['rss_open'] / 2**20:.1f} "
            f"MB RSS, cold {m['cold_ms']:.1f} ms, warm {m['warm_ms']:.1f} ms, first add "
            f"{1e3 * m['first_add_s']:.1f} ms, checkpoint "
            f"{m['checkpoint_bytes']} bytes in {1e3 * m['checkpoint_s']:.1f} ms, "
            f"{m['files']} files, folder {built['bytes'] / 2**20:.1f} MB")
        out.append(Record("scale", "open", {"conversations": n, "sessions": sessions},
                          [m["open_s"]], 1.0, "opens", "", "a fresh process opens the folder",
                          None, None, m))
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return out


def _main(argv: Optional[list] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["measure"]:
        torch.set_num_threads(1)
        print(json.dumps(measure(argv[1], argv[2])))
        return
    if argv[:1] == ["stream"]:
        torch.set_num_threads(1)
        print(json.dumps(stream(argv[1], argv[2], int(argv[3]))))
        return
    raise SystemExit("usage: python -m memgas_gpu.bench.scale measure FOLDER ENCODER_DIR")


if __name__ == "__main__":
    _main()
