"""Small field checkers shared by the loaders; every error names file, record, field."""
from __future__ import annotations

from typing import Any, Optional, Union

from ..errors import DataFormatError

_TYPE_NAMES = {list: "a list", dict: "an object", str: "a string"}


class RecordContext:
    """Where we are in a file, so errors can name it."""

    def __init__(self, path: str, record: Optional[Union[int, str]] = None,
                 record_id: Optional[str] = None) -> None:
        self.path = path
        self.record = record
        self.record_id = record_id

    def error(self, message: str, field: Optional[str] = None) -> DataFormatError:
        return DataFormatError(self.path, message, record=self.record,
                               record_id=self.record_id, field=field)

    def get(self, obj: dict, key: str, typ: Any = None, *, field: Optional[str] = None,
            optional: bool = False, default: Any = None) -> Any:
        """``obj[key]`` checked for presence and type (``typ`` a type or tuple)."""
        name = field or key
        if not isinstance(obj, dict):
            raise self.error(f"expected an object, got {type(obj).__name__}", name)
        if key not in obj or (optional and obj[key] is None):
            if optional:
                return default
            raise self.error("missing required field", name)
        value = obj[key]
        if typ is not None and not isinstance(value, typ):
            want = (_TYPE_NAMES.get(typ, getattr(typ, "__name__", str(typ)))
                    if not isinstance(typ, tuple)
                    else " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in typ))
            raise self.error(f"expected {want}, got {type(value).__name__}", name)
        return value


def as_text(value: Any) -> str:
    """Answers may be numbers or lists in the sources; keep them as strings."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def one_line(error: Any) -> str:
    """A parser's message on one line (yajl's span several, with a caret)."""
    return " ".join(str(error).split())
