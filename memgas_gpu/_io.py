"""Atomic file output: write to a temporary sibling, then rename."""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator, Optional, Union

__all__ = ["atomic_write", "atomic_dir", "fsync_dir", "iter_jsonl", "nan_to_null", "find_surrogate",
           "replace_surrogates", "may_hold_surrogate", "MAX_NUMBER_DIGITS", "JSONLimitError", "json_loads"]

#: longest integer literal (and longest run of digits in any number) accepted in JSON
#: input: an int64 needs 19 digits.  Python refuses to convert more than 4,300 digits
#: (a ``ValueError`` that ``json`` does not wrap), and ijson's C backend crashes on them.
MAX_NUMBER_DIGITS = 100


class JSONLimitError(ValueError):
    """JSON input holding a number this package refuses to parse (see :func:`json_loads`)."""


def _parse_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_NUMBER_DIGITS:
        raise JSONLimitError(f"an integer of {digits} digits (at most {MAX_NUMBER_DIGITS} "
                             "are accepted)")
    return int(text)


def _parse_constant(name: str):
    raise JSONLimitError(f"{name} is not a JSON number")


def json_loads(data: Union[str, bytes]) -> Any:
    """``json.loads`` of untrusted input: integers of at most :data:`MAX_NUMBER_DIGITS`
    digits, and no ``NaN``/``Infinity`` (not JSON, although Python writes them).

    Raises:
        json.JSONDecodeError: invalid JSON.
        JSONLimitError: a number outside those limits.
        RecursionError: nesting too deep for the parser.
    """
    import json

    return json.loads(data, parse_int=_parse_int, parse_constant=_parse_constant)


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


def fsync_dir(path: Union[str, os.PathLike], *, strict: bool = False) -> None:
    """Make the entries of the folder ``path`` durable (files created, renamed or
    removed in it) by an fsync of the folder itself.

    A failure is ignored by default (a platform or file system that cannot sync a
    folder); ``strict=True`` raises it, for a caller that promises durability (the
    write-ahead log of :mod:`memgas_gpu.storage.log`).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(fd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_dir(path: Union[str, os.PathLike]) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; move it onto ``path`` on success.

    An existing ``path`` is replaced only after the new one is complete, but by two
    renames (old away, new in): a kill between them leaves no ``path`` (the old one
    survives as ``.NAME.old``) and a concurrent reader may miss it. Index folders use
    the commits of :mod:`memgas_gpu.storage.commit` instead.
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
                obj = json_loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(str(path), f"invalid JSON ({e.msg})",
                                      record=f"line {lineno}") from None
            except (JSONLimitError, RecursionError) as e:
                what = str(e) if isinstance(e, JSONLimitError) else "nested too deeply"
                raise DataFormatError(str(path), f"invalid JSON ({what})",
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


_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def may_hold_surrogate(json_text: str) -> bool:
    """Whether JSON text can decode to a string holding a lone UTF-16 surrogate (it has
    a raw surrogate or a ``\\uD800``-``\\uDFFF`` escape): one C-speed scan that spares
    the :func:`find_surrogate` walk of everything else."""
    return bool(_SURROGATE.search(json_text) or _ESCAPED_SURROGATE.search(json_text))


def replace_surrogates(text: str) -> str:
    """``text`` with every lone UTF-16 surrogate (``"\\ud800"`` parses as JSON but
    cannot be encoded as UTF-8) replaced by U+FFFD, the replacement character."""
    return _SURROGATE.sub("\ufffd", text)


def find_surrogate(value: Any, where: str = "") -> Optional[str]:
    """The path (``qa[3].answer``) of the first string in ``value`` holding a lone UTF-16
    surrogate (``"\\udfff"`` parses but cannot be encoded as UTF-8), else None."""
    if isinstance(value, str):
        return (where or "(value)") if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            name = f"{where}.{k}" if where else str(k)
            if _SURROGATE.search(k):
                return name
            found = find_surrogate(v, name)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = find_surrogate(v, f"{where}[{i}]")
            if found is not None:
                return found
    return None

