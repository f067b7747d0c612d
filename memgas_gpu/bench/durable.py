"""The durable memory (``memgas bench --stages durable``): what an acknowledged write
costs, what a checkpoint writes, and how long recovery takes.

* ``add_session`` p50/p99 in RAM, on a folder with one writer (one fsync per write), and
  on a folder with 8 writer threads (group commit: writers share fsyncs), same run,
  same encoder, same conversations; the fsync of this machine's disk alone;
* a checkpoint right after one ``add_session``: its time and bytes written (new files),
  beside that conversation's segment file, at several conversation counts (the cost
  must not grow with the conversations held) and at the LongMemEval shape;
* recovery (``MemoryIndex.open`` of a folder whose writer was killed) against the
  records its log holds after the last checkpoint.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from .timing import Record, percentile

__all__ = ["durable_point", "checkpoint_point", "recovery_point", "fsync_seconds",
           "durable_table"]


def _record(op: str, size: dict, times: list, note: str, **extra) -> Record:
    return Record("durable", op, dict(size), list(times), 1.0, "calls", "", note, None, None,
                  {"p50_ms": 1e3 * percentile(times, 50), "p99_ms": 1e3 * percentile(times, 99),
                   **extra})


def fsync_seconds(folder: str, n: int = 50) -> list:
    """Seconds of a 512-byte write and its fsync, ``n`` times (the disk's own cost)."""
    path = Path(folder) / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    out = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, b"x" * 512)
            os.fsync(fd)
            out.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return out


def _sessions(template, n: int, tag: str):
    return [type(s)(f"{tag}-{k}", s.date, s.turns, s.first_lengths)
            for k, s in zip(range(n), (template[k % len(template)] for k in range(n)))]


