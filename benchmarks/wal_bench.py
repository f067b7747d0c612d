"""Write-ahead log append latency on this machine's disk: one thread (an fsync per
append) against 8 threads (group commit), next to the cost of an fsync alone and of the
embedded store the log could have been: SQLite in WAL mode with ``synchronous=FULL``,
one transaction per record (a record acknowledged once its transaction commits).

    PYTHONPATH=$PWD python benchmarks/wal_bench.py [--dir DIR] [--appends 400] [--bytes 512]

DIR (default: the temporary folder) must be on the disk to measure: a tmpfs makes fsync
free.  Prints a markdown table: p50 / p99 latency per append (or per fsync), appends per
second, and fsyncs per append.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memgas_gpu.storage.log import WriteAheadLog  # noqa: E402


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def fsync_alone(folder: Path, n: int, size: int) -> tuple[list[float], float]:
    """Latency of write + fsync of ``size`` bytes appended to one file, ``n`` times."""
    fd = os.open(folder / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    data, out = os.urandom(size), []
    t0 = time.perf_counter()
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, data)
            os.fsync(fd)
            out.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    return out, time.perf_counter() - t0


def run_threads(threads: int, n: int, setup, one) -> tuple[list[float], float]:
    """``threads`` threads, released together, each calling ``one(ctx)`` ``n // threads``
    times on its own ``ctx = setup()`` (None: no context); the latency of every call and
    the wall time from the release to the last thread's end."""
    lat: list[list[float]] = [[] for _ in range(threads)]
    go = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        ctx = setup()
        go.wait()
        for _ in range(n // threads):
            s = time.perf_counter()
            one(ctx)
            lat[t].append(time.perf_counter() - s)
        close = getattr(ctx, "close", None)
        if close is not None:
            close()

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    go.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    return [x for xs in lat for x in xs], time.perf_counter() - t0


def appends(folder: Path, threads: int, n: int, size: int):
    """Per-append latencies of ``threads`` threads appending ``n`` records in all."""
    with WriteAheadLog.open(folder) as w:
        before = w.stats
        lats, wall = run_threads(threads, n, lambda: os.urandom(size), w.append)
        after = w.stats
    fsyncs = after.fsyncs - before.fsyncs
    return lats, wall, fsyncs, after.appends - before.appends


def sqlite_appends(path: Path, threads: int, n: int, size: int):
    """Per-insert latencies of ``threads`` threads (a connection each) committing ``n``
    blobs of ``size`` bytes in all, one transaction each, to SQLite in WAL mode with
    ``synchronous=FULL``."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, record BLOB NOT NULL)")
    db.commit()
    db.close()
    data = os.urandom(size)

    def connect():
        con = sqlite3.connect(path, timeout=600, isolation_level=None)
        con.execute("PRAGMA synchronous=FULL")
        return con

    def insert(con) -> None:
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO log (record) VALUES (?)", (data,))
        con.execute("COMMIT")

    return run_threads(threads, n, connect, insert)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where to write (default: the temp folder)")
    ap.add_argument("--appends", type=int, default=400, help="appends per row (default 400)")
    ap.add_argument("--bytes", type=int, default=512, help="payload size (default 512)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="wal-bench-", dir=a.dir) as tmp:
        root = Path(tmp)
        ms = 1e3
        rows = []
        lat, wall = fsync_alone(root, a.appends, a.bytes + 16)
        rows.append(("write + fsync alone", _pct(lat, .5) * ms, _pct(lat, .99) * ms,
                     a.appends / wall, "1"))
        for threads in (1, 8):
            lat, wall, fsyncs, n = appends(root / f"wal{threads}", threads, a.appends, a.bytes)
            rows.append((f"append, {threads} thread{'s' * (threads > 1)}",
                         _pct(lat, .5) * ms, _pct(lat, .99) * ms, n / wall,
                         f"{fsyncs / n:.3f} ({fsyncs} for {n})"))
        for threads in (1, 8):
            lat, wall = sqlite_appends(root / f"sqlite{threads}.db", threads, a.appends,
                                       a.bytes)
            rows.append((f"SQLite WAL, synchronous=FULL, {threads} thread"
                         f"{'s' * (threads > 1)}", _pct(lat, .5) * ms, _pct(lat, .99) * ms,
                         len(lat) / wall, "-"))
        print(f"write-ahead log on {Path(tmp).parent} ({a.appends} appends of {a.bytes} "
              "bytes per row)\n")
        print("| what | p50 ms | p99 ms | appends/s | fsyncs per append |")
        print("| --- | ---: | ---: | ---: | --- |")
        for what, p50, p99, rate, per in rows:
            print(f"| {what} | {p50:.2f} | {p99:.2f} | {rate:,.0f} | {per} |")
        print(f"\ncommand: PYTHONPATH=$PWD python benchmarks/wal_bench.py --appends {a.appends} "
              f"--bytes {a.bytes}" + (f" --dir {a.dir}" if a.dir else ""))


if __name__ == "__main__":
    main()
