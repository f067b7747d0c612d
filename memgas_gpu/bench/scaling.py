"""Observed complexity: log-log slopes of time against size, next to the expected ones."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from .timing import Record

__all__ = ["EXPECTED", "fit_slope", "scaling_rows", "sweep_series"]

#: (stage, axis) -> (expected exponent, why). Axis "sessions": one haystack of N
#: sessions (n = 4N nodes); axis "haystacks": C haystacks of fixed N, one question each.
EXPECTED = {
    ("graph", "sessions"): (2.0, "O(n^2 d) per conversation: each node vs all earlier "
                                 "nodes (the reference shows ~1 while its per-node "
                                 "GMM fit, a constant, dominates)"),
    ("graph", "haystacks"): (1.0, "O(C n^2 d): conversations are independent"),
    ("query", "sessions"): (1.0, "O(Q N d) similarities + O(nnz iters) PPR, nnz ~ N"),
    ("query", "haystacks"): (1.0, "O(Q N d + nnz iters) with Q ~ C and nnz ~ C N"),
    ("bm25", "sessions"): (1.0, "postings touched ~ N"),
    ("bm25", "haystacks"): (1.0, "postings touched ~ Q ~ C"),
}


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (NaN with < 2 usable points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len({p[0] for p in pts}) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def sweep_series(records: Iterable[Record]) -> dict:
    """``{(stage, axis, impl): [(x, seconds, record), ...]}`` sorted by x."""
    out: dict = {}
    for r in records:
        if not r.sweep or r.sweep not in r.size:
            continue
        out.setdefault((r.stage, r.sweep, r.impl), []).append((r.size[r.sweep], r.seconds, r))
    for v in out.values():
        v.sort(key=lambda t: t[0])
    return out


def scaling_rows(records: Iterable[Record]) -> list[dict]:
    """One row per (stage, axis, impl) sweep: sizes, times, fitted slopes, expectation.

    ``slope`` fits all points; ``slope_top`` uses the two largest sizes only (small
    sizes are dominated by fixed per-call overheads, so the top slope is the one to
    compare with the asymptotic exponent).
    """
    rows = []
    for (stage, axis, impl), pts in sorted(sweep_series(records).items()):
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        exp, why = EXPECTED.get((stage, axis), (float("nan"), ""))
        rows.append({
            "stage": stage, "axis": axis, "impl": impl, "sizes": xs, "seconds": ys,
            "slope": fit_slope(xs, ys), "slope_top": fit_slope(xs[-2:], ys[-2:]),
            "expected": exp, "why": why,
            "host_peak_bytes": [p[2].host_peak_bytes for p in pts],
            "device_peak_bytes": [p[2].device_peak_bytes for p in pts],
            "extrapolated": [p[2].note.startswith("extrapolated") for p in pts],
        })
    return rows
