"""GAM's read path: anchoring + expansion, drill-down, multi-factor re-ranking.

For a question of conversation ``c`` (all questions at once, padded per conversation):

1. **Signals.** Dense: cosine of the question with each event and with each topic's
   c_raw and c_sum. Lexical: BM25 (:mod:`memgas_gpu.ops.bm25`, statistics per
   conversation) of the question against each event and each topic's raw text. Each
   signal is z-normalised over the conversation's events (topics) by the engine's
   normalisation (:func:`~memgas_gpu.ops.normalise_signals`, sample standard deviation)
   and fused ``z(dense) + alpha * z(bm25)`` (:func:`zfuse`), the same fusion as the flat
   baseline.
2. **Anchoring and expansion.** The ``anchors`` topics of highest relevance ``r``, plus
   their one-hop TAN neighbours (``tan=True``). Reach confidence: 1 for an anchor, else
   the highest confidence of an edge from an anchor.
3. **Drill-down.** The candidates are the events of those topics (E_cross); every other
   event is ranked after them.
4. **Re-ranking.** ``s_i = e_i + gamma * r_topic(i) + eta * max_{j in EPG(i)} e_j`` and,
   with multi-factor re-ranking, ``+ ln(beta_time) [temporal question and time anchor]
   + ln(beta_role) [event by a person the question names] + ln(beta_conf) * conf``: the
   paper's factors multiply ``exp(s)``, a positive relevance (docs/gam.md). The person
   a question names is read by :func:`memgas_gpu.data.speakers.named_speakers` (the
   speaker cue's rule; a first-person question names ``user``).

Without the EPG (``epg=False``) events are not memory units: an event inherits its
topic's score and the topic's events come in their order (topic-level retrieval).
"""
from __future__ import annotations

import math
import re
from typing import Optional

import torch
from torch import Tensor

from ..ops.normalise import normalise_signals
from ..ops.rank import rank_sessions

__all__ = ["zfuse", "is_temporal_question", "question_edges", "neighbour_max", "rank_events"]

_TEMPORAL_Q = re.compile(
    r"\bwhen\b|\bwhat (?:date|time|day|month|year|week)\b|\bhow long\b|\bwhich "
    r"(?:date|day|month|year|week)\b|\bbefore\b|\bafter\b|\bago\b|\bsince\b|\bfirst\b|"
    r"\blast\b|\byear\b|\bmonth\b", re.I)


def is_temporal_question(text: str) -> bool:
    """True for questions about time (when, what date, how long, before/after ...)."""
    return _TEMPORAL_Q.search(text) is not None


def zfuse(dense: Tensor, lexical: Optional[Tensor], valid: Tensor, alpha: float) -> Tensor:
    """``z(dense) + alpha * z(lexical)`` (float64), each signal z-normalised over its row's
    valid entries by :func:`~memgas_gpu.ops.normalise_signals` (the engine's ``norm="z"``);
    invalid entries get ``-inf``."""
    x = dense[:, None] if lexical is None or alpha == 0.0 else torch.stack([dense, lexical], 1)
    z = normalise_signals(x.double(), valid, "z")
    s = z[:, 0] if z.shape[1] == 1 else z[:, 0] + alpha * z[:, 1]
    return s.masked_fill(~valid, -math.inf)


def question_edges(q_conv: Tensor, edge_conv: Tensor, n_conv: int) -> tuple[Tensor, Tensor]:
    """Join every question with the edges of its conversation.

    Args:
        q_conv: ``[Q]`` conversation of each question.
        edge_conv: ``[L]`` conversation of each edge, sorted.
        n_conv: number of conversations.

    Returns:
        ``(qrow, edge)``: one pair per (question, edge of its conversation).
    """
    eptr = torch.searchsorted(edge_conv.contiguous(), torch.arange(n_conv + 1))
    start = eptr[q_conv]
    cnt = eptr[q_conv + 1] - start
    qrow = torch.repeat_interleave(torch.arange(q_conv.numel()), cnt)
    off = torch.arange(int(cnt.sum())) - torch.repeat_interleave(cnt.cumsum(0) - cnt, cnt)
    return qrow, start[qrow] + off


