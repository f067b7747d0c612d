"""Atomic file output: write to a temporary sibling, then rename."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Union

__all__ = ["atomic_write", "atomic_dir", "iter_jsonl", "nan_to_null"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: Union[str, os.PathLike], mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary file beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched, so a
    reader never sees a half-written output.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs follow the umask
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: Union[str, os.PathLike]) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; move it onto ``path`` on success.

    An existing ``path`` is replaced only after the new one is complete.
    """
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def iter_jsonl(path: Union[str, os.PathLike]) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of a JSON-lines file.

    Raises:
        DataFormatError: a line that is not JSON or not an object (names the line).
        FileNotFoundError: if ``path`` does not exist.
    """
    import json

    from .errors import DataFormatError

    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(str(path), f"invalid JSON ({e.msg})",
                                      record=f"line {lineno}") from None
            if not isinstance(obj, dict):
                raise DataFormatError(str(path), "expected an object", record=f"line {lineno}")
            yield lineno, obj


def nan_to_null(obj):
    """``obj`` with every NaN or infinite float replaced by None, for strict JSON.

    Used where a non-finite number means "no value" (an average over no question);
    write with ``json.dump(..., allow_nan=False)`` so that anything missed fails loudly
    instead of writing the invalid tokens ``NaN``/``Infinity``.
    """
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: nan_to_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nan_to_null(v) for v in obj]
    return obj
