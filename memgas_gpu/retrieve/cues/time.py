"""The time cue: a question's date expression against its conversation's session dates.

Absolute expressions in the question ("on 7 July, 2023", "May 23, 2023", "in August
2023", "in 2022", "in June") become a day interval; a month or day without a year takes
the latest such date not after the anchor (the question's date, else the
conversation's last session).  Relative ones ("last week", "3 days ago", "yesterday",
"last year") need the question's date (LongMemEval has one, LoCoMo does not) and are
skipped without it.  The cue is 1 for a session dated inside the interval, else 0; the
read path adds it to the fused scores, weighted by ``ReadParams.time_beta``.
:func:`time_cue` is its compute function in the signal registry
(:mod:`memgas_gpu.retrieve.signals`); session dates are the view's, parsed when the
sessions were written (:mod:`.dates`).
"""
from __future__ import annotations

from datetime import date, timedelta
from typing import Sequence

import torch
from torch import Tensor

from ...ops.time_affinity import time_affinity
from .dates import parse_date, question_interval

__all__ = ["time_cue", "time_affinity_of"]

_EPOCH = date(1970, 1, 1)


def time_affinity_of(view, texts: Sequence[str], dates, layout) -> Tensor:
    """``[Q, N_max]`` time cue of queries ``texts`` (asked on ``dates``, entries may be
    None) laid out on ``view`` as ``layout`` (:class:`~memgas_gpu.retrieve.signals.Layout`):
    1 where the session's date is inside the query's interval, else 0."""
    days = view.session_days()
    latest = view.latest_days()
    conv = layout.conv.tolist()
    start, end = [], []
    for j, text in enumerate(texts):
        qd = parse_date(dates[j]) if dates is not None and dates[j] else None
        last = latest[conv[j]]
        anchor = None if last != last else _EPOCH + timedelta(days=int(last))
        iv = question_interval(text, anchor=anchor, question_date=qd)
        start.append(iv[0] if iv else float("nan"))
        end.append(iv[1] if iv else float("nan"))
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    sd = torch.where(layout.valid, days[layout.rows], nan)
    f = torch.float64
    return time_affinity(torch.tensor(start, dtype=f), torch.tensor(end, dtype=f), sd,
                         layout.valid)


def time_cue(ctx, names: Sequence[str]) -> dict:
    """The registry's ``time`` cue of the queries of ``ctx`` (0 without query texts)."""
    b = ctx.batch
    if b.q_text is None:
        got = torch.zeros(len(b), ctx.layout.n_max, dtype=torch.float64)
    else:
        got = time_affinity_of(ctx.view, b.q_text, b.q_date, ctx.layout)
    return {"time": got.to(ctx.device)}
