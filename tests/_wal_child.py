"""A writer appending to a write-ahead log until it is killed (tests/test_wal.py).

Usage: ``python _wal_child.py FOLDER SEED THREADS MAX_FILE_BYTES [chunked]``: open the log
in FOLDER, print ``ready``, then append :func:`payload` ``(SEED, thread, i)`` from THREADS
threads, printing ``A LSN SEED THREAD I`` only after each append returned (the record is
acknowledged); thread 0 prints ``T LSN`` before each ``truncate_through(LSN)``. Each line
is one ``os.write`` of a few bytes: atomic on a pipe, never buffered.

A kill rarely lands inside a ``pwrite`` of a few kilobytes (the kernel finishes it), so
torn records are rare; with ``chunked``, the log's writes go out in pieces of 1 to 700
bytes with a pause between them, and a kill leaves a record cut anywhere.
"""
from __future__ import annotations

import os
import random
import sys
import threading
import time
import types
from pathlib import Path


def payload(seed: int, thread: int, i: int) -> bytes:
    """The ``i``-th payload of ``thread`` in the child started with ``seed``: its name,
    then random bytes of a random length (empty to 6 kB) drawn from that name."""
    name = f"{seed}:{thread}:{i}:".encode()
    rng = random.Random(name)
    return name + rng.randbytes(rng.choice([0, 1, 7, 100, 1000, 6000]))


def parse(data: bytes) -> tuple[int, int, int]:
    """``(seed, thread, i)`` named by a payload (its prefix)."""
    seed, thread, i, _ = data.split(b":", 3)
    return int(seed), int(thread), int(i)


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(folder: str, seed: int, threads: int, max_file_bytes: int, chunked: bool) -> None:
    # Import the log module without memgas_gpu/retrieve/__init__.py, which imports torch
    # (a second per start, and the test starts dozens of these): the module itself needs
    # only the standard library and memgas_gpu._io.
    import memgas_gpu

    pkg = types.ModuleType("memgas_gpu.retrieve")
    pkg.__path__ = [str(Path(memgas_gpu.__file__).parent / "retrieve")]
    sys.modules["memgas_gpu.retrieve"] = pkg
    from memgas_gpu.storage.log import WriteAheadLog

    wal = WriteAheadLog.open(folder, max_file_bytes=max_file_bytes)
    assert "torch" not in sys.modules
    if chunked:
        real, rng = os.pwrite, random.Random(seed)

        def pwrite(fd, data, offset):
            time.sleep(0.0002)
            return real(fd, data[:rng.randint(1, 700)], offset)

        os.pwrite = pwrite
    _say("ready")

    def work(t: int) -> None:
        for i in range(1 << 30):
            lsn = wal.append(payload(seed, t, i))
            _say(f"A {lsn} {seed} {t} {i}")
            if t == 0 and i % 40 == 39 and lsn > 30:
                _say(f"T {lsn - 30}")
                wal.truncate_through(lsn - 30)

    for t in range(threads):
        threading.Thread(target=work, args=(t,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
         sys.argv[5:] == ["chunked"])
