"""The online writer: utterances as they arrive, consolidated at boundaries.

:meth:`GamWriter.add` appends one event (its embedding and token count given: encoding
is the caller's, e.g. ``Encoder.encode``) to the buffer of its conversation, after
checking the boundary rule of :mod:`memgas_gpu.gam.boundary` on it; a boundary first
consolidates the buffer into a topic node (:mod:`memgas_gpu.gam.topics`): c_raw, c_sum
(summary + its embedding through ``encode``), TAN edges to earlier topics. Every
decision calls the same functions as the offline build with one row, so writing a
dataset's stream gives the memory :meth:`GamIndex.build` gives (tests/test_gam_writer.py).
:meth:`GamWriter.index` returns that memory as a :class:`GamIndex`.

A write is checked at the door (types, finite embedding of the memory's width, token
count ``>= 0``) and is all-or-nothing: everything a write computes (the boundary, the
topic: summary, ``encode``, candidates, links, the judge) is computed first and stored
only when all of it succeeded, so a failed or refused write leaves the writer exactly
as it was, and the same write can be retried.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import Tensor

from ..data.model import Dataset
from ..data.speakers import speaker_of
from .boundary import divergence, window_context
from .events import EventTable, check_event_inputs, has_time_anchor
from .index import GamIndex
from .params import GamParams, parse_segmentation
from .topics import Topics, accept_links, candidate_rows, raw_embeddings, summarize, topic_keys

__all__ = ["GamWriter"]


@contextmanager
def _one_thread():
    """Run one write on one thread: its tensors are a few rows, and waking an intra-op
    thread team costs more than the work (on a loaded machine, 100+ ms for one
    ``index_add_`` or one GMM row; docs/gam.md)."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@dataclass
class _Topic:
    """A consolidation computed but not yet stored (see :meth:`GamWriter._plan_topic`)."""

    first_event: int
    conv: int
    raw: Tensor
    summary: str
    sum_emb: Tensor
    key: Tensor
    edges: list


