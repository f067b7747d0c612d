"""Ranking on a view: the dataset's questions (:func:`rank_questions`) or new query
texts (:func:`rank_queries`), both through the one read path of
:mod:`memgas_gpu.retrieve.engine`, and the checks of a search's arguments.

:class:`~memgas_gpu.retrieve.MemoryIndex` takes the state, the view and the query
embeddings, then calls these; :func:`retrieve` and :func:`search` are its methods as
functions.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .. import ops
from .._io import find_surrogate
from .engine import METHODS, PRESETS, ReadParams, score
from .signals import QueryBatch
from .filters import check_date, check_metadata
from .results import SearchResult

__all__ = ["METHODS", "PRESETS", "ReadParams", "Ranked", "Retrieval", "SearchResult",
           "retrieve", "search", "rank_questions", "rank_queries", "check_search",
           "session_filter", "SearchRequest",
           "question_indices", "best_turns"]


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


def question_indices(n: int, questions) -> Tensor:
    """``questions`` as a long tensor of indices into an index's ``n`` questions (all
    when None).

    Raises:
        TypeError: an element that is not an integer (a string, a float, a bool).
        IndexError: an integer out of range (negative, or past the last question).
    """
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
    """:meth:`MemoryIndex.retrieve <memgas_gpu.retrieve.MemoryIndex.retrieve>` as a
    function: rank the sessions of each of ``index``'s questions' conversation."""
    return index.retrieve(questions, method, params=params, device=device, **settings)


def rank_questions(view, batch: QueryBatch, qi: Tensor, method: str, p: ReadParams,
                   info: dict, device: Optional[str] = None) -> Retrieval:
    """Rankings of the questions ``qi`` (``batch``, laid out on ``view``) under the
    resolved settings ``p`` of ``method`` (``info``: how ``signals="auto"`` resolved)."""
    scores, n = score(view, batch, p, device)
    return Retrieval(method, qi, scores.cpu(), ops.rank_sessions(scores, n).cpu(), n,
                     params={**p.describe(), **({"signals_rule": info} if info else {})})


def search(index, conversation_id: Union[str, Sequence[str]], queries: Sequence[str],
           k: int = 10, method: Optional[str] = None, **kwargs) -> list:
    """:meth:`MemoryIndex.search <memgas_gpu.retrieve.MemoryIndex.search>` as a
    function: rank the sessions of a conversation of ``index`` for new query texts."""
    return index.search(conversation_id, queries, k=k, method=method, **kwargs)


def check_search(conversation_id, queries, k, evidence, question_date
                 ) -> tuple[list, list]:
    """The conversation id of each query and the queries, or a one-line refusal naming
    the bad argument (before anything is encoded)."""
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings (got one string: wrap it in [])")
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
    return convs, queries


def session_filter(after: Optional[str] = None, before: Optional[str] = None,
                   metadata: Optional[dict] = None):
    """``keep(view, c) -> [n] bool`` of the sessions of conversation ``c`` (a position in
    ``view``) that a search returns, or None for every session; a one-line refusal of a
    bad date or metadata."""
    if after is None and before is None and not metadata:
        return None
    lo = hi = None
    for name, value in (("after", after), ("before", before)):
        if value is not None:
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a date string, got {value!r:.80}")
            check_date(value, name)
            if not value.strip():
                raise ValueError(f"{name} is empty: give a date or None")
    from .cues.dates import days_since_epoch, parse_date

    if after is not None:
        lo = days_since_epoch(parse_date(after))
    if before is not None:
        hi = days_since_epoch(parse_date(before))
    want = check_metadata(metadata, "metadata") if metadata else {}

    def keep(view, c: int) -> Tensor:
        seg = view.segments[c]
        ok = torch.ones(seg.n, dtype=torch.bool)
        if lo is not None:
            ok &= seg.days >= lo  # NaN (no date) compares False
        if hi is not None:
            ok &= seg.days <= hi
        if want:
            md = seg.meta
            ok &= torch.tensor([all(k in md.metadata(j) and md.metadata(j)[k] == v
                                    for k, v in want.items()) for j in range(seg.n)],
                               dtype=torch.bool)
        return ok

    return keep


@dataclass
class SearchRequest:
    """One caller's search (:meth:`MemoryIndex.search_many`): the arguments of
    :meth:`MemoryIndex.search` (``settings``: ReadParams fields)."""

    conversation_id: Union[str, Sequence[str]]
    queries: Sequence[str]
    k: int = 10
    method: Optional[str] = None
    evidence: int = 3
    question_date: Optional[str] = None
    after: Optional[str] = None
    before: Optional[str] = None
    metadata: Optional[dict] = None
    settings: dict = field(default_factory=dict)

    def checked(self) -> "SearchRequest":
        """The request with one conversation id per query, its filter, or a one-line
        refusal naming the bad argument."""
        convs, queries = check_search(self.conversation_id, self.queries, self.k,
                                      self.evidence, self.question_date)
        if self.method is not None and not (isinstance(self.method, str) and self.method):
            raise ValueError(f"method must be a method's name or None (the default), got "
                             f"{self.method!r:.40}")
        if not isinstance(self.settings, dict):
            raise TypeError(f"settings must be a dict of ReadParams fields, got "
                            f"{type(self.settings).__name__}")
        out = SearchRequest(convs, queries, self.k, self.method, self.evidence,
                            self.question_date, self.after, self.before, self.metadata,
                            dict(self.settings))
        out.keep = session_filter(self.after, self.before, self.metadata)
        return out

    def group(self) -> tuple:
        """What requests answered by one read-path call share: the method and settings."""
        return (self.method, tuple(sorted((k, repr(v)) for k, v in self.settings.items())))


def rank_queries(view, conversation_ids: Sequence[str], queries: Sequence[str],
                 q_emb: Tensor, p: ReadParams, *, k=10, evidence=3,
                 device: Optional[str] = None, question_date=None,
                 keep=None) -> list:
    """One :class:`SearchResult` per query: the top ``k`` sessions of its conversation
    (held by ``view``) under the resolved settings ``p``, and their best turns
    (``keep``: a :func:`session_filter`, the sessions that may be returned).  ``k``,
    ``evidence``, ``question_date`` and ``keep`` are one value for every query or a list
    with one per query."""
    Q = len(queries)

    def each(x):
        return list(x) if isinstance(x, list) else [x] * Q

    ks, evs, dates, keeps = each(k), each(evidence), each(question_date), each(keep)
    ci = view.positions(conversation_ids)
    lex = view.lexical
    batch = QueryBatch(q_emb, ci, lex.encode_queries(queries) if lex is not None else None,
                       list(queries), dates)
    scores, n = score(view, batch, p, device)
    scores, ranks = scores.cpu(), ops.rank_sessions(scores, n).cpu()
    out = []
    for j, c in enumerate(conversation_ids):
        meta = view.conversations[int(ci[j])]
        top = ranks[j, :int(n[j])]
        top = top[top >= 0]
        if keeps[j] is not None:
            top = top[keeps[j](view, int(ci[j]))[top]]
        top = top[:ks[j]]
        rows = view.conv_offsets[ci[j]] + top
        out.append(SearchResult(c, [meta.session_ids[int(t)] for t in top],
                                [float(scores[j, t]) for t in top],
                                best_turns(view, q_emb[j], rows, evs[j])
                                if evs[j] > 0 else [[] for _ in top],
                                [meta.session_dates[int(t)] for t in top],
                                [meta.metadata(int(t)) for t in top]))
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
