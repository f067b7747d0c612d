"""Text that comes from data (ids, question types, turn texts of an index) shown safely
on a terminal or in a log.

An id is data: a hostile file or index can hold terminal escape sequences
(``"\\x1b[2J"`` clears the screen, ``"\\x1b]0;...\\x07"`` retitles the window), a newline
that forges a row of a table, or a bidi override that shows text reversed.
:func:`safe_text` escapes those characters the way ``repr`` does (``\\x1b``, ``\\n``,
``\\u202e``) and leaves every other character, any script, as it is.
"""
from __future__ import annotations

import re

__all__ = ["safe_text", "safe_json"]

# C0 controls, DEL, C1 controls, bidi marks/embeddings/overrides/isolates, line and
# paragraph separators, lone surrogates (not text; stdout cannot even encode them)
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")
# what json.dumps(..., ensure_ascii=False) leaves raw (it escapes C0 itself; the C0
# characters left in its output are its own indentation and newlines)
_UNSAFE_JSON = re.compile(f"[\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")


def _escape(m: re.Match) -> str:
    return repr(m.group())[1:-1]


def safe_text(value) -> str:
    """``str(value)`` with control characters, bidi controls, line separators and lone
    surrogates escaped as ``repr`` writes them (``"a\\nb"`` → ``a\\nb``, one line);
    ordinary text in any script is unchanged."""
    return _UNSAFE.sub(_escape, str(value))


def safe_json(text: str) -> str:
    """A JSON document written with ``ensure_ascii=False`` with the characters it
    leaves raw that a terminal acts on (DEL, C1 controls, bidi controls, line
    separators, lone surrogates) written as ``\\uXXXX`` escapes: the same JSON value,
    and still readable in any script."""
    return _UNSAFE_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
