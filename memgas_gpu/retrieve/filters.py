"""What a session's metadata and date may be (checked when a session is added and when a
search filters by them)."""
from __future__ import annotations

from .._io import find_surrogate

__all__ = ["check_metadata", "check_date", "MAX_METADATA_KEYS", "MAX_METADATA_KEY",
           "MAX_METADATA_CHARS"]


#: metadata of one session: at most this many keys, each key at most this long, and at
#: most this many characters in all (a memory's metadata is for filtering, not storage)
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_CHARS = 64, 128, 16384


def check_metadata(metadata, what: str = "metadata") -> dict:
    """``metadata`` as stored (a copy), or a one-line refusal: a dict of string keys and
    values that are strings, integers, finite floats, booleans or None."""
    import json
    import math

    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"{what} must be a dict of str keys, got {type(metadata).__name__}")
    if len(metadata) > MAX_METADATA_KEYS:
        raise ValueError(f"{what}: {len(metadata)} keys, more than {MAX_METADATA_KEYS}")
    out = {}
    for k, v in metadata.items():
        if not isinstance(k, str) or not k or len(k) > MAX_METADATA_KEY:
            raise TypeError(f"{what}: keys must be non-empty strings of at most "
                            f"{MAX_METADATA_KEY} characters, got {k!r:.80}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{what}[{k!r}] must be finite, got {v!r}")
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise TypeError(f"{what}[{k!r}] must be a string, number, boolean or None, got "
                            f"{type(v).__name__}")
        out[k] = v
    bad = find_surrogate(out, what)
    if bad is not None:
        raise ValueError(f"{bad} holds a lone UTF-16 surrogate (not valid Unicode text)")
    if len(json.dumps(out, ensure_ascii=False)) > MAX_METADATA_CHARS:
        raise ValueError(f"{what} takes more than {MAX_METADATA_CHARS} characters as JSON")
    return out


def check_date(text: str, what: str) -> None:
    """Refuse a non-empty date python-dateutil cannot read (the time cue would ignore it
    without a word); ``""`` means unknown."""
    from .cues import parse_date

    if text.strip() and parse_date(text) is None:
        raise ValueError(f"{what} {text[:80]!r} is not a date python-dateutil reads (e.g. "
                         "'2024-05-01' or '1:56 pm on 8 May, 2023'; '' when unknown); "
                         "nothing was changed")
