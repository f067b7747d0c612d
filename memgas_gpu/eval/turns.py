"""Turn-level (evidence message) retrieval metrics, for every method.

A *turn* here is one message (utterance) of a session, named ``"session_id:index"`` as
in :attr:`~memgas_gpu.data.model.Question.evidence_turn_ids`. Metrics are
``recall_any@k``, ``recall_all@k`` and ``ndcg_any@k`` at k = 5, 10, 20 with the
semantics of :func:`~memgas_gpu.eval.metrics.retrieval_metrics`; averages skip questions
without evidence turns (LongMemEval's ``metrics.turn`` likewise covers the questions
that have them).

Methods that rank sessions (the MemGAS family) get a turn ranking by one rule
(:func:`session_turn_rankings`): the messages of the sessions in the session ranking's
order, and within a session by the message's own score (e.g. the dense + BM25 fusion of
the flat utterance baseline), ties by position.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from .metrics import gold_mask, retrieval_metrics

__all__ = ["TURN_KS", "conversation_turn_ids", "turn_metrics", "evaluate_turns",
           "session_turn_rankings"]

#: cut-offs of the turn metrics
TURN_KS = (5, 10, 20)


def conversation_turn_ids(conversation) -> list[str]:
    """``"session_id:message_index"`` of every message of a conversation, in order."""
    return [f"{s.id}:{j}" for s in conversation.sessions for j in range(len(s.messages))]


def turn_metrics(rankings: Tensor, turn_ids: Sequence[Sequence[str]],
                 gold: Sequence[Sequence[str]], ks: Sequence[int] = TURN_KS
                 ) -> dict[str, Tensor]:
    """Per-question turn metrics.

    Args:
        rankings: ``[Q, W]`` positions into each question's ``turn_ids``, best first
            (``-1`` padding).
        turn_ids: per question, the ids of the turns its ranking indexes.
        gold: per question, its evidence turn ids.
        ks: cut-offs.

    Returns:
        ``{"recall_any@k": [Q], "recall_all@k": [Q], "ndcg_any@k": [Q]}`` (float64);
        questions without evidence turns are NaN.
    """
    width = max(rankings.shape[1], max((len(t) for t in turn_ids), default=0))
    rel, n_gold = gold_mask(turn_ids, gold, width)
    if rankings.shape[1] < width:
        pad = torch.full((rankings.shape[0], width - rankings.shape[1]), -1,
                         dtype=rankings.dtype)
        rankings = torch.cat([rankings, pad], 1)
    out = retrieval_metrics(rankings, rel, n_gold, ks=ks)
    none = n_gold == 0
    return {k: torch.where(none, torch.full_like(v, math.nan), v) for k, v in out.items()}


def evaluate_turns(rankings: Tensor, turn_ids: Sequence[Sequence[str]],
                   gold: Sequence[Sequence[str]], ks: Sequence[int] = TURN_KS
                   ) -> dict[str, float]:
    """Mean turn metrics over the questions with evidence turns (``"n"``: how many)."""
    per = turn_metrics(rankings, turn_ids, gold, ks)
    out: dict[str, float] = {}
    for k, v in per.items():
        ok = ~torch.isnan(v)
        out[k] = float(v[ok].mean()) if bool(ok.any()) else math.nan
    out["n"] = int((~torch.isnan(next(iter(per.values())))).sum()) if per else 0
    return out


def session_turn_rankings(session_rankings: Tensor, message_session: Tensor,
                          message_scores: Tensor) -> Tensor:
    """Turn rankings of session-ranking methods.

    Args:
        session_rankings: ``[Q, N]`` session positions, best first (``-1`` padding), e.g.
            ``Retrieval.rankings``.
        message_session: ``[Q, W]`` session position of each message of the question's
            conversation (``-1`` padding).
        message_scores: ``[Q, W]`` each message's own score (higher first).

    Returns:
        ``[Q, W]`` message positions: sessions in rank order, messages within a session
        by score, ties by position; unranked sessions' messages last; ``-1`` padding.
    """
    Q, N = session_rankings.shape
    rank_of = torch.full((Q, max(N, 1) + 1), N + 1, dtype=torch.long)
    pos = torch.arange(N).expand(Q, N)
    ok = session_rankings >= 0
    rank_of.scatter_(1, torch.where(ok, session_rankings, torch.full_like(session_rankings, N)),
                     torch.where(ok, pos, torch.full_like(pos, N + 1)))
    valid = message_session >= 0
    sr = torch.gather(rank_of, 1, message_session.clamp_min(0)).double()
    sr = torch.where(valid, sr, torch.full_like(sr, math.inf))
    # order by (session rank, -score, position): two stable sorts
    sc = torch.where(valid, message_scores.double(), torch.full_like(sr, -math.inf))
    o1 = torch.sort(-sc, dim=1, stable=True).indices
    o2 = torch.sort(torch.gather(sr, 1, o1), dim=1, stable=True).indices
    order = torch.gather(o1, 1, o2)
    return torch.where(torch.gather(valid, 1, order), order, torch.full_like(order, -1))
