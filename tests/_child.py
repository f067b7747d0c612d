"""The one harness of the tests that kill a writer: a child process started on this
checkout, which prints ``ready`` once its memory (or log) is open and then one line per
acknowledged step; the test waits for ``ready``, lets it write, kills it with SIGKILL
and reads every line it printed before dying (what was acknowledged is exactly what
printed its line).

The children (tests/_durable_child.py, tests/_wal_child.py, or a ``python -c`` script)
each say what a line means; :class:`Child` only runs the protocol::

    with Child([str(HERE / "_wal_child.py"), folder, "7", "4", "16384"]) as child:
        child.wait_ready()
        time.sleep(0.05)
        lines = child.kill()      # every line printed before the kill
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

__all__ = ["Child", "child_env", "acknowledged"]


def child_env(**extra: str) -> dict:
    """The environment of a child: this checkout and tests/ first on PYTHONPATH."""
    path = [str(ROOT), str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **extra)


class Child:
    """A writer in a child process (``python ARGS...``); its stdout lines are collected
    by a thread as they come, so a kill never loses what was printed."""

    def __init__(self, args: list, env: Optional[dict] = None) -> None:
        self.proc = subprocess.Popen([sys.executable, *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env or child_env())
        self.lines: list = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stderr = ""

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, line: str, timeout: float = 120.0) -> None:
        """Until the child printed ``line`` (AssertionError with its stderr if it died
        or took longer than ``timeout``)."""
        deadline = time.monotonic() + timeout
        while line not in self.lines:
            if self.proc.poll() is not None:
                self._reader.join(5)
                if line in self.lines:
                    return
                raise AssertionError(f"the child ended ({self.proc.returncode}) before "
                                     f"{line!r}: {self.proc.stderr.read()[-3000:]}")
            assert time.monotonic() < deadline, f"the child did not print {line!r}"
            time.sleep(0.005)

    def wait_ready(self, timeout: float = 120.0) -> None:
        self.wait_for("ready", timeout)

    def kill(self) -> list:
        """SIGKILL; every line printed before it (the child is dead on return)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._reader.join(10)
        self.stderr = self.proc.stderr.read()
        assert self.proc.returncode == -signal.SIGKILL, \
            (self.proc.returncode, self.stderr[-3000:])
        return list(self.lines)

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()


def acknowledged(lines: list, intent: str = "intent ", ack: str = "ack ") -> tuple:
    """``(acknowledged, pending)`` of an intent/ack log: the payloads (text after
    ``intent``) whose ack line followed, and the one in flight when the child died (or
    None)."""
    done, pending = [], None
    for line in lines:
        if line.startswith(intent):
            pending = line[len(intent):]
        elif line.startswith(ack):
            done.append(pending)
            pending = None
    return done, pending
