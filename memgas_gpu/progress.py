"""Progress that reaches a log: a tqdm bar on a terminal, plain lines everywhere else.

Long stages (loading, expansion, encoding, the association graph) report through
:class:`Progress`.  When stderr is a terminal it is a tqdm bar; when it is not (output
redirected to a file, a batch job, a pipe) it prints one plain line every
``interval`` seconds (default 10, ``MEMGAS_PROGRESS_INTERVAL``)::

    encode: 41,000/96,500 texts (42%), 812 texts/s, elapsed 50s, ETA 1m08s

and a closing line when a stage that lasted at least the interval ends.  A shorter
stage prints nothing.  A ``MEMGAS_PROGRESS_INTERVAL`` that is not a finite number of
seconds >= 0 (``nan``, ``inf``, ``-1``, ``ten``) is reported once on stderr and the
default is used.  Progress never goes to stdout: with no stderr (``2>&-``) it is off.  :func:`set_quiet` / :func:`quiet` (the CLI's ``--quiet``, or
``MEMGAS_QUIET=1``) silence every stage; a call's own ``progress=False`` silences
that call; ``progress=None`` follows the enclosing :func:`defaults` scope.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import time
from typing import IO, Callable, Iterator, Optional

__all__ = ["Progress", "DEFAULT_INTERVAL", "defaults", "is_enabled", "is_quiet", "quiet",
           "set_quiet"]

_QUIET = [os.environ.get("MEMGAS_QUIET", "") not in ("", "0")]
_DEFAULT: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar(
    "memgas_progress", default=None)


#: seconds between plain progress lines unless ``MEMGAS_PROGRESS_INTERVAL`` says otherwise
DEFAULT_INTERVAL = 10.0
_WARNED: set = set()


def _interval() -> float:
    """``MEMGAS_PROGRESS_INTERVAL`` in seconds; a bad value is reported (once) and the
    default used, so that a typo never silences the progress of a long job."""
    raw = os.environ.get("MEMGAS_PROGRESS_INTERVAL", "")
    if not raw.strip():
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value >= 0:
        return value
    if raw not in _WARNED:
        _WARNED.add(raw)
        if sys.stderr is not None:
            print(f"memgas: MEMGAS_PROGRESS_INTERVAL={raw!r} is not a finite number of "
                  f"seconds >= 0; using {DEFAULT_INTERVAL:g}", file=sys.stderr, flush=True)
    return DEFAULT_INTERVAL


def set_quiet(quiet: bool = True) -> None:
    """Silence (or restore) progress output process-wide."""
    _QUIET[0] = bool(quiet)


@contextlib.contextmanager
def quiet(flag: bool = True) -> Iterator[None]:
    """Silence progress output within the block (``flag=False``: leave it as is)."""
    was = _QUIET[0]
    _QUIET[0] = was or bool(flag)
    try:
        yield
    finally:
        _QUIET[0] = was


def is_quiet() -> bool:
    """Whether :func:`set_quiet` (or ``MEMGAS_QUIET``) silenced progress output."""
    return _QUIET[0]


def is_enabled(progress: Optional[bool] = None) -> bool:
    """Resolve a ``progress`` argument: False or quiet → off; None → the scope's
    default (on unless a :func:`defaults` scope says False)."""
    if _QUIET[0] or progress is False:
        return False
    if progress is None:
        return _DEFAULT.get() is not False
    return True


@contextlib.contextmanager
def defaults(progress: Optional[bool]) -> Iterator[None]:
    """Within the block, ``progress=None`` means ``progress`` (None: unchanged)."""
    if progress is None:
        yield
        return
    token = _DEFAULT.set(progress)
    try:
        yield
    finally:
        _DEFAULT.reset(token)


def _isatty(f) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """One stage's progress: ``update(n)`` as work completes, ``close()`` at the end.

    Args:
        total: units of work in the stage (None: unknown, no percentage or ETA).
        desc: stage name, first on every line.
        unit: what is counted (``"text"``, ``"session"``, ``"B"``).
        enabled: the caller's ``progress`` argument (see :func:`is_enabled`).
        unit_scale: print counts as sizes (``1.2GB``), for bytes.
        leave: keep the terminal bar after it closes.
        file: stream (default: ``sys.stderr`` at creation; none, as under ``2>&-``:
            no output; never ``sys.stdout`` by default).
        interval: seconds between plain lines (default ``MEMGAS_PROGRESS_INTERVAL``
            or 10).
        clock: monotonic time source (tests pass a fake one).
        tty: force bar (True) or plain lines (False); default: whether ``file`` is a
            terminal.
        initial: units already done before the stage started (e.g. answers found in
            a cache); counted in done/total, not in the rate.
    """

    def __init__(self, total: Optional[int], desc: str, unit: str = "it", *,
                 enabled: Optional[bool] = None, unit_scale: bool = False,
                 leave: bool = True, file: Optional[IO[str]] = None,
                 interval: Optional[float] = None,
                 clock: Callable[[], float] = time.monotonic,
                 tty: Optional[bool] = None, initial: int = 0) -> None:
        self.total, self.desc, self.unit, self.unit_scale = total, desc, unit, unit_scale
        self.file = file if file is not None else sys.stderr
        # (print(file=None) would write to stdout, into a command's --json output)
        self.enabled = is_enabled(enabled) and self.file is not None
        self.interval = _interval() if interval is None else float(interval)
        if not (math.isfinite(self.interval) and self.interval >= 0):
            raise ValueError(f"interval must be a finite number >= 0, got {interval!r}")
        self.clock = clock
        self.n, self.postfix, self.lines = int(initial), "", 0
        self._n0 = self.n
        self.t0 = self.last = clock()
        self._bar = None
        if self.enabled and (_isatty(self.file) if tty is None else tty):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale,
                             leave=leave, file=self.file, dynamic_ncols=True,
                             initial=self.n)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done; print a line if ``interval`` has passed."""
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and (self.total is None or self.n < self.total):
            now = self.clock()  # (a finished stage gets its closing line instead)
            if now - self.last >= self.interval:
                self.last = now
                self._line(now)

    def set_postfix(self, text: str) -> None:
        """Extra text after the counts (e.g. ``"7,688 tok/s"``)."""
        self.postfix = text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        """End the stage (a closing line if it lasted at least ``interval``)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled:
            now = self.clock()
            if self.lines or now - self.t0 >= self.interval:
                self._line(now, final=True)
        self.enabled = False

    def _count(self, n: float) -> str:
        if self.unit_scale:
            from tqdm import tqdm

            return tqdm.format_sizeof(n, self.unit)
        return f"{int(n):,}"

    def _line(self, now: float, final: bool = False) -> None:
        elapsed = max(now - self.t0, 1e-9)
        rate = (self.n - self._n0) / elapsed
        unit = "" if self.unit_scale else f" {self.unit}s"
        done = self._count(self.n) if self.total is None else \
            f"{self._count(self.n)}/{self._count(self.total)}{unit}"
        parts = [f"{self.desc}: {done}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        speed = f"{self._count(rate)}/s" if self.unit_scale else f"{rate:,.1f}{unit}/s"
        if final:
            parts.append(f"done in {_duration(elapsed)}, {speed}")
        else:
            parts += [speed, f"elapsed {_duration(elapsed)}"]
            if self.total and rate > 0:
                parts.append(f"ETA {_duration(max(self.total - self.n, 0) / rate)}")
        if self.postfix:
            parts.append(self.postfix)
        try:
            print(", ".join(parts), file=self.file, flush=True)
        except (OSError, ValueError):  # stderr closed or gone: the job goes on, silently
            self.enabled = False
            return
        self.lines += 1
