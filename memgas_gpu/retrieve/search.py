"""Retrieval over a :class:`~memgas_gpu.retrieve.MemoryIndex`: the questions of its dataset
(:func:`retrieve`) or new query texts (:func:`search`), both through the one read path
of :mod:`memgas_gpu.retrieve.engine`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .. import ops
from .engine import METHODS, PRESETS, ReadParams, resolve, score
from .signals import QueryBatch

__all__ = ["METHODS", "PRESETS", "ReadParams", "Retrieval", "SearchResult", "retrieve",
           "search", "question_batch"]


@dataclass
class Retrieval:
    """Rankings of one method for a batch of questions.

    Attributes:
        method: the method name.
        question_index: ``[Q]`` indices into ``index.questions``.
        scores: ``[Q, N_max]`` session scores (``-inf`` past a conversation's end).
        rankings: ``[Q, N_max]`` session positions within the question's
            conversation, best first (``-1`` padding).
        n_sessions: ``[Q]`` sessions in each question's conversation.
        params: the settings used (signals resolved), and ``signals_rule`` when
            ``signals="auto"`` chose them.
    """

    method: str
    question_index: Tensor
    scores: Tensor
    rankings: Tensor
    n_sessions: Tensor
    params: dict = field(default_factory=dict)


def question_batch(index, qi: Tensor) -> QueryBatch:
    """The :class:`QueryBatch` of questions ``qi`` of the index."""
    lex = getattr(index, "lexical", None)
    qs = [index.questions[i] for i in qi.tolist()]
    return QueryBatch(index.q_emb[qi], index.q_conv[qi],
                      lex.queries.rows(qi) if lex is not None else None,
                      [q.text for q in qs], [q.date for q in qs])


def _question_index(index, questions) -> Tensor:
    n = len(index.questions)
    if questions is None:
        return torch.arange(n)
    qi = torch.as_tensor(list(questions), dtype=torch.long)
    bad = qi[(qi < 0) | (qi >= n)]
    if bad.numel():
        raise IndexError(f"question index {int(bad[0])} out of range: the index has {n} "
                         "questions")
    return qi


def retrieve(index, questions: Optional[Sequence[int]] = None, method: str = "memgas",
             params: Optional[ReadParams] = None, device: Optional[str] = None,
             **settings) -> Retrieval:
    """Rank the sessions of each question's conversation.

    Args:
        index: the memory index.
        questions: indices into ``index.questions`` (default: all).
        method: a preset name (:data:`METHODS`): ``"memgas"`` (full), ablations
            ``"no_gmm"``, ``"no_ppr"``, ``"no_router"``, ``"no_association"``, flat
            ``"session"``, ``"turn"``, ``"summary"``, ``"keyword"``, ``"concat"``,
            lexical ``"bm25"`` and ``"memgas_hybrid"``.
        params: a :class:`ReadParams` replacing the preset.
        device: where to compute (default: CUDA if available).
        **settings: :class:`ReadParams` fields overriding the preset (None = keep).

    Returns:
        A :class:`Retrieval`.
    """
    p, info = resolve(index, method, params, **settings)
    qi = _question_index(index, questions)
    scores, n = score(index, question_batch(index, qi), p, device)
    return Retrieval(method, qi, scores.cpu(), ops.rank_sessions(scores, n).cpu(), n,
                     params={**p.describe(), **({"signals_rule": info} if info else {})})


@dataclass
class SearchResult:
    """Answer to one query of :func:`search`.

    Attributes:
        conversation_id: the conversation searched.
        session_ids: the top-k session ids, best first.
        scores: their scores.
        evidence: for each returned session, its best-matching turns as
            ``(turn index, text, score)``, best first (text is ``None`` when the index
            keeps no texts).
    """

    conversation_id: str
    session_ids: list
    scores: list
    evidence: list

    def to_dict(self) -> dict:
        return {"conversation_id": self.conversation_id, "session_ids": self.session_ids,
                "scores": self.scores,
                "evidence": [[{"turn": t, "text": x, "score": s} for t, x, s in ev]
                             for ev in self.evidence]}


def search(index, conversation_id: Union[str, Sequence[str]], queries: Sequence[str],
           k: int = 10, method: str = "memgas_hybrid", encoder=None, evidence: int = 3,
           device: Optional[str] = None, question_date: Optional[str] = None,
           **settings) -> list:
    """Rank the sessions of a conversation for new query texts.

    Args:
        index: the memory index.
        conversation_id: one id for every query, or a list with one id per query.
        queries: the query texts.
        k: sessions returned per query.
        method, **settings: as :func:`retrieve`.
        encoder: the index's encoder (default: reloaded from the index's record); a
            different encoder is an error.
        evidence: best turns returned per session (by ``<query, turn>`` when the index
            keeps turn embeddings, else by BM25).
        device: where to compute.
        question_date: when the queries are asked (any date format; anchors relative
            time expressions such as "last week" for the time cue).

    Returns:
        One :class:`SearchResult` per query.
    """
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings (got one string: wrap it in [])")
    queries = list(queries)
    convs = ([conversation_id] * len(queries) if isinstance(conversation_id, str)
             else list(conversation_id))
    if len(convs) != len(queries):
        raise ValueError(f"{len(convs)} conversation ids for {len(queries)} queries")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    p, _ = resolve(index, method, None, **settings)
    if not queries:
        return []
    ci = torch.tensor([index.conversation_index(c) for c in convs], dtype=torch.long)
    enc = index.query_encoder(encoder)
    q_emb = enc.encode(queries, progress=False).float().cpu()
    lex = getattr(index, "lexical", None)
    batch = QueryBatch(q_emb, ci, lex.encode_queries(queries) if lex is not None else None,
                       queries, [question_date] * len(queries))
    scores, n = score(index, batch, p, device)
    scores, ranks = scores.cpu(), ops.rank_sessions(scores, n).cpu()
    out = []
    for j, c in enumerate(convs):
        meta = index.conversations[int(ci[j])]
        top = ranks[j, :min(k, int(n[j]))]
        top = top[top >= 0]
        rows = index.conv_offsets[ci[j]] + top
        out.append(SearchResult(c, [meta.session_ids[int(t)] for t in top],
                                [float(scores[j, t]) for t in top],
                                index.best_turns(q_emb[j], rows, evidence)
                                if evidence > 0 else [[] for _ in top]))
    return out