def durable_point(enc, n_conversations: int = 100, n_sessions: int = 50, calls: int = 30,
                  threads: int = 8, tmp: Optional[str] = None,
                  log: Callable[[str], None] = print) -> list[Record]:
    """``add_session`` latency in RAM, durable with one writer, and durable with
    ``threads`` writers, on the same index of ``n_conversations`` conversations."""
    from ..retrieve import MemoryIndex
    from .online import online_index

    tmp = tmp or tempfile.mkdtemp(prefix="memgas-durable-")
    idx, conv = online_index(n_conversations, n_sessions, enc)
    rng = random.Random(0)
    size = {"conversations": n_conversations, "sessions": n_sessions,
            "threads": torch.get_num_threads()}

    def adds(mem, tag, n):
        out = []
        for s in _sessions(conv.sessions, n, tag):
            cid = f"conv-{rng.randrange(n_conversations)}"
            t0 = time.perf_counter()
            mem.add_session(cid, s, encoder=enc)
            out.append(time.perf_counter() - t0)
        return out[2:]  # warm-up

    def concurrent(mem, tag):
        times: list = []
        lock = threading.Lock()

        def writer(w):
            got = adds(mem, f"{tag}{w}", calls // threads + 3)
            with lock:
                times.extend(got)

        ts = [threading.Thread(target=writer, args=(w,)) for w in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return times

    ram = adds(idx, "ram", calls + 2)
    ram_n = concurrent(idx, "ramw")
    folder = Path(tmp) / f"durable-{n_conversations}"
    shutil.rmtree(folder, ignore_errors=True)
    idx.save(folder)
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=1 << 40)
    one = adds(mem, "one", calls + 2)
    before = mem.log_stats
    times = concurrent(mem, "w")
    after = mem.log_stats
    fsyncs = (after.fsyncs - before.fsyncs) / max(1, after.appends - before.appends)
    mem.close()
    disk = fsync_seconds(str(folder.parent))
    r1 = percentile(one, 50) / percentile(ram, 50)
    rn = percentile(times, 50) / percentile(ram_n, 50)
    recs = [_record("add_session in RAM, 1 writer", size, ram, "encode + tokenise + link"),
            _record(f"add_session in RAM, {threads} writers", size, ram_n,
                    "writes to one memory are serialized"),
            _record("add_session durable, 1 writer", size, one,
                    "logged and fsync'd before it returns", vs_ram=r1),
            _record(f"add_session durable, {threads} writers", size, times,
                    "group commit: writers share fsyncs", fsyncs_per_write=fsyncs,
                    vs_ram=rn),
            _record("fsync alone", {"bytes": 512}, disk,
                    "a 512-byte append and its fsync, in the memory's folder")]
    for r in recs:
        log(f"  durable {r.impl:34s} p50 {r.extra['p50_ms']:8.2f} ms  p99 "
            f"{r.extra['p99_ms']:8.2f} ms")
    return recs


def checkpoint_point(idx, enc, session, tmp: str, label: dict, rounds: int = 7,
                     log: Callable[[str], None] = print) -> Record:
    """A checkpoint right after one ``add_session`` to one conversation of ``idx`` (saved
    and opened as a durable memory first): seconds, bytes written (the commit's blobs),
    and that conversation's segment; median of ``rounds``.  The first checkpoint after
    opening the saved folder is timed apart, as ``first_ms`` / ``first_bytes`` (it is
    like the others: a saved folder is in the format a checkpoint writes).  The saved
    folder is flushed to disk before the first one is timed."""
    from ..retrieve import MemoryIndex

    folder = Path(tmp) / "ckpt"
    shutil.rmtree(folder, ignore_errors=True)
    idx.save(folder)
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=1 << 40)
    if hasattr(os, "sync"):  # the saved folder's writeback is the setup's cost, not a
        os.sync()            # checkpoint's (its fsyncs would wait for it)
    from ..storage.commit import read_commit

    cid = mem.conversations[len(mem.conversations) // 2].id
    times, written, segs = [], [], []
    for k in range(rounds + 1):
        s = type(session)(f"ckpt-{k}", session.date, session.turns, session.first_lengths)
        mem.add_session(cid, s, encoder=enc)
        t0 = time.perf_counter()
        mem.checkpoint()
        times.append(time.perf_counter() - t0)
        written.append(mem.storage_stats()["last_commit_bytes"])
        segs.append(read_commit(folder)[1].entry(cid)[4])  # its entry's length
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    mem.close()
    shutil.rmtree(folder, ignore_errors=True)
    first_s, first_b = times.pop(0), written.pop(0)
    segs.pop(0)
    rec = Record("durable", "checkpoint after one add", dict(label), times, 1.0, "calls", "",
                 "the conversation's segment, a chunk of the new slot, a directory leaf and page, a root", None,
                 None, {"p50_ms": 1e3 * percentile(times, 50),
                        "bytes_written": int(percentile(written, 50)),
                        "segment_bytes": int(percentile(segs, 50)), "folder_bytes": total,
                        "first_ms": 1e3 * first_s, "first_bytes": int(first_b)})
    log(f"  durable checkpoint {label}: {rec.extra['p50_ms']:.1f} ms, "
        f"{rec.extra['bytes_written']} bytes written (segment {rec.extra['segment_bytes']}, "
        f"folder {total}); the first after opening: {1e3 * first_s:.1f} ms, {first_b} bytes")
    return rec


def recovery_point(enc, conv, records: int, tmp: str,
                   log: Callable[[str], None] = print) -> Record:
    """``MemoryIndex.open`` of a folder whose writer stopped without a checkpoint after
    ``records`` adds: seconds to replay them."""
    from ..data.model import Dataset
    from ..retrieve import MemoryIndex

    folder = Path(tmp) / f"recover-{records}"
    shutil.rmtree(folder, ignore_errors=True)
    MemoryIndex.build(Dataset([]), enc, progress=False).save(folder)
    mem = MemoryIndex.open(folder, encoder=enc, checkpoint_bytes=1 << 40,
                           checkpoint_seconds=1e9)
    for s in _sessions(conv.sessions, records, "rec"):
        mem.add_session(f"c{hash(s.id) % 16}", s, encoder=enc)
    crashed = Path(tmp) / f"recover-{records}-killed"
    shutil.rmtree(crashed, ignore_errors=True)
    shutil.copytree(folder, crashed)  # what kill -9 leaves: every write synced, no checkpoint
    mem.close()
    t0 = time.perf_counter()
    back = MemoryIndex.open(crashed, encoder=enc)
    sec = time.perf_counter() - t0
    assert back.recovery["replayed"] == records, back.recovery
    back.close()
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(crashed, ignore_errors=True)
    log(f"  durable recovery of {records} records: {sec:.2f} s")
    return Record("durable", "recovery", {"records": records}, [sec], records, "records", "",
                  "open: checkpoint, then the log replayed", None, None,
                  {"p50_ms": 1e3 * sec, "per_record_ms": 1e3 * sec / max(1, records)})


def durable_table(records) -> list[str]:
    """Markdown rows of the ``durable`` stage."""
    recs = [r for r in records if r.stage == "durable"]
    if not recs:
        return []
    L = ["| operation | size | p50 | p99 | note |", "| --- | --- | --- | --- | --- |"]
    for r in recs:
        if r.impl == "recovery":
            L.append(f"| recovery | {r.size['records']} records | "
                     f"{r.extra['p50_ms'] / 1e3:.2f} s | - | "
                     f"{r.extra['per_record_ms']:.2f} ms per record |")
        elif r.impl.startswith("checkpoint"):
            size = ", ".join(f"{k} {v}" for k, v in r.size.items())
            first = (f"; the first after opening a saved folder: {r.extra['first_ms']:.3g} "
                     f"ms, {r.extra['first_bytes']} bytes" if "first_ms" in r.extra else "")
            L.append(f"| {r.impl} | {size} | {r.extra['p50_ms']:.3g} ms | "
                     f"{1e3 * percentile(r.times, 99):.3g} ms | "
                     f"{r.extra['bytes_written']} bytes written (segment "
                     f"{r.extra['segment_bytes']}; folder {r.extra['folder_bytes']}){first} |")
        else:
            size = ", ".join(f"{k} {v}" for k, v in r.size.items() if k != "threads")
            extra = (f"; {r.extra['fsyncs_per_write']:.2f} fsyncs per write"
                     if "fsyncs_per_write" in r.extra else "")
            if "vs_ram" in r.extra:
                extra += f"; {r.extra['vs_ram']:.2f}x in RAM with as many writers"
            L.append(f"| {r.impl} | {size} | {r.extra['p50_ms']:.3g} ms | "
                     f"{r.extra['p99_ms']:.3g} ms | {r.note}{extra} |")
    return L
