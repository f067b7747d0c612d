"""Dates of sessions and questions: parsed once, kept as days since 1970-01-01.

Session timestamps and the spans a regex finds in a question are parsed with
``python-dateutil`` (``dateutil.parser``): it reads the timestamps of every source here
("1:56 pm on 8 May, 2023", "2023/05/20 (Sat) 02:21") without a format string.
``dateparser`` / ``parsedatetime`` would add relative phrases, but LoCoMo has no question
date to anchor them, and dateutil is small.  A memory parses a session's date once,
when the session is written (:func:`session_days`), and keeps it with the
conversation's segment: a read never parses a session date again.
"""
from __future__ import annotations

import calendar
import functools
import re
from datetime import date, datetime, timedelta
from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["parse_date", "days_since_epoch", "question_interval", "session_days"]

_EPOCH = date(1970, 1, 1)
_MONTHS = "|".join(calendar.month_name[1:]) + "|" + "|".join(
    m for m in calendar.month_abbr[1:] if m != "May")
_DAY = r"(?:\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?:19|20)\d\d"
_PATTERNS = [  # (regex, granularity), most specific first
    (rf"\b{_DAY}\s+(?:{_MONTHS})\.?,?\s+{_YEAR}\b", "day"),
    (rf"\b(?:{_MONTHS})\.?\s+{_DAY},?\s+{_YEAR}\b", "day"),
    (rf"\b(?:{_MONTHS})\.?,?\s+{_YEAR}\b", "month"),
    (rf"\b{_DAY}\s+(?:{_MONTHS})\b", "day_noyear"),
    (rf"\b(?:{_MONTHS})\s+{_DAY}\b", "day_noyear"),
    (rf"\b(?:in|during|of|since)\s+{_YEAR}\b", "year"),
    (rf"\b(?:in|during)\s+(?:{_MONTHS})\b", "month_noyear"),
]
#: cheap test first: without a month name or a year no absolute pattern can match
_ANY = re.compile(rf"\b(?:{_MONTHS}|{_YEAR})\b", re.I)
_RELATIVE = [
    (r"\byesterday\b", 1, 1), (r"\blast\s+week(?:end)?\b", 14, 0),
    (r"\blast\s+month\b", 62, 0), (r"\blast\s+year\b", 730, 0),
]
_AGO = re.compile(r"\b(\d+|a|an|one|two|three|four|five|six)\s+(day|week|month|year)s?\s+ago\b",
                  re.I)
_NUM = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_UNIT = {"day": 1, "week": 7, "month": 30, "year": 365}


@functools.lru_cache(maxsize=1 << 16)
def parse_date(text: str) -> Optional[date]:
    """A timestamp string → its date (``None`` when empty or unreadable).  Remembered per
    string (the question dates of a batch repeat)."""
    from dateutil import parser

    if not isinstance(text, str) or not text or not text.strip():
        return None
    try:
        return parser.parse(text, fuzzy=True).date()
    except (ValueError, OverflowError):
        return None


def days_since_epoch(d: date) -> float:
    return float((d - _EPOCH).days)


def question_interval(text: str, anchor: Optional[date] = None,
                      question_date: Optional[date] = None) -> Optional[tuple[float, float]]:
    """``(start, end)`` in days since 1970-01-01 of the question's first time expression,
    or ``None``.  ``anchor`` resolves year-less dates; ``question_date`` also enables
    relative expressions (it is the anchor when given)."""
    from dateutil import parser

    anchor = question_date or anchor
    if question_date is None and not _ANY.search(text):
        return None
    for pat, gran in _PATTERNS:
        m = re.search(pat, text, re.I if gran not in ("month_noyear",) else 0)
        if not m:
            continue
        span = re.sub(r"^(in|during|of|since)\s+", "", m.group(0), flags=re.I)
        span = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", span)
        if gran == "year":
            y = int(span)
            return days_since_epoch(date(y, 1, 1)), days_since_epoch(date(y, 12, 31))
        if gran.endswith("noyear") and anchor is None:
            continue
        ref = datetime(anchor.year if anchor else 2000, 1, 1)
        try:
            d = parser.parse(span, default=ref).date()
        except (ValueError, OverflowError):
            continue
        if gran.endswith("noyear") and d > anchor:
            try:  # year 1 has no year before it; 29 February may not exist in it
                d = d.replace(year=d.year - 1)
            except ValueError:
                continue
        if gran.startswith("month"):
            last = calendar.monthrange(d.year, d.month)[1]
            return days_since_epoch(d.replace(day=1)), days_since_epoch(d.replace(day=last))
        return days_since_epoch(d), days_since_epoch(d)
    if question_date is None:
        return None
    q = question_date
    try:  # OverflowError: an interval before year 1 or after 9999
        for pat, back, fwd in _RELATIVE:
            if re.search(pat, text, re.I):
                return days_since_epoch(q - timedelta(days=back)), days_since_epoch(q - timedelta(days=fwd))
        m = _AGO.search(text)
        if m:
            g = m.group(1).lower()
            n = int(g) if g.isdigit() else _NUM[g]
            back = n * _UNIT[m.group(2).lower()]
            slack = max(2, back // 4)
            return (days_since_epoch(q - timedelta(days=back + slack)),
                    days_since_epoch(q - timedelta(days=back - slack)))
    except OverflowError:
        return None
    return None


def session_days(dates: Sequence[str]) -> Tensor:
    """``[len(dates)]`` float64 days since 1970-01-01 of each session date (NaN: empty or
    unreadable)."""
    out = [parse_date(d) for d in dates]
    return torch.tensor([days_since_epoch(d) if d else float("nan") for d in out],
                        dtype=torch.float64)
