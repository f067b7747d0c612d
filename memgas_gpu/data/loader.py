"""``load_dataset``: one entry point for every supported source format."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional, Union

from ..errors import DataFormatError
from ..progress import Progress
from ._jsonscan import BOM, check_json_file
from .locomo import flat_default_id, parse_locomo_record
from .longmemeval import SessionInterner, iter_longmemeval
from .longmtbench import parse_longmtbench_record
from .model import Conversation, Dataset
from .._io import JSONLimitError, find_surrogate, json_loads
from ._validate import RecordContext, one_line

__all__ = ["load_dataset", "detect_format", "FORMATS"]

FORMATS = ("longmemeval", "locomo", "locomo_flat", "longmtbench")
_EMPTY = ("error", "keep", "drop")

# first decisive key of the first record → format
_KEY_FORMAT = {
    "question_id": "longmemeval", "haystack_sessions": "longmemeval",
    "haystack_session_ids": "longmemeval", "question_type": "longmemeval",
    "sample_id": "locomo", "conversation": "locomo", "qa": "locomo",
    "conversation_id": "longmtbench", "questions": "longmtbench", "sessions": "longmtbench",
    "speaker_a": "locomo_flat", "session_1": "locomo_flat",
}


def _open_json(path: Path):
    """Open ``path`` for reading bytes, past a UTF-8 byte-order mark if it has one."""
    f = open(path, "rb")
    if f.read(len(BOM)) != BOM:
        f.seek(0)
    return f


def _first_char(path: Path) -> str:
    with _open_json(path) as f:
        while True:
            chunk = f.read(4096)
            if not chunk:
                return ""
            s = chunk.lstrip()
            if s:
                return chr(s[0])


def detect_format(path: Union[str, os.PathLike]) -> str:
    """Guess the format of a JSON file from its first record's keys (streaming)."""
    import ijson

    path = Path(path)
    first = _first_char(path)
    if first not in "[{":
        raise DataFormatError(str(path), "not a JSON list or object: unknown format "
                              f"(supported: {', '.join(FORMATS)})")
    prefix = "item" if first == "[" else ""
    with _open_json(path) as f:
        try:
            # use_float: yajl parses integers itself (int64, "integer overflow" beyond);
            # the default Decimal mode converts each in Python, unchecked (a crash)
            for pfx, event, value in ijson.parse(f, use_float=True):
                if event == "map_key" and pfx == prefix:
                    if value in _KEY_FORMAT:
                        fmt = _KEY_FORMAT[value]
                        if first == "{" and fmt == "locomo":
                            fmt = "locomo_flat"
                        return fmt
                elif event == "end_map" and pfx == prefix:
                    break
        except ijson.JSONError as e:
            raise DataFormatError(str(path), f"invalid or truncated JSON ({one_line(e)})") \
                from None
        except UnicodeDecodeError as e:
            raise DataFormatError(str(path), f"not UTF-8 text ({e.reason})") from None
    raise DataFormatError(str(path), "unknown format: no field identifies it as one of "
                          f"{', '.join(FORMATS)} (pass format=...)")


def _load_json(path: Path):
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


def _records(path: Path, data, fmt: str) -> list:
    if fmt == "locomo_flat":
        if isinstance(data, list):  # a list of flat records is accepted too
            return data
        return [data]
    if not isinstance(data, list):
        raise DataFormatError(str(path), f"expected a JSON list of records for {fmt}, "
                              f"got {type(data).__name__}")
    return data


def _load_file(path: Path, fmt: str, empty_sessions: str, user_only: bool,
               interner: SessionInterner, progress: bool) -> list[Conversation]:
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise DataFormatError(str(path), f"unknown format {fmt!r} (supported: auto, "
                              f"{', '.join(FORMATS)})")
    if fmt == "longmemeval":
        if _first_char(path) != "[":
            raise DataFormatError(str(path), "expected a JSON list of LongMemEval instances")
        bar = Progress(path.stat().st_size, f"load {path.name}", unit="B", unit_scale=True,
                       leave=False, enabled=bool(progress))
        with _open_json(path) as f, bar:
            last = [0]

            def tick(pos: int) -> None:
                bar.update(pos - last[0])
                last[0] = pos

            return list(iter_longmemeval(f, str(path), interner=interner,
                                         empty_sessions=empty_sessions,
                                         user_only=user_only, on_record=tick))
    data = _load_json(path)
    out = []
    for i, rec in enumerate(_records(path, data, fmt)):
        ctx = RecordContext(str(path), i)
        bad = find_surrogate(rec)
        if bad is not None:
            raise ctx.error("a lone UTF-16 surrogate escape (not valid Unicode text)", bad)
        if fmt == "longmtbench":
            out.append(parse_longmtbench_record(ctx, rec, empty_sessions))
        else:
            flat = fmt == "locomo_flat"
            out.append(parse_locomo_record(ctx, rec, flat=flat,
                                           default_id=flat_default_id(path) if flat else "",
                                           empty_sessions=empty_sessions))
    return out


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
            list layout), ``"locomo_flat"`` (one conversation per file) or
            ``"longmtbench"``.
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
    interner = SessionInterner()
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
        fmt = detect_format(f) if format == "auto" else format
        formats.add(fmt)
        convs += _load_file(f, fmt, empty_sessions, user_only, interner, progress)
    seen = set()
    for c in convs:
        if c.id in seen:
            raise DataFormatError(str(path), f"duplicate conversation id {c.id!r}")
        seen.add(c.id)
    if not convs:
        raise DataFormatError(str(path), "no conversations: nothing to index or evaluate")
    fmt_name = formats.pop() if len(formats) == 1 else "+".join(sorted(formats))
    ds = Dataset(convs, format=fmt_name.replace("locomo_flat", "locomo"),
                 source=str(path))
    if conversations is not None or exclude is not None:
        ds = ds.select(conversations, exclude)
        if not len(ds):
            raise ValueError(f"{path}: the selection keeps no conversation")
    return ds
