"""``load_dataset``: one entry point for every supported source format.

The formats are a registry (:mod:`memgas_gpu.data.formats`): each format module
registers its name, the keys that identify it and its loader; this module imports the
built-in ones and knows no format itself.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Union

from ..errors import DataFormatError
from . import longmemeval, locomo, longmtbench  # noqa: F401  (register, in this order)
from ._jsonscan import check_json_file
from ._validate import one_line
from .formats import LoadOptions, dataset_format, detection_keys, first_char, format_names, \
    open_json
from .longmemeval import SessionInterner
from .model import Conversation, Dataset

__all__ = ["load_dataset", "detect_format", "FORMATS"]

#: the built-in formats (:func:`memgas_gpu.data.formats.format_names` lists any added)
FORMATS = format_names()
_EMPTY = ("error", "keep", "drop")


def detect_format(path: Union[str, os.PathLike]) -> str:
    """Guess the format of a JSON file from its first record's keys (streaming)."""
    import ijson

    path = Path(path)
    first = first_char(path)
    if first not in "[{":
        raise DataFormatError(str(path), "not a JSON list or object: unknown format "
                              f"(supported: {', '.join(format_names())})")
    prefix = "item" if first == "[" else ""
    keys = detection_keys()
    with open_json(path) as f:
        try:
            # use_float: yajl parses integers itself (int64, "integer overflow" beyond);
            # the default Decimal mode converts each in Python, unchecked (a crash)
            for pfx, event, value in ijson.parse(f, use_float=True):
                if event == "map_key" and pfx == prefix:
                    if value in keys:
                        fmt = keys[value]
                        if first == "{":
                            fmt = dataset_format(fmt).as_object or fmt
                        return fmt
                elif event == "end_map" and pfx == prefix:
                    break
        except ijson.JSONError as e:
            raise DataFormatError(str(path), f"invalid or truncated JSON ({one_line(e)})") \
                from None
        except UnicodeDecodeError as e:
            raise DataFormatError(str(path), f"not UTF-8 text ({e.reason})") from None
    raise DataFormatError(str(path), "unknown format: no field identifies it as one of "
                          f"{', '.join(format_names())} (pass format=...)")


def _sort_key(p: Path):
    return (0, int(p.stem), "") if p.stem.isdigit() else (1, 0, p.name)


def load_dataset(path: Union[str, os.PathLike], format: str = "auto", *,
                 empty_sessions: str = "error", user_only: bool = False,
                 progress: bool = False, conversations: Optional[Iterable[str]] = None,
                 exclude: Optional[Iterable[str]] = None) -> Dataset:
    """Load any supported dataset into the internal model.

    Args:
        path: a JSON file, or a folder of JSON files (e.g. LoCoMo flat files).
        format: ``"auto"`` (default: detected from the first record's keys),
            ``"longmemeval"`` (s, m and oracle; streamed), ``"locomo"`` (the official
            list layout), ``"locomo_flat"`` (one conversation per file),
            ``"longmtbench"``, or a format added with
            :func:`~memgas_gpu.data.formats.register_format`.
        empty_sessions: what to do with a session without messages: ``"error"``
            (default), ``"keep"`` or ``"drop"``.
        user_only: LongMemEval only: index user messages only (the LongMemEval
            harness's baselines); MemGAS indexes both roles (default False).
        progress: report progress while streaming large files (a bar on a terminal,
            plain lines in a log; see :mod:`memgas_gpu.progress`).
        conversations: keep only these conversation ids (LoCoMo ``sample_id``,
            LongMemEval ``question_id``, …), in file order.
        exclude: drop these conversation ids (e.g. LoCoMo's dev conversations, to
            evaluate on the held-out ones). See :meth:`Dataset.select`.

    Returns:
        A :class:`Dataset`; sessions recurring across conversations with the same
        id and content are one shared object. A session listed twice in one
        LongMemEval haystack with the same content is kept once (a warning is logged).

    Raises:
        DataFormatError: naming the file, the record and the field; also for JSON
            nested deeper than 64 levels (found by a bounded pre-scan, before any
            parser), text that is not UTF-8 or holds lone surrogates, a file that is
            not a regular file, a session id used twice with different content, and
            data without conversations. See ``docs/failure.md``.
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if ``conversations`` or ``exclude`` names an id the data lacks.
    """
    if empty_sessions not in _EMPTY:
        raise ValueError(f"empty_sessions must be one of {_EMPTY}, got {empty_sessions!r}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    if not path.is_dir() and not path.is_file():
        raise DataFormatError(str(path), "not a regular file or folder")
    opts = LoadOptions(empty_sessions, user_only, progress, SessionInterner())
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if p.suffix == ".json" and p.is_file()),
                       key=_sort_key)
        if not files:
            raise DataFormatError(str(path), "folder holds no .json files")
    else:
        files = [path]
    convs: list[Conversation] = []
    formats = set()
    for f in files:
        check_json_file(f)  # bounded memory on hostile nesting, before any parser runs
        fmt = dataset_format(detect_format(f) if format == "auto" else format, str(f))
        formats.add(fmt.family or fmt.name)
        convs += fmt.load(f, opts)
    seen = set()
    for c in convs:
        if c.id in seen:
            raise DataFormatError(str(path), f"duplicate conversation id {c.id!r}")
        seen.add(c.id)
    if not convs:
        raise DataFormatError(str(path), "no conversations: nothing to index or evaluate")
    fmt_name = formats.pop() if len(formats) == 1 else "+".join(sorted(formats))
    ds = Dataset(convs, format=fmt_name, source=str(path))
    if conversations is not None or exclude is not None:
        ds = ds.select(conversations, exclude)
        if not len(ds):
            raise ValueError(f"{path}: the selection keeps no conversation")
    return ds