def neighbour_max(values: Tensor, qrow: Tensor, a: Tensor, b: Tensor,
                  weight: Optional[Tensor] = None) -> Tensor:
    """``out[q, j] = max over edges (q; i, j) in either direction of values[q, i] * weight``
    (``-inf`` where ``j`` has no edge); ``a``, ``b`` are positions within the question's row."""
    Q, W = values.shape
    out = torch.full((Q * W,), -math.inf, dtype=values.dtype)
    if qrow.numel() == 0:
        return out.view(Q, W)
    w = weight.to(values.dtype) if weight is not None else 1.0
    out.scatter_reduce_(0, qrow * W + b, values[qrow, a] * w, "amax")
    out.scatter_reduce_(0, qrow * W + a, values[qrow, b] * w, "amax")
    return out.view(Q, W)


def rank_events(e: Tensor, ev_valid: Tensor, ev_topic: Tensor, r: Tensor, tp_valid: Tensor,
                tan_edges: tuple, *, anchors: int, tan: bool, epg: bool, gamma: float, eta: float,
                epg_max: Optional[Tensor], time_bonus: Tensor, role_bonus: Tensor,
                log_conf: float) -> tuple[Tensor, Tensor]:
    """Scores and rankings ``[Q, W]`` of the events (positions within the conversation).

    Args:
        e: ``[Q, W]`` event relevance (``-inf`` invalid).
        ev_topic: ``[Q, W]`` topic position (within the conversation) of each event.
        r: ``[Q, Tw]`` topic relevance (``-inf`` invalid).
        tan_edges: ``(qrow, a, b, conf)`` TAN edges of each question's conversation
            (``a``, ``b`` topic positions within it; :func:`question_edges`).
        epg_max: ``[Q, W]`` the best relevance among each event's EPG neighbours.
        time_bonus, role_bonus: ``[Q, W]`` the log-factors already applied per event.
        log_conf: ``ln(beta_conf)`` (0 without multi-factor re-ranking).
    """
    Q, Tw = r.shape
    k = min(anchors, Tw)
    top = torch.topk(r, k, dim=1).indices if k else torch.zeros(Q, 0, dtype=torch.long)
    is_anchor = torch.zeros(Q, Tw, dtype=torch.bool)
    is_anchor.scatter_(1, top, True)
    is_anchor &= tp_valid
    reach = is_anchor.float()
    if tan:
        qrow, a, b, conf = tan_edges  # best edge from an anchor
        nb = neighbour_max(is_anchor.float(), qrow, a, b, conf).clamp_min(0.0)
        reach = torch.maximum(reach, nb)
    cand_topic = (reach > 0) & tp_valid
    safe_t = ev_topic.clamp_min(0)
    cand = torch.gather(cand_topic, 1, safe_t) & ev_valid
    t_conf = torch.gather(reach, 1, safe_t)
    r_ev = torch.gather(r.masked_fill(~tp_valid, 0.0), 1, safe_t)
    if epg:
        s = e.masked_fill(~ev_valid, 0.0) + gamma * r_ev
        if epg_max is not None and eta:
            s = s + eta * epg_max
        s = s + time_bonus + role_bonus + log_conf * t_conf
    else:  # topic-level: the topic's score, then the events in their order
        W = e.shape[1]
        pos = torch.arange(W, dtype=torch.float32)[None, :].expand(Q, W)
        s = (r_ev + log_conf * t_conf) * 1e3 - pos * 1e-3
    big = 1e6  # candidates first; float64 keeps the scores exact beside the offset
    s = s.double()
    s = torch.where(cand, s + big, s)
    s = s.masked_fill(~ev_valid, -math.inf)
    return s, rank_sessions(s, ev_valid.sum(1))
