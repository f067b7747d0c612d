"""Odd but valid inputs that crashed or cost too much (round 3 of the hostile-input
issue): dates near year 1 (item 8) and one huge message through the offline
summary/keyword stage (item 17)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from datetime import date

import pytest

from memgas_gpu.retrieve.cues import question_interval

from _hostile import ROOT, build_small_index, run_cli

_EPOCH = date(1970, 1, 1)


def _days(d: date) -> float:
    return float((d - _EPOCH).days)


# ---- item 8: dates near year 1 ------------------------------------------------------------
@pytest.mark.parametrize("text", ["what did we do last year", "what happened 3 days ago",
                                  "and yesterday?", "last week", "in March", "on May 5th",
                                  "1 day ago", "99999999999 days ago", "on February 29"])
@pytest.mark.parametrize("when", ["question_date_year_1", "anchor_year_1",
                                  "question_date_9999"])
def test_time_expressions_near_the_ends_of_the_calendar(text, when):
    """An interval that would start before year 1 (or end after 9999) is no interval;
    a year-less date after a year-1 anchor has no year before it."""
    q = {"question_date_year_1": date(1, 1, 10), "question_date_9999": date(9999, 12, 31)}
    got = question_interval(text, anchor=date(1, 1, 10) if when == "anchor_year_1" else None,
                            question_date=q.get(when))
    if text == "what happened 3 days ago" and when == "question_date_year_1":
        # hand-computed: 3 days back with a slack of 2 days each side
        assert got == (_days(date(1, 1, 5)), _days(date(1, 1, 9)))
    if text in ("in March", "on May 5th") and when != "question_date_9999":
        assert got is None  # the anchor's year (1) would put it after the anchor
    if text == "what did we do last year" and when == "question_date_year_1":
        assert got is None


def test_search_and_retrieve_with_year_1_dates(tmp_path, locomo_list_path):
    """`memgas search --date 0001/01/01` and a year-1 dataset with memgas_hybrid
    overflowed (OverflowError / ValueError tracebacks)."""
    from memgas_gpu.retrieve import retrieve

    idx = build_small_index(locomo_list_path, tmp_path)
    meta = idx.conversations[0]
    meta.session_dates = [f"0001/01/0{i + 1}" for i in range(len(meta.session_dates))]
    out = idx.save(tmp_path / "idx")
    res = run_cli("search", out, "what did we do last year", "and in March?",
                  "--conversation", meta.id, "--date", "0001/01/01", "--device", "cpu")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert [ln for ln in res.stdout.splitlines() if ln.startswith("? ")] == [
        "? what did we do last year", "? and in March?"]
    r = retrieve(idx, method="memgas_hybrid", device="cpu")
    assert r.rankings.shape[0] == len(idx.questions)
    (hit,) = idx.search(meta.id, ["what happened in March"], method="memgas_hybrid",
                        device="cpu")
    assert sorted(hit.session_ids) == sorted(meta.session_ids)  # k=10: all six
