"""Question cues as tensor ops: who the question is about, and when.

* :func:`field_weighted_counts`: BM25F-style counts, so that the messages of the speaker
  a question names weigh ``1 + γ`` in the turn (or session) they belong to.
* :func:`time_affinity`: how well each session's date fits the question's time
  interval: 1 inside ``[start, end + after]`` (people talk about an event on the day
  or after it, not before), ``exp(-distance / tau)`` outside (``tau = 0``: 0 outside).

Both are batched over every question; the parsing that feeds them (names and dates
from the data) is in :mod:`memgas_gpu.retrieve.cues`.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["field_weighted_counts", "time_affinity"]


def field_weighted_counts(doc: Tensor, term: Tensor, tf: Tensor, field_weight: Tensor,
                          n_docs: int) -> tuple[Tensor, Tensor, Tensor]:
    """BM25F-style term counts: ``tf'(d, t) = Σ_parts w(part) · tf(part, t)``.

    A document (a turn, a session) is made of parts (its messages), each with a weight
    (e.g. ``1 + γ`` for the messages of the speaker the question names); the weighted
    counts then go through BM25's saturation and length normalisation as usual
    (Robertson, Zaragoza & Taylor, CIKM 2004).

    Args:
        doc: ``[nnz]`` int64 document of each (part, term) entry.
        term: ``[nnz]`` int64 term id.
        tf: ``[nnz]`` count of the term in the part.
        field_weight: ``[nnz]`` weight of the entry's part.
        n_docs: number of documents.

    Returns:
        ``(indptr [n_docs+1], indices, tf)``: CSR weighted counts, terms ascending per row.
    """
    n_terms = int(term.max()) + 1 if term.numel() else 1
    key, inv = torch.unique(doc * n_terms + term, return_inverse=True)
    val = torch.zeros(key.numel(), dtype=torch.float32, device=tf.device)
    val.index_add_(0, inv, (tf * field_weight).float())
    d = key // n_terms
    ptr = torch.zeros(n_docs + 1, dtype=torch.long, device=tf.device)
    ptr[1:] = torch.bincount(d, minlength=n_docs).cumsum(0)
    return ptr, key % n_terms, val


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
