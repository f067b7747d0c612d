"""Time affinity: how well each session's date fits a question's time interval.

1 inside ``[start, end + after]`` (people talk about an event on the day or after it,
not before), ``exp(-distance / tau)`` outside (``tau = 0``: 0 outside), batched over
every question.  The parsing that feeds it (question intervals and session dates) is in
:mod:`memgas_gpu.retrieve.cues`.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["time_affinity"]


def time_affinity(start: Tensor, end: Tensor, session_day: Tensor, valid: Tensor,
                  after: float = 0.0, tau: float = 0.0) -> Tensor:
    """``[Q, N]`` fit of each session's date to the question's interval.

    Args:
        start, end: ``[Q]`` interval of the question's time expression in days (any
            epoch, the same as ``session_day``); NaN where the question has none.
        session_day: ``[Q, N]`` date of each session in days (NaN: unknown).
        valid: ``[Q, N]`` bool.
        after: days after ``end`` still counted inside.
        tau: decay length in days outside the interval (0: hard 0/1).

    Returns:
        ``[Q, N]`` float32 in [0, 1]; 0 for questions without an interval, sessions
        without a date and padding.
    """
    s = start.double()[:, None]
    e = end.double()[:, None] + after
    d = session_day.double()
    dist = torch.clamp(s - d, min=0) + torch.clamp(d - e, min=0)
    if tau > 0:
        aff = torch.exp(-dist / tau)
    else:
        aff = (dist <= 0).double()
    ok = valid & ~torch.isnan(d) & ~torch.isnan(s) & ~torch.isnan(e)
    return torch.where(ok, aff, torch.zeros_like(aff)).float()
