"""Timing and peak-memory primitives of the benchmark suite.

* :class:`Record`: one measured (stage, implementation, size) point: the seconds of each
  timed round, the work done per round (nodes, queries, tokens, bytes) and peak memory.
* :func:`measure`: warm up, then time ``rounds`` calls (CUDA-synchronised), under
  :class:`PeakMemory`.
* :class:`PeakMemory`: peak host memory above the starting RSS (Linux: ``VmHWM`` after
  resetting it through ``/proc/self/clear_refs``; elsewhere ``ru_maxrss``, which cannot
  be reset and is then reported as an absolute peak) and peak device memory
  (``torch.cuda.max_memory_allocated`` above the allocation at entry).
"""
from __future__ import annotations

import math
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = ["Record", "PeakMemory", "measure", "percentile", "sync", "Deadline"]


def sync(device: Optional[torch.device | str] = None) -> None:
    """Wait for queued CUDA work (no-op on CPU)."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] of ``xs`` (NaN when empty)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Record:
    """One benchmark point.

    Attributes:
        stage: ``"encode"``, ``"graph"``, ``"query"``, ``"bm25"``, ``"io_save"``,
            ``"io_load"`` or ``"index"``.
        impl: ``"ours"`` or ``"reference"``.
        size: the point's shape, e.g. ``{"haystacks": 16, "sessions": 500}``.
        times: seconds of each timed round (the whole unit of work each).
        work: units of work done per round (see ``unit``).
        unit: ``"nodes"``, ``"queries"``, ``"tokens"``, ``"bytes"`` or ``"sessions"``.
        sweep: the scaling axis this point belongs to (``"sessions"``, ``"haystacks"``)
            or ``""`` for a headline point.
        note: how it was measured (e.g. "extrapolated from 100 of 2,000 nodes").
        host_peak_bytes: peak host memory above the RSS at entry (or absolute, see
            :class:`PeakMemory`); ``None`` when unknown.
        device_peak_bytes: peak CUDA memory above the allocation at entry.
        extra: anything else (latency percentiles, FLOP and byte counts, ...).
    """

    stage: str
    impl: str
    size: dict
    times: list
    work: float
    unit: str
    sweep: str = ""
    note: str = ""
    host_peak_bytes: Optional[int] = None
    device_peak_bytes: Optional[int] = None
    extra: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Median seconds per round."""
        return percentile(self.times, 50)

    @property
    def rate(self) -> float:
        """Work per second at the median time."""
        s = self.seconds
        return self.work / s if s > 0 else float("inf")

    def size_key(self) -> str:
        return "-".join(f"{k}{v}" for k, v in self.size.items())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["seconds"] = self.seconds
        d["rate"] = self.rate
        return d


class _Peak:
    host: Optional[int] = None
    host_absolute: bool = False
    device: Optional[int] = None


def _status_kb(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``),
    so the starting RSS is not inflated by memory the previous point already freed."""
    import gc

    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


class PeakMemory:
    """Context manager measuring the peak host and device memory of a block.

    ``peak.host`` is the peak resident set above the RSS at entry (bytes); when the
    high-water mark cannot be reset (not Linux), it is ``ru_maxrss`` of the process
    and ``peak.host_absolute`` is True. ``peak.device`` is CUDA only.
    """

    def __init__(self, device: Optional[torch.device | str] = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.result = _Peak()

    def __enter__(self) -> _Peak:
        _release_freed_memory()
        self._resettable = _reset_hwm()
        self._rss0 = _status_kb("VmRSS") if self._resettable else None
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._dev0 = torch.cuda.memory_allocated(self.device)
        return self.result

    def __exit__(self, *exc) -> None:
        if self._resettable and self._rss0 is not None:
            hwm = _status_kb("VmHWM")
            self.result.host = max(0, hwm - self._rss0) if hwm is not None else None
        else:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.result.host = rss if sys.platform == "darwin" else rss * 1024
            self.result.host_absolute = True
        if self.device.type == "cuda":
            sync(self.device)
            self.result.device = max(0, torch.cuda.max_memory_allocated(self.device) - self._dev0)


def measure(fn: Callable[[], Any], *, stage: str, impl: str, size: dict, work: float,
            unit: str, rounds: int = 3, warmup: int = 1, device=None, sweep: str = "",
            note: str = "", extra: Optional[dict] = None) -> Record:
    """Time ``fn()`` ``rounds`` times after ``warmup`` calls.

    Args:
        fn: the unit of work (no arguments).
        stage, impl, size, work, unit, sweep, note, extra: copied to the :class:`Record`.
        rounds: timed calls (default 3).
        warmup: untimed calls first (default 1).
        device: synchronised after each call when CUDA; peak memory is taken there.

    Returns:
        The :class:`Record`; memory peaks cover the warm-up and the timed rounds.
    """
    times = []
    with PeakMemory(device) as peak:  # the warm-up allocates the working set: include it
        for _ in range(warmup):
            fn()
        sync(device)
        for _ in range(max(1, rounds)):
            t0 = time.perf_counter()
            fn()
            sync(device)
            times.append(time.perf_counter() - t0)
    rec = Record(stage, impl, dict(size), times, float(work), unit, sweep, note,
                 peak.host, peak.device, dict(extra or {}))
    if peak.host_absolute:
        rec.extra["host_peak_absolute"] = True
    return rec


class Deadline:
    """A wall-clock budget shared by the stages of one run (``None``: unlimited)."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.t0 = time.perf_counter()
        self.seconds = seconds

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.elapsed

    def expired(self) -> bool:
        return self.left() <= 0


def env_threads() -> int:
    """``MEMGAS_BENCH_THREADS`` (default 1), the torch threads for CPU benchmarks."""
    return int(os.environ.get("MEMGAS_BENCH_THREADS", "1"))
