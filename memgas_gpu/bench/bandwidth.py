"""This machine's memory bandwidth, measured in the benchmark run itself.

The read path and BM25 are memory-bound: their floor on a given machine is the bytes
they must touch divided by the bandwidth the machine delivers to the benchmark's thread
configuration (one torch thread on the CPU by default). Two STREAM-like kernels on
buffers much larger than the caches, best of a few rounds:

* ``copy``: ``b[:] = a`` (reads and writes ``n`` elements: ``2 · 8n`` bytes);
* ``triad``: ``a[:] = b + s · c`` (reads two, writes one: ``3 · 8n`` bytes).

STREAM counts bytes the same way (no write-allocate traffic); the triad is the figure
the reports divide by.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from .timing import sync

__all__ = ["measure_bandwidth", "bandwidth_rows"]


def measure_bandwidth(device=None, nbytes: int = 1 << 28, rounds: int = 5) -> dict:
    """Copy and triad bandwidth in bytes/s on ``device`` with the current torch threads.

    Args:
        device: ``"cpu"`` (default) or a CUDA device.
        nbytes: size of each float64 buffer (default 256 MiB; three are allocated).
        rounds: timed repetitions (best kept).

    Returns:
        ``{"copy": B/s, "triad": B/s, "buffer_bytes": nbytes, "threads": n}``.
    """
    dev = torch.device(device or "cpu")
    n = max(1, nbytes // 8)
    a = torch.ones(n, dtype=torch.float64, device=dev)
    b = torch.full((n,), 2.0, dtype=torch.float64, device=dev)
    c = torch.full((n,), 0.5, dtype=torch.float64, device=dev)

    def best(fn) -> float:
        fn()  # first touch / warm-up
        sync(dev)
        t = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            sync(dev)
            t = min(t, time.perf_counter() - t0)
        return t

    t_copy = best(lambda: b.copy_(a))
    t_triad = best(lambda: torch.add(b, c, alpha=3.0, out=a))
    del a, b, c
    return {"copy": 16.0 * n / t_copy, "triad": 24.0 * n / t_triad, "buffer_bytes": 8 * n,
            "threads": torch.get_num_threads()}


def bandwidth_rows(records, bandwidth: Optional[dict]) -> list[dict]:
    """For the memory-bound stages (read path, BM25): bytes touched, the time that
    implies at the measured triad bandwidth, and measured / limit (1.0 = at the limit).

    Args:
        records: :class:`~memgas_gpu.bench.timing.Record` s (``extra["bytes"]``).
        bandwidth: :func:`measure_bandwidth`'s dict (None: no rows).
    """
    if not bandwidth or not bandwidth.get("triad"):
        return []
    rows = []
    for r in records:
        if r.impl != "ours" or r.stage not in ("query", "bm25") or not r.extra.get("bytes"):
            continue
        implied = r.extra["bytes"] / bandwidth["triad"]
        rows.append({"stage": r.stage, "size": dict(r.size), "sweep": r.sweep,
                     "headline": bool(r.extra.get("headline")), "bytes": r.extra["bytes"],
                     "limit_s": implied, "measured_s": r.seconds,
                     "ratio": r.seconds / implied if implied > 0 else float("nan")})
    return rows
