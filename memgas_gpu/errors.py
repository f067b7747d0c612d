"""Errors with enough context to find the bad record."""
from __future__ import annotations

from typing import Optional, Union

__all__ = ["DataFormatError", "MemgasError"]


class MemgasError(Exception):
    """Base class of memgas_gpu errors that the CLI reports without a traceback."""


class DataFormatError(MemgasError, ValueError):
    """A malformed input file.

    The message names the file, the record (index and/or id) and the field, e.g.
    ``data.json: record 3 (id 'q7'): field 'haystack_sessions': expected a list, got str``.
    """

    def __init__(
        self,
        path: str,
        message: str,
        *,
        record: Optional[Union[int, str]] = None,
        record_id: Optional[str] = None,
        field: Optional[str] = None,
    ) -> None:
        self.path = str(path)
        self.record = record
        self.record_id = record_id
        self.field = field
        parts = [self.path]
        if record is not None or record_id is not None:
            r = "record"
            if record is not None:
                r += f" {record}"
            if record_id is not None:
                r += f" (id {record_id!r})"
            parts.append(r)
        if field is not None:
            parts.append(f"field {field!r}")
        parts.append(message)
        super().__init__(": ".join(parts))
