"""A bounded pre-scan of a JSON file: nesting depth and number sizes, before any parser runs.

Parsers are not safe on hostile nesting: ``json`` recurses (``RecursionError`` at
~1000 levels) and ijson's prefix strings grow with depth, so a 200 KB file of nested
lists costs gigabytes.  :func:`check_json_file` reads the file once in fixed-size
chunks, strips string literals with one regular expression (C speed) and tracks the
bracket depth with numpy, so its memory is one chunk whatever the input; a file nested
deeper than :data:`MAX_DEPTH` fails with one line naming it.

Numbers are bounded the same way: a run of more than :data:`MAX_NUMBER_DIGITS` digits
outside strings fails here.  Python refuses to convert an integer of more than 4,300
digits, and ijson's C backend does not check that failure (its number callback passes
the NULL result on), so such a file killed the process with a segmentation fault.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from .._io import MAX_NUMBER_DIGITS
from ..errors import DataFormatError

__all__ = ["MAX_DEPTH", "BOM", "check_json_file"]

#: deepest nesting accepted (the supported formats need 6 at most)
MAX_DEPTH = 64
#: the UTF-8 byte-order mark some editors prepend; skipped
BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_LONG_NUMBER = re.compile(rb"[0-9]{%d,}" % (MAX_NUMBER_DIGITS + 1))


@functools.lru_cache(maxsize=None)
def _steps():
    """The bracket depth step of each byte: +1 opens, -1 closes."""
    import numpy as np

    out = np.zeros(256, np.int8)
    out[[ord("["), ord("{")]] = 1
    out[[ord("]"), ord("}")]] = -1
    return out


def check_json_file(path: Path, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`DataFormatError` if ``path`` nests deeper than ``max_depth`` or
    holds a number of more than :data:`~memgas_gpu._io.MAX_NUMBER_DIGITS` digits.

    Only the structure is checked here (brackets and digits outside strings); syntax
    errors are left to the parser, which reports them with a position.
    """
    import numpy as np  # here: importing the data model needs no numpy (mg.Client)

    steps_of = _steps()
    depth = 0
    carry = b""  # an unterminated string at the end of the previous chunk: '"' or '"\\'
    digits = b""  # the digits that ended the previous chunk (a number cut in two)
    offset = 0
    with open(path, "rb") as f:
        first = True
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            if first and chunk.startswith(BOM):
                chunk = chunk[len(BOM):]
                offset += len(BOM)
            first = False
            data = carry + chunk
            stripped = _STRING.sub(b" ", data)
            q = stripped.find(b'"')
            carry = b""
            if q >= 0:  # a string runs on into the next chunk
                tail = stripped[q:]
                n_bs = len(tail) - len(tail.rstrip(b"\\"))
                carry = b'"\\' if n_bs % 2 and len(tail) > 1 else b'"'
                stripped = stripped[:q] + b" "
            numbers = digits + stripped
            if _LONG_NUMBER.search(numbers):
                raise DataFormatError(str(path), f"a number of more than {MAX_NUMBER_DIGITS} "
                                      f"digits (within the first {offset + len(chunk)} bytes)"
                                      "; no supported format holds one")
            digits = numbers[len(numbers.rstrip(b"0123456789")):]
            if not stripped:
                offset += len(chunk)
                continue
            steps = steps_of[np.frombuffer(stripped, np.uint8)]
            if not steps.any():
                offset += len(chunk)
                continue
            levels = np.cumsum(steps, dtype=np.int32) + depth
            deepest = int(levels.max())
            if deepest > max_depth:
                raise DataFormatError(str(path), f"JSON nested more than {max_depth} levels "
                                      f"deep (within the first {offset + len(chunk)} bytes); "
                                      "no supported format nests like that")
            depth = max(int(levels[-1]), 0)  # below 0: invalid JSON, the parser says so
            offset += len(chunk)
