"""The dataset formats :func:`~memgas_gpu.data.load_dataset` reads: one registry, by name.

A format is a :class:`DatasetFormat`: its name, the keys of a first record that
identify it (format detection), and the function that loads one file.  A new format
is one file that parses its records and registers itself::

    from memgas_gpu.data.formats import DatasetFormat, json_records, register_format

    def parse_my_record(ctx, rec, path, opts):      # -> memgas_gpu.data.Conversation
        ...

    register_format(DatasetFormat("my_format", json_records(parse_my_record),
                                  keys=("my_conversation_id",)))

Once that module is imported, ``load_dataset(path)`` detects and loads the format and
``load_dataset(path, format="my_format")`` names it (the built-in formats are
registered by :mod:`memgas_gpu.data.loader`, which imports their modules).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .._io import JSONLimitError, find_surrogate, json_loads
from ..errors import DataFormatError
from ._jsonscan import BOM
from ._validate import RecordContext
from .model import Conversation

__all__ = ["LoadOptions", "DatasetFormat", "register_format", "dataset_format",
           "format_names", "detection_keys", "json_records", "open_json", "first_char"]


@dataclass(frozen=True)
class LoadOptions:
    """What :func:`~memgas_gpu.data.load_dataset` passes every format's loader.

    Attributes:
        empty_sessions: ``"error"``, ``"keep"`` or ``"drop"``.
        user_only: keep user messages only (formats with roles).
        progress: report progress while reading a large file.
        interner: shared-session table of the whole load (formats whose sessions recur
            across conversations and files: LongMemEval).
    """

    empty_sessions: str = "error"
    user_only: bool = False
    progress: bool = False
    interner: Any = None


@dataclass(frozen=True)
class DatasetFormat:
    """A dataset format.

    Attributes:
        name: what ``format=`` names it.
        load: ``load(path, options) -> list[Conversation]`` for one file.
        keys: keys of the first record that identify the format (detection).
        as_object: the format of a file holding one such record as a JSON object
            rather than a list of records (LoCoMo: ``locomo_flat``), if another.
        family: the name recorded as :attr:`Dataset.format` (default: ``name``).
    """

    name: str
    load: Callable[[Path, LoadOptions], list]
    keys: tuple = ()
    as_object: Optional[str] = None
    family: Optional[str] = None


_FORMATS: dict[str, DatasetFormat] = {}


def register_format(fmt: DatasetFormat) -> DatasetFormat:
    """Add ``fmt`` to the registry (a name or detection key taken by another format is
    refused)."""
    if not isinstance(fmt, DatasetFormat):
        raise TypeError(f"expected a DatasetFormat, got {type(fmt).__name__}")
    if fmt.name in ("", "auto") or fmt.name in _FORMATS:
        raise ValueError(f"dataset format name {fmt.name!r} is taken")
    taken = detection_keys()
    clash = [k for k in fmt.keys if k in taken]
    if clash:
        raise ValueError(f"format {fmt.name!r}: detection key(s) {clash} already identify "
                         f"{taken[clash[0]]!r}")
    _FORMATS[fmt.name] = fmt
    return fmt


def dataset_format(name: str, path: str = "") -> DatasetFormat:
    """The registered format ``name``; :class:`DataFormatError` naming ``path`` and the
    supported formats otherwise."""
    fmt = _FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise DataFormatError(path, f"unknown format {name!r} (supported: auto, "
                              f"{', '.join(_FORMATS)})")
    return fmt


def format_names() -> tuple:
    """Names of the registered formats, in registration order."""
    return tuple(_FORMATS)


def detection_keys() -> dict:
    """First-record key → the name of the format it identifies."""
    return {k: f.name for f in _FORMATS.values() for k in f.keys}


# ---------------------------------------------------------------- JSON helpers
def open_json(path: Path):
    """Open ``path`` for reading bytes, past a UTF-8 byte-order mark if it has one."""
    f = open(path, "rb")
    if f.read(len(BOM)) != BOM:
        f.seek(0)
    return f


def first_char(path: Path) -> str:
    """The first non-blank character of a JSON file (``""`` for an empty file)."""
    with open_json(path) as f:
        while True:
            chunk = f.read(4096)
            if not chunk:
                return ""
            s = chunk.lstrip()
            if s:
                return chr(s[0])


def _load_json(path: Path):
    """The file's JSON (integers of at most 100 digits, no NaN / Infinity)."""
    try:
        with open(path, "rb") as f:
            return json_loads(f.read())
    except JSONLimitError as e:
        raise DataFormatError(str(path), f"invalid JSON: {e}") from None
    except json.JSONDecodeError as e:
        raise DataFormatError(str(path), f"invalid or truncated JSON: {e.msg} at line "
                              f"{e.lineno} column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise DataFormatError(str(path), f"not UTF-8 text ({e.reason})") from None


def json_records(parse: Callable[[RecordContext, Any, Path, LoadOptions], Conversation], *,
                 one_object: bool = False) -> Callable[[Path, LoadOptions], list]:
    """A loader for a JSON list of records, each parsed by
    ``parse(ctx, record, path, options)`` (``ctx`` names the file and record in errors).

    ``one_object``: a file may also hold one record as a JSON object.  A record with a
    lone UTF-16 surrogate escape is refused before ``parse`` sees it.
    """
    def load(path: Path, opts: LoadOptions) -> list:
        data = _load_json(path)
        if isinstance(data, dict) and one_object:
            data = [data]
        if not isinstance(data, list):
            raise DataFormatError(str(path), "expected a JSON list of records, got "
                                  f"{type(data).__name__}")
        out = []
        for i, rec in enumerate(data):
            ctx = RecordContext(str(path), i)
            bad = find_surrogate(rec)
            if bad is not None:
                raise ctx.error("a lone UTF-16 surrogate escape (not valid Unicode text)", bad)
            out.append(parse(ctx, rec, path, opts))
        return out
    return load