def _text(name: str, value: Any, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ValueError(f"GamWriter.add: {name} must be a string, got "
                         f"{type(value).__name__} {value!r:.40}")
    if not empty and not value:
        raise ValueError(f"GamWriter.add: {name} must not be empty")
    return value


def _tokens(value: Any) -> int:
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point() \
            and value.dtype != torch.bool and not value.is_complex():
        value = int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 0:
        raise ValueError(f"GamWriter.add: tokens must be an integer >= 0, got {value!r:.40}")
    return int(value)


class GamWriter:
    """Incremental GAM memory of many conversations.

    Args:
        encode: ``encode(list[str]) -> Tensor [n, d]`` for the c_sum summaries (e.g.
            ``Encoder.encode``; wrap an :class:`EmbeddingStore` to serve cached ones).
        params: :class:`GamParams` (the write settings are used; ``noise`` is not).
        judge: optional relation judge (see :func:`~memgas_gpu.gam.topics.accept_links`).

    Raises:
        ValueError: from :meth:`add` for a refused write (nothing changed).
    """

    def __init__(self, encode: Callable, params: Optional[GamParams] = None,
                 judge: Optional[Callable] = None) -> None:
        if not callable(encode):
            raise ValueError(f"GamWriter: encode must be callable, got {type(encode).__name__}")
        if params is not None and not isinstance(params, GamParams):
            raise ValueError(f"GamWriter: params must be GamParams, got {type(params).__name__}")
        if judge is not None and not callable(judge):
            raise ValueError(f"GamWriter: judge must be callable, got {type(judge).__name__}")
        self.encode = encode
        self.p = params or GamParams()
        self.kind, self.n = parse_segmentation(self.p.segmentation)
        self.judge = judge
        # the event table, growing
        self.texts: list[str] = []
        self.turn_ids: list[str] = []
        self.emb: list[Tensor] = []
        self.tokens: list[int] = []
        self.session: list[int] = []
        self.speaker: list[int] = []
        self.speakers: dict[str, int] = {}
        self.conv_ids: list[str] = []
        self.conv_of: list[int] = []
        self.starts: list[bool] = []
        #: embedding width of the memory (set by the first write)
        self.dim: Optional[int] = None
        # per-conversation state
        self._sessions: dict[int, dict[str, int]] = {}
        self._sessions_of: dict[str, int] = {}  # conversation id -> position
        self._recent: list[Tensor] = []  # last `window` events of the current session
        self._pos_in_session = 0
        self._buf_start = 0
        self._buf_tokens = 0
        # topics
        self.event_ptr: list[int] = []
        self.t_conv: list[int] = []
        self.raw: list[Tensor] = []
        self.sum_emb: list[Tensor] = []
        self.keys: dict[int, list[Tensor]] = {}
        self.summaries: list[str] = []
        self.edges: list[tuple[int, int, float, str]] = []

    # ------------------------------------------------------------------ writing
    def add(self, conversation_id: str, session_id: str, text: str, emb: Any,
            tokens: int) -> Optional[int]:
        """Append one utterance; returns the id of the topic consolidated before it (a
        boundary), else None.

        Args:
            conversation_id, session_id: non-empty strings; a conversation's utterances
                come together, a session's utterances together and in order.
            text: the utterance, ``[speaker]: text``.
            emb: its embedding ``[d]`` (or ``[1, d]``): finite numbers, the width of
                every other write.
            tokens: its token count, an integer ``>= 0``.

        Raises:
            ValueError: a refused write (bad input, a closed conversation, a session
                coming back, an ``encode`` result of the wrong shape); the writer is
                unchanged. Any exception of ``encode``, the summary source or the
                judge also leaves it unchanged.
        """
        conversation_id = _text("conversation_id", conversation_id)
        session_id = _text("session_id", session_id)
        text = _text("text", text, empty=True)
        tok = _tokens(tokens)
        x = self._embedding(emb, f"{conversation_id} {session_id}")
        who = speaker_of(text)
        new_conv = not self.conv_ids or self.conv_ids[-1] != conversation_id
        if new_conv and conversation_id in self._sessions_of:
            raise ValueError(f"conversation {conversation_id!r} was already closed: "
                             "write each conversation's utterances together")
        c = len(self.conv_ids) - (0 if new_conv else 1)
        sessions = {} if new_conv else self._sessions[c]
        new_session = session_id not in sessions
        if not new_session and self.session[-1] != sessions[session_id]:
            raise ValueError(f"session {session_id!r} of {conversation_id!r} came back "
                             "after another session")
        i = len(self.texts)
        topic = None
        with _one_thread():  # everything that can fail, before anything is stored
            boundary = new_session or self._boundary(x, tok, i)
            if boundary:
                topic = self._plan_topic(i)
        # ---- commit: plain appends from here on
        if new_conv:
            self.conv_ids.append(conversation_id)
            self._sessions[c] = sessions
            self._sessions_of[conversation_id] = c
        if new_session:
            sessions[session_id] = len(sessions)
        made = self._store_topic(topic) if topic is not None else None
        if boundary:
            self._buf_start, self._buf_tokens = i, 0
        if new_session:
            self._recent, self._pos_in_session = [], 0
        self.dim = x.numel()
        self.texts.append(text)
        self.turn_ids.append(f"{session_id}:{self._pos_in_session}")
        self.emb.append(x)
        self.tokens.append(tok)
        self.session.append(sessions[session_id])
        self.speaker.append(self.speakers.setdefault(who, len(self.speakers)))
        self.conv_of.append(c)
        self.starts.append(boundary)
        self._buf_tokens += tok
        self._pos_in_session += 1
        self._recent = (self._recent + [x])[-max(self.p.window, 1):]
        return made

    def _embedding(self, emb: Any, where: str) -> Tensor:
        """``emb`` as a normalised float32 ``[d]`` row, refused unless finite and of the
        memory's width."""
        try:
            t = torch.as_tensor(emb)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"GamWriter.add: emb must be a vector of numbers, got "
                             f"{type(emb).__name__}") from None
        if t.dtype == torch.bool or t.is_complex() or t.dim() not in (1, 2) or \
                (t.dim() == 2 and t.shape[0] != 1) or t.numel() == 0:
            raise ValueError(f"GamWriter.add: emb must be a [d] or [1, d] vector of real "
                             f"numbers, got {t.dtype} {tuple(t.shape)}")
        t = t.float().reshape(1, -1)
        check_event_inputs(t, [0], f"GamWriter.add ({where})", dim=self.dim)
        return torch.nn.functional.normalize(t, dim=-1)[0]

    def _boundary(self, x: Tensor, tokens: int, i: int) -> bool:
        kind, buf = self.kind, i - self._buf_start
        if kind == "event":
            return True
        if kind == "turns":
            return self._pos_in_session % self.n == 0
        cap = self.n if kind == "tokens" else (self.p.max_tokens if kind == "semantic"
                                               else math.inf)
        if buf > 0 and self._buf_tokens + tokens > cap:
            return True
        if kind == "semantic" and buf >= max(self.p.min_events, 1):
            w = self.p.window
            recent = torch.stack(self._recent) if self._recent else x[None] * 0
            n = len(self._recent)
            lags = torch.arange(1, w + 1)
            prev = (n - lags).clamp_min(0)[None, :]
            ok = (lags <= n)[None, :]
            d = divergence(x[None], window_context(recent, prev, ok))
            return bool(d[0] > self.p.theta)
        return False

    def flush(self) -> Optional[int]:
        """Consolidate what is buffered (end of the stream); returns the topic id.
        All-or-nothing like :meth:`add`."""
        end = len(self.texts)
        with _one_thread():
            topic = self._plan_topic(end)
        made = self._store_topic(topic) if topic is not None else None
        self._buf_start, self._buf_tokens = end, 0
        return made

    def _plan_topic(self, end: int) -> Optional[_Topic]:
        """The topic of the buffered events ``_buf_start:end`` (None when empty),
        computed without changing the writer."""
        a = self._buf_start
        if end <= a:
            return None
        c = self.conv_of[a]
        raw = raw_embeddings(torch.stack(self.emb[a:end]), torch.tensor([0, end - a]))[0]
        summary = summarize(["\n".join(self.texts[a:end])], self.p.summaries)[0]
        if not isinstance(summary, str):
            raise ValueError(f"GamWriter: the summary source returned "
                             f"{type(summary).__name__}, not a string")
        s_emb = self._summary_embedding(summary)
        key = topic_keys(raw[None], s_emb[None])[0]
        keys = self.keys.get(c, []) + [key]
        local = len(keys) - 1
        first = len(self.event_ptr) - local
        sims, index, valid = candidate_rows(torch.stack(keys),
                                            torch.zeros(len(keys), dtype=torch.long),
                                            torch.tensor([local]), self.p.tan_m)
        src, dst, conf, rel = accept_links(sims, index, valid, torch.tensor([local]),
                                           candidates=self.p.tan_candidates,
                                           conf_min=self.p.conf_min,
                                           min_earlier=self.p.min_earlier, judge=self.judge,
                                           texts=self.summaries[first:] + [summary])
        edges = [(s + first, d + first, f, r)
                 for s, d, f, r in zip(src.tolist(), dst.tolist(), conf.tolist(), rel)]
        return _Topic(a, c, raw, summary, s_emb, key, edges)

    def _summary_embedding(self, summary: str) -> Tensor:
        out = self.encode([summary])
        try:
            out = torch.as_tensor(out)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"GamWriter: encode returned {type(out).__name__}, not a "
                             "tensor") from None
        if out.dim() != 2 or out.shape != (1, self.dim) or not out.is_floating_point():
            raise ValueError(f"GamWriter: encode returned {out.dtype} {tuple(out.shape)} for "
                             f"one summary; expected float [1, {self.dim}]")
        if not bool(torch.isfinite(out).all()):
            raise ValueError("GamWriter: encode returned NaN or infinite values for a summary")
        return torch.nn.functional.normalize(out.float(), dim=-1)[0]

    def _store_topic(self, t: _Topic) -> int:
        """Store a planned topic (plain appends: cannot fail half-way)."""
        k = len(self.event_ptr)
        self.event_ptr.append(t.first_event)
        self.t_conv.append(t.conv)
        self.raw.append(t.raw)
        self.sum_emb.append(t.sum_emb)
        self.summaries.append(t.summary)
        self.keys.setdefault(t.conv, []).append(t.key)
        self.edges.extend(t.edges)
        return k

    # ------------------------------------------------------------------ reading
    def index(self, dataset: Dataset, encoder: Any = None, store: Any = None) -> GamIndex:
        """The memory written so far as a :class:`GamIndex` answering ``dataset``'s
        questions (flush first to consolidate the last buffer)."""
        if self._buf_start < len(self.texts):
            raise ValueError("events are still buffered: call flush() first")
        E = len(self.texts)
        conv_ptr = [0] * (len(self.conv_ids) + 1)
        for c in self.conv_of:
            conv_ptr[c + 1] += 1
        conv_ptr = torch.tensor(conv_ptr).cumsum(0)
        ev = EventTable(self.texts, self.turn_ids,
                        torch.stack(self.emb) if E else torch.zeros(0, 1),
                        torch.tensor(self.tokens, dtype=torch.long),
                        torch.tensor(self.session, dtype=torch.long),
                        torch.tensor(self.speaker, dtype=torch.long), list(self.speakers),
                        torch.tensor([has_time_anchor(t) for t in self.texts], dtype=torch.bool),
                        conv_ptr, list(self.conv_ids))
        T = len(self.event_ptr)
        e = sorted(self.edges)
        topics = Topics(torch.tensor(self.event_ptr + [E], dtype=torch.long),
                        torch.tensor(self.t_conv, dtype=torch.long),
                        torch.stack(self.raw) if T else torch.zeros(0, 1),
                        torch.stack(self.sum_emb) if T else torch.zeros(0, 1),
                        torch.cat([torch.stack(self.keys[c]) for c in sorted(self.keys)])
                        if T else torch.zeros(0, 1), list(self.summaries),
                        torch.tensor([x[0] for x in e], dtype=torch.long),
                        torch.tensor([x[1] for x in e], dtype=torch.long),
                        torch.tensor([x[2] for x in e], dtype=torch.float32),
                        [x[3] for x in e])
        by_id = {c.id: c for c in dataset}
        qs = [q for cid in self.conv_ids for q in by_id[cid].questions]
        q_conv = torch.tensor([i for i, cid in enumerate(self.conv_ids)
                               for _ in by_id[cid].questions], dtype=torch.long)
        return GamIndex(ev, torch.tensor(self.starts, dtype=torch.bool), topics, qs, q_conv,
                        self.p, encoder, {}, store)
