"""Retrieval over a :class:`~memgas_gpu.retrieve.MemoryIndex`: the questions of its dataset
(:func:`retrieve`) or new query texts (:func:`search`), both through the one read path
of :mod:`memgas_gpu.retrieve.engine`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

import operator

from .. import ops
from .._checks import require_encoder, resolve_device
from .._io import find_surrogate
from .engine import DEFAULT_METHOD, METHODS, PRESETS, ReadParams, resolve, score
from .signals import QueryBatch
from .writes import check_date

__all__ = ["METHODS", "PRESETS", "ReadParams", "Ranked", "Retrieval", "SearchResult",
           "retrieve", "search", "question_batch", "best_turns"]


@dataclass
class Ranked:
    """Rankings of one method for a batch of questions.

    Attributes:
        method: the method name.
        question_index: ``[Q]`` indices into ``index.questions``.
        scores: ``[Q, W]`` scores of the items of each question's conversation (sessions,
            or GAM's events; ``-inf`` past its end).
        rankings: ``[Q, W]`` item positions within that conversation, best first (``-1``
            padding).
    """

    method: str
    question_index: Tensor
    scores: Tensor
    rankings: Tensor


@dataclass
class Retrieval(Ranked):
    """Session rankings of one method for a batch of questions (:class:`Ranked`).

    Attributes:
        n_sessions: ``[Q]`` sessions in each question's conversation.
        params: the settings used (signals resolved), and ``signals_rule`` when
            ``signals="auto"`` chose them.
    """

    n_sessions: Tensor
    params: dict = field(default_factory=dict)


def question_batch(index, qi: Tensor) -> QueryBatch:
    """The :class:`QueryBatch` of questions ``qi`` of the index."""
    if hasattr(index, "question_terms"):
        terms = index.question_terms
    else:
        lex = getattr(index, "lexical", None)
        terms = lex.queries if lex is not None else None
    qs = [index.questions[i] for i in qi.tolist()]
    return QueryBatch(index.q_emb[qi], index.q_conv[qi],
                      terms.rows(qi) if terms is not None else None,
                      [q.text for q in qs], [q.date for q in qs])


def _question_index(index, questions) -> Tensor:
    """``questions`` as a long tensor of indices into ``index.questions``.

    Raises:
        TypeError: an element that is not an integer (a string, a float, a bool).
        IndexError: an integer out of range (negative, or past the last question).
    """
    n = len(index.questions)
    if questions is None:
        return torch.arange(n)
    what = ("questions must be integer indices into index.questions "
            f"({f'0 to {n - 1}' if n else 'it has none'})")
    if isinstance(questions, (str, bytes)):
        raise TypeError(f"{what}, got a string {questions!r:.40}")
    if isinstance(questions, Tensor) and questions.dtype in _INDEX_DTYPES:
        qi = questions.reshape(-1).to(torch.long)
    else:
        out = []
        for q in questions:
            try:
                if isinstance(q, bool) or (isinstance(q, Tensor) and q.dtype == torch.bool):
                    raise TypeError
                out.append(operator.index(q))
            except TypeError:
                raise TypeError(f"{what}, got {q!r:.40}") from None
        bad = [i for i in out if not 0 <= i < n]
        if bad:
            raise IndexError(f"{what}: question index {bad[0]} out of range (the index has "
                             f"{n} questions)")
        return torch.tensor(out, dtype=torch.long)
    bad = qi[(qi < 0) | (qi >= n)]
    if bad.numel():
        raise IndexError(f"{what}: question index {int(bad[0])} out of range (the index "
                         f"has {n} questions)")
    return qi


_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def retrieve(index, questions: Optional[Sequence[int]] = None,
             method: Optional[str] = None, params: Optional[ReadParams] = None,
             device: Optional[str] = None, **settings) -> Retrieval:
    """Rank the sessions of each question's conversation.

    Args:
        index: the memory index.
        questions: indices into ``index.questions`` (default: all).
        method: a preset name (:data:`METHODS`; default :data:`DEFAULT_METHOD`):
            ``"memgas"`` (full), ablations
            ``"no_gmm"``, ``"no_ppr"``, ``"no_router"``, ``"no_association"``, flat
            ``"session"``, ``"turn"``, ``"summary"``, ``"keyword"``, ``"concat"``,
            lexical ``"bm25"`` and ``"memgas_hybrid"``.
        params: a :class:`ReadParams` replacing the preset.
        device: where to compute (default: CUDA if available).
        **settings: :class:`ReadParams` fields overriding the preset (None = keep).

    Returns:
        A :class:`Retrieval`.
    """
    resolve_device(device)  # before any work
    method = method or DEFAULT_METHOD
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
           k: int = 10, method: Optional[str] = None, encoder=None, evidence: int = 3,
           device: Optional[str] = None, question_date: Optional[str] = None,
           **settings) -> list:
    """Rank the sessions of a conversation for new query texts.

    The search sees the index as it was when it started (writes running meanwhile are
    not in it) and costs what the asked conversations cost.

    Args:
        index: the memory index.
        conversation_id: one id for every query, or a list with one id per query.
        queries: the query texts.
        k: sessions returned per query.
        method, **settings: as :func:`retrieve`.
        encoder: the index's encoder (default: reloaded from the index's record); a
            different encoder is an error.
        evidence: best turns returned per session (by ``<query, turn>`` when the index
            keeps turn embeddings, else none).
        device: where to compute.
        question_date: when the queries are asked (any date format; anchors relative
            time expressions such as "last week" for the time cue).

    Returns:
        One :class:`SearchResult` per query; empty lists for a conversation without
        sessions, and for a conversation id the memory does not hold (nothing was
        added to it yet, or it was forgotten).
    """
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings (got one string: wrap it in [])")
    require_encoder(encoder)
    resolve_device(device)  # before the queries are encoded
    queries = list(queries)
    bad = [type(q).__name__ for q in queries if not isinstance(q, str)]
    if bad:
        raise TypeError(f"queries must be strings, got {bad[0]}")
    blank = [j for j, q in enumerate(queries) if not q.strip()]
    if blank:
        raise ValueError(f"queries[{blank[0]}] is empty: there is nothing to search for")
    odd = find_surrogate(queries, "queries")
    if odd is not None:
        raise ValueError(f"{odd} holds a lone UTF-16 surrogate (not valid Unicode text, "
                         "e.g. bytes decoded with surrogateescape); pass valid text")
    if isinstance(conversation_id, str):
        convs = [conversation_id] * len(queries)
    elif isinstance(conversation_id, (list, tuple)) and \
            all(isinstance(c, str) for c in conversation_id):
        convs = list(conversation_id)
    else:
        raise TypeError("conversation_id must be a string or a list of strings (one per "
                        f"query), got {conversation_id!r:.80}")
    if len(convs) != len(queries):
        raise ValueError(f"{len(convs)} conversation ids for {len(queries)} queries")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if isinstance(evidence, bool) or not isinstance(evidence, int) or evidence < 0:
        raise ValueError(f"evidence must be an integer >= 0, got {evidence!r}")
    if question_date is not None and not isinstance(question_date, str):
        raise TypeError(f"question_date must be a string or None, got {question_date!r}")
    if question_date is not None:
        check_date(question_date, "question_date")
    state = index.state() if hasattr(index, "state") else None
    p, _ = resolve(index, method or DEFAULT_METHOD, None, **settings)
    if not queries:
        return []
    if state is not None:
        known = [j for j, c in enumerate(convs) if c in state.ids]
        if len(known) < len(convs):  # a conversation the memory does not hold: no hits
            got = iter(search(index, [convs[j] for j in known], [queries[j] for j in known],
                              k, method, encoder, evidence, device, question_date,
                              **settings) if known else ())
            return [next(got) if c in state.ids else SearchResult(c, [], [], [])
                    for c in convs]
        pos = [state.position(c) for c in convs]
        view = index.view(pos, state=state)
        ci = torch.searchsorted(view.conv, torch.tensor(pos, dtype=torch.long))
    else:
        view = index
        ci = torch.tensor([index.conversation_index(c) for c in convs], dtype=torch.long)
    enc = index.query_encoder(encoder)
    q_emb = enc.encode(queries, progress=False).float().cpu()
    lex = getattr(view, "lexical", None)
    batch = QueryBatch(q_emb, ci, lex.encode_queries(queries) if lex is not None else None,
                       queries, [question_date] * len(queries))
    scores, n = score(view, batch, p, device)
    scores, ranks = scores.cpu(), ops.rank_sessions(scores, n).cpu()
    out = []
    for j, c in enumerate(convs):
        meta = view.conversations[int(ci[j])]
        top = ranks[j, :min(k, int(n[j]))]
        top = top[top >= 0]
        rows = view.conv_offsets[ci[j]] + top
        out.append(SearchResult(c, [meta.session_ids[int(t)] for t in top],
                                [float(scores[j, t]) for t in top],
                                best_turns(view, q_emb[j], rows, evidence)
                                if evidence > 0 else [[] for _ in top]))
    return out


def best_turns(view, query_emb: Tensor, rows: Tensor, n: int = 3) -> list:
    """For each session row of ``view``, its ``n`` turns most similar to ``query_emb``:
    ``[(turn index, text or None, <query, turn>)]``, best first (empty when the index
    keeps no turn embeddings)."""
    if view.turns is None or view.turn_ptr is None:
        return [[] for _ in range(len(rows))]
    out = []
    for r in rows.tolist():
        slot = int(view.row_slot[r])
        t0, t1 = int(view.turn_ptr[slot]), int(view.turn_ptr[slot + 1])
        sims = (view.turns[t0:t1].float() @ query_emb.float()).tolist()
        top = sorted(range(t1 - t0), key=lambda i: -sims[i])[:n]
        out.append([(i, view.turn_text[t0 + i] if view.turn_text is not None else None,
                     sims[i]) for i in top])
    return out
