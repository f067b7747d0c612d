"""Question cues as tensor ops: who the question is about, and when.

* :func:`speaker_weighted_max`: a turn-level signal where the turns (messages) of the
  speaker the question names weigh more: ``max_{m ∈ session} score(q, m) · (1 + γ ·
  [speaker(m) named in q])``.
* :func:`time_affinity`: how well each session's date fits the question's time
  interval: 1 inside ``[start, end + after]`` (people talk about an event on the day
  or after it, not before), ``exp(-distance / tau)`` outside (``tau = 0``: 0 outside).

Both are batched over every question; the parsing that feeds them (names and dates
from the data) is in :mod:`memgas_gpu.retrieve.cues`.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["speaker_weighted_max", "time_affinity"]


def speaker_weighted_max(q: Tensor, msg: Tensor, value: Tensor, msg_pos: Tensor,
                         msg_speaker: Tensor, named: Tensor, gamma: float,
                         n_max: int) -> Tensor:
    """Session scores from message scores, the named speaker's messages weighted.

    Args:
        q, msg, value: the nonzero (question, message, score) entries (e.g. the
            indices and values of a sparse BM25 ``[Q, M]``), scores ``>= 0``.
        msg_pos: ``[M]`` int64 position of each message's session in its conversation.
        msg_speaker: ``[M]`` int64 speaker slot of each message in its conversation
            (``-1``: unknown).
        named: ``[Q, P]`` bool, True where question ``q`` names speaker slot ``p``.
        gamma: extra weight of the named speaker's messages (0 = plain max).
        n_max: sessions per row of the output.

    Returns:
        ``[Q, n_max]`` float32: the best weighted message score of each session (0 for a
        session without a matching message).
    """
    Q, P = named.shape
    spk = msg_speaker[msg]
    hit = (spk >= 0) & named[q, spk.clamp(0, max(P - 1, 0))] if P else torch.zeros_like(q,
                                                                                     dtype=bool)
    w = value.float() * (1 + gamma * hit.float())
    out = torch.zeros(Q * n_max, dtype=torch.float32, device=value.device)
    out.scatter_reduce_(0, q * n_max + msg_pos[msg], w, "amax")
    return out.view(Q, n_max)


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
