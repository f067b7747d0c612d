"""``GamIndex``: the GAM memory H = {G_topic, G_event, S_arch, E_cross} of many
conversations, built offline in one batched pass, and its read path.

``GamIndex.build(dataset, encoder, params)`` → events (:mod:`.events`), topic starts
(:mod:`.boundary`), topics and TAN edges (:mod:`.topics`). ``index.retrieve()`` →
:class:`TurnRetrieval` (:mod:`.retrieve`). The online writer
(:class:`~memgas_gpu.gam.writer.GamWriter`) produces the same index event by event.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from ..data.model import Dataset, Question
from ..data.speakers import named_speakers
from ..lexical.terms import INDEX_STOPWORDS, TermMatrix
from ..lexical.tokenize import Tokenizer, Vocabulary
from ..ops.bm25 import BM25Postings, bm25_gather, bm25_postings
from ..ops.query_layout import Layout, query_layout
from ..ops.rank import rank_sessions
from ..memory.embed import encode_unique
from ..retrieve.search import Ranked
from . import retrieve as R
from .boundary import add_boundary_noise, segment
from .events import EventTable, build_events, epg_links
from .params import FLAT_METHODS, GamParams
from .topics import (Topics, accept_links, candidate_rows, raw_embeddings, summarize,
                     topic_keys)

__all__ = ["GamIndex", "TurnRetrieval"]


@dataclass
class _Lexical:
    """The memory's lexical side: the index tokenizer's terms of every event and topic,
    and their BM25 postings per conversation (question-independent, built once)."""

    tokenizer: Tokenizer
    vocab: Vocabulary
    events: BM25Postings
    topics: BM25Postings
    questions: TermMatrix


@dataclass
class TurnRetrieval(Ranked):
    """Event rankings for a batch of questions (:class:`~memgas_gpu.retrieve.Ranked`
    over the events of each question's conversation).

    Attributes:
        n_events: ``[Q]`` events of each question's conversation.
        turn_ids: per question, the ``"session_id:message_index"`` of its events.
    """

    n_events: Tensor
    turn_ids: list = field(default_factory=list)


class GamIndex:
    """GAM memory of many conversations (see the module doc)."""

    def __init__(self, events: EventTable, starts: Tensor, topics: Topics,
                 questions: list[Question], q_conv: Tensor, params: GamParams,
                 encoder: Any = None, timings: Optional[dict] = None,
                 store: Any = None) -> None:
        self.events, self.starts, self.topics = events, starts, topics
        self.questions, self.q_conv, self.params = questions, q_conv, params
        self.encoder, self.store = encoder, store
        self.timings = timings or {}
        self._lex = None
        self._q_emb: Optional[Tensor] = None

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, dataset: Dataset, encoder: Any, params: Optional[GamParams] = None, *,
              store: Any = None, events: Optional[EventTable] = None,
              judge: Optional[Callable] = None) -> "GamIndex":
        """Build the memory of every conversation of ``dataset`` at once.

        Args:
            dataset: a loaded dataset.
            encoder: an :class:`~memgas_gpu.encode.Encoder` (events, summaries, questions).
            params: :class:`GamParams` (default: GAM's defaults).
            store: optional :class:`~memgas_gpu.encode.EmbeddingStore`.
            events: a prebuilt :class:`EventTable` of ``dataset`` (to share the
                encoding between variants).
            judge: optional relation judge (:func:`memgas_gpu.gam.judge.llm_judge`)
                instead of the GMM similarity test.
        """
        p = _params(params, GamParams())
        ev = events if events is not None else build_events(dataset, encoder, store=store)
        t0 = time.perf_counter()
        starts = segment(ev.emb, ev.tokens, ev.session_start, p.segmentation,
                         window=p.window, theta=p.theta, min_events=p.min_events,
                         max_tokens=p.max_tokens)
        starts = add_boundary_noise(starts, ev.session_start, p.noise, p.noise_seed)
        t_seg = time.perf_counter() - t0
        topics, t_parts = consolidate(ev, starts, encoder, p, store=store, judge=judge)
        qs = [q for c in dataset for q in c.questions]
        q_conv = torch.tensor([i for i, c in enumerate(dataset) for _ in c.questions],
                              dtype=torch.long)
        timings = {"segment_s": t_seg, **t_parts}
        return cls(ev, starts, topics, qs, q_conv, p, encoder, timings, store)

    # ------------------------------------------------------------------ lexical
    def _lexical(self) -> _Lexical:
        """Terms of the events, topics (their events' texts) and questions, with the
        index's default tokenizer; BM25 postings with each conversation's statistics
        (:func:`~memgas_gpu.ops.bm25.bm25_postings`, as the engine's lexical signals)."""
        if self._lex is None:
            tok = Tokenizer(stopwords=INDEX_STOPWORDS)
            vocab = Vocabulary()
            ids = [vocab.encode(tok.tokens(t)) for t in self.events.texts]
            ptr = self.topics.event_ptr.tolist()
            tids = [[i for e in range(ptr[k], ptr[k + 1]) for i in ids[e]]
                    for k in range(len(ptr) - 1)]
            V = max(len(vocab), 1)
            ev, tp = TermMatrix.from_ids(ids), TermMatrix.from_ids(tids)
            qs = TermMatrix.from_ids([vocab.encode(tok.tokens(q.text), grow=False)
                                      for q in self.questions])
            self._lex = _Lexical(
                tok, vocab,
                bm25_postings(ev.indptr, ev.indices, ev.tf, self.events.conv, V),
                bm25_postings(tp.indptr, tp.indices, tp.tf, self.topics.conv, V), qs)
        return self._lex

    def _bm25(self, post: BM25Postings, qi: Tensor, lay: Layout) -> Tensor:
        """``[Q, N_max]`` BM25 of questions ``qi`` against the documents of their
        conversation laid out as ``lay`` (0 where no term matches)."""
        qm = self._lexical().questions.rows(qi)
        q, doc, val = bm25_gather(post, qm.indptr, qm.indices, qm.tf, lay.conv)
        out = torch.zeros(lay.rows.shape)
        out.view(-1).index_add_(0, q * lay.n_max + doc - lay.start[q], val.float())
        return out

    def question_embeddings(self) -> Tensor:
        if self._q_emb is None:
            emb, _ = encode_unique(self.encoder, [q.text for q in self.questions],
                                   store=self.store)
            self._q_emb = torch.nn.functional.normalize(emb.float(), dim=-1)
        return self._q_emb

    # ------------------------------------------------------------------ reading
    def retrieve(self, questions: Optional[Sequence[int]] = None, method: str = "gam",
                 params: Optional[GamParams] = None) -> TurnRetrieval:
        """Rank the events of each question's conversation.

        Args:
            questions: indices into :attr:`questions` (default: all).
            method: ``"gam"`` (the read settings of ``params``) or a flat baseline of
                :data:`FLAT_METHODS` (the same event signals, no topics).
            params: read settings (default: the build's); the write settings must be
                the build's.
        """
        p = _params(params, self.params)
        if method != "gam" and method not in FLAT_METHODS:
            raise ValueError(f"unknown GAM read method {method!r}: 'gam' (an ablation is "
                             f"'gam' with preset(name)'s params) or one of {FLAT_METHODS}")
        qi = torch.arange(len(self.questions)) if questions is None else \
            torch.as_tensor(list(questions), dtype=torch.long)
        if qi.numel() and (int(qi.min()) < 0 or int(qi.max()) >= len(self.questions)):
            raise ValueError(f"question indices must lie in [0, {len(self.questions)}), got "
                             f"{int(qi.min())}..{int(qi.max())}")
        ev, tp = self.events, self.topics
        conv = self.q_conv[qi]
        q = self.question_embeddings()[qi]
        lay = query_layout(ev.conv_ptr, conv)
        rows, ev_valid = lay.rows, lay.valid
        dense = _dots(q, ev.emb, rows, ev_valid)
        lex = self._lexical()
        bm = self._bm25(lex.events, qi, lay)
        turn_ids = [ev.turn_ids[int(ev.conv_ptr[c]):int(ev.conv_ptr[c + 1])]
                    for c in conv.tolist()]
        if method in FLAT_METHODS:
            if method == "flat_dense":
                s = dense.masked_fill(~ev_valid, -math.inf)
            elif method == "flat_bm25":
                s = bm.masked_fill(~ev_valid, -math.inf)
            else:
                s = R.zfuse(dense, bm, ev_valid, p.alpha)
            return TurnRetrieval(method, qi, s, rank_sessions(s, lay.n), lay.n, turn_ids)
        e = R.zfuse(dense, bm, ev_valid, p.alpha)
        # topics of each question's conversation
        tconv_ptr = torch.searchsorted(tp.conv.contiguous(), torch.arange(len(ev.conv_ids) + 1))
        tlay = query_layout(tconv_ptr, conv)
        tp_valid = tlay.valid
        t_dense = _dots(q, tp.raw_emb + tp.sum_emb, tlay.rows, tp_valid)
        t_bm = self._bm25(lex.topics, qi, tlay)
        r = R.zfuse(t_dense, t_bm, tp_valid, p.alpha)
        ev_topic = tp.event_topic[rows] - tlay.start[:, None]
        ev_topic = torch.where(ev_valid, ev_topic, torch.full_like(ev_topic, -1))
        C = len(ev.conv_ids)
        qrow, edge = R.question_edges(conv, tp.conv[tp.src], C)
        first = tlay.start[qrow]
        tan_edges = (qrow, tp.src[edge] - first, tp.dst[edge] - first, tp.conf[edge])
        epg_max = None
        if p.eta:
            src, dst = epg_links(ev.emb, tp.event_topic, self.params.epg_window)
            qrow_e, edge_e = R.question_edges(conv, ev.conv[src], len(ev.conv_ids))
            f = lay.start[qrow_e]
            m = R.neighbour_max(e.masked_fill(~ev_valid, -math.inf), qrow_e,
                                src[edge_e] - f, dst[edge_e] - f)
            epg_max = torch.where(torch.isfinite(m) & ev_valid, m, torch.zeros_like(m))
        zero = torch.zeros_like(e)
        time_b, role_b, log_conf = zero, zero, 0.0
        if p.mfr:
            temporal = torch.tensor([R.is_temporal_question(self.questions[i].text)
                                     for i in qi.tolist()], dtype=torch.bool)
            time_b = (temporal[:, None] & ev.time_anchor[rows] & ev_valid).double() * \
                math.log(p.beta_time)
            named = torch.tensor([named_speakers(self.questions[i].text, ev.speakers,
                                                 first_person="user") for i in qi.tolist()],
                                 dtype=torch.bool).reshape(len(qi), len(ev.speakers))
            role_b = (torch.gather(named, 1, ev.speaker[rows]) & ev_valid).double() * \
                math.log(p.beta_role)
            log_conf = math.log(p.beta_conf)
        s, rk = R.rank_events(e, ev_valid, ev_topic, r, tp_valid, tan_edges, anchors=p.anchors,
                              tan=p.tan, epg=p.epg, gamma=p.gamma, eta=p.eta, epg_max=epg_max,
                              time_bonus=time_b, role_bonus=role_b, log_conf=log_conf)
        return TurnRetrieval("gam", qi, s, rk, lay.n, turn_ids)

    def session_turns(self, retrieval: Any, method: str = "flat_fusion",
                      params: Optional[GamParams] = None) -> TurnRetrieval:
        """Turn ranking of a session-ranking method (the MemGAS family).

        ``retrieval`` is a :class:`~memgas_gpu.retrieve.Retrieval` of a ``MemoryIndex``
        built from the same dataset (its ``question_index`` indexes the same questions
        in the same order). Rule (:func:`~memgas_gpu.eval.turns.session_turn_rankings`):
        the messages of the sessions in rank order, within a session by the message's
        own score under ``method`` (a flat baseline: dense + BM25 fusion by default).
        """
        from ..eval.turns import session_turn_rankings

        qi = torch.as_tensor(retrieval.question_index, dtype=torch.long)
        if qi.numel() and int(qi.max()) >= len(self.questions):
            raise ValueError(f"retrieval has question {int(qi.max())}, this GAM index "
                             f"only {len(self.questions)} (another dataset?)")
        flat = self.retrieve(qi.tolist(), method=method, params=params)
        lay = query_layout(self.events.conv_ptr, self.q_conv[qi])
        msess = torch.where(lay.valid, self.events.session[lay.rows],
                            torch.full_like(lay.rows, -1))
        rk = session_turn_rankings(retrieval.rankings, msess, flat.scores)
        return TurnRetrieval(f"{retrieval.method}+turns", qi, flat.scores, rk, flat.n_events,
                             flat.turn_ids)


def _params(params: Any, default: GamParams) -> GamParams:
    if params is None:
        return default
    if not isinstance(params, GamParams):
        raise ValueError(f"params must be GamParams, got {type(params).__name__}")
    return params


def _dots(q: Tensor, emb: Tensor, rows: Tensor, valid: Tensor) -> Tensor:
    """``[Q, W]`` dot products of each question with ``emb[rows[q]]``: one matrix
    product per conversation (questions sharing a block share its rows)."""
    Q, W = rows.shape
    out = torch.zeros(Q, W)
    if Q == 0 or W == 0:
        return out
    first = rows[:, 0]
    n = valid.sum(1)
    block = first * (W + 1) + n
    for b in block.unique().tolist():
        sel = torch.nonzero(block == b).flatten()
        f, k = int(first[sel[0]]), int(n[sel[0]])
        out[sel, :k] = q[sel] @ emb[f:f + k].T
    return out


def consolidate(ev: EventTable, starts: Tensor, encoder: Any, p: GamParams, *,
                store: Any = None, judge: Optional[Callable] = None) -> tuple[Topics, dict]:
    """Topics of the segmented events and their TAN edges (all conversations at once)."""
    t0 = time.perf_counter()
    s_idx = torch.nonzero(starts).flatten()
    event_ptr = torch.cat([s_idx, torch.tensor([len(ev)])])
    T = s_idx.numel()
    conv = ev.conv[s_idx] if T else torch.zeros(0, dtype=torch.long)
    raw = raw_embeddings(ev.emb, event_ptr)
    ptr = event_ptr.tolist()
    raw_texts = ["\n".join(ev.texts[ptr[k]:ptr[k + 1]]) for k in range(T)]
    t1 = time.perf_counter()
    summaries = summarize(raw_texts, p.summaries)
    t2 = time.perf_counter()
    s_emb, _ = encode_unique(encoder, summaries, store=store)
    s_emb = torch.nn.functional.normalize(s_emb.float(), dim=-1) if T else raw.clone()
    t3 = time.perf_counter()
    key = topic_keys(raw, s_emb)
    sims, index, valid = candidate_rows(key, conv, torch.arange(T), p.tan_m)
    src, dst, conf, rel = accept_links(sims, index, valid, torch.arange(T),
                                       candidates=p.tan_candidates, conf_min=p.conf_min,
                                       min_earlier=p.min_earlier, judge=judge,
                                       texts=summaries)
    order = torch.argsort(src * max(T, 1) + dst)  # canonical edge order: (src, dst)
    src, dst, conf, rel = src[order], dst[order], conf[order], [rel[i] for i in order.tolist()]
    t4 = time.perf_counter()
    topics = Topics(event_ptr, conv, raw, s_emb, key, summaries, src, dst, conf, rel)
    return topics, {"consolidate_s": t1 - t0, "summaries_s": t2 - t1,
                    "encode_summaries_s": t3 - t2, "link_s": t4 - t3}
