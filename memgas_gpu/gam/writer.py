"""The online writer: utterances as they arrive, consolidated at boundaries.

:meth:`GamWriter.add` appends one event (its embedding and token count given: encoding
is the caller's, e.g. ``Encoder.encode``) to the buffer of its conversation, after
checking the boundary rule of :mod:`memgas_gpu.gam.boundary` on it; a boundary first
consolidates the buffer into a topic node (:mod:`memgas_gpu.gam.topics`): c_raw, c_sum
(summary + its embedding through ``encode``), TAN edges to earlier topics. Every
decision calls the same functions as the offline build with one row, so writing a
dataset's stream gives the memory :meth:`GamIndex.build` gives (tests/test_gam_writer.py).
:meth:`GamWriter.index` returns that memory as a :class:`GamIndex`.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ..data.model import Dataset
from .boundary import divergence, parse_segmentation, window_context
from .events import EventTable, has_time_anchor, speaker_of
from .index import GamIndex, GamParams
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


class GamWriter:
    """Incremental GAM memory of many conversations.

    Args:
        encode: ``encode(list[str]) -> Tensor [n, d]`` for the c_sum summaries (e.g.
            ``Encoder.encode``; wrap an :class:`EmbeddingStore` to serve cached ones).
        params: :class:`GamParams` (the write settings are used; ``noise`` is not).
        judge: optional relation judge (see :func:`~memgas_gpu.gam.topics.accept_links`).
    """

    def __init__(self, encode: Callable, params: Optional[GamParams] = None,
                 judge: Optional[Callable] = None) -> None:
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
        # per-conversation state
        self._sessions: dict[int, dict[str, int]] = {}
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
    def add(self, conversation_id: str, session_id: str, text: str, emb: Tensor,
            tokens: int) -> Optional[int]:
        """Append one utterance; returns the id of the topic consolidated before it (a
        boundary), else None."""
        if not self.conv_ids or self.conv_ids[-1] != conversation_id:
            if conversation_id in self.conv_ids:
                raise ValueError(f"conversation {conversation_id!r} was already closed: "
                                 "write each conversation's utterances together")
            self.conv_ids.append(conversation_id)
            self._sessions[len(self.conv_ids) - 1] = {}
        c = len(self.conv_ids) - 1
        sessions = self._sessions[c]
        new_session = session_id not in sessions
        if new_session:
            sessions[session_id] = len(sessions)
        elif self.session[-1] != sessions[session_id] or self.conv_of[-1] != c:
            raise ValueError(f"session {session_id!r} of {conversation_id!r} came back "
                             "after another session")
        x = torch.nn.functional.normalize(emb.float().reshape(1, -1), dim=-1)[0]
        i = len(self.texts)
        made = None
        with _one_thread():
            boundary = new_session or self._boundary(x, int(tokens), i)
            if boundary:
                made = self._consolidate(i)
                self._buf_start, self._buf_tokens = i, 0
        if new_session:
            self._recent, self._pos_in_session = [], 0
        self.texts.append(text)
        self.turn_ids.append(f"{session_id}:{self._pos_in_session}")
        self.emb.append(x)
        self.tokens.append(int(tokens))
        self.session.append(sessions[session_id])
        self.speaker.append(self.speakers.setdefault(speaker_of(text), len(self.speakers)))
        self.conv_of.append(c)
        self.starts.append(boundary)
        self._buf_tokens += int(tokens)
        self._pos_in_session += 1
        self._recent = (self._recent + [x])[-max(self.p.window, 1):]
        return made

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
        """Consolidate what is buffered (end of the stream); returns the topic id."""
        with _one_thread():
            made = self._consolidate(len(self.texts))
        self._buf_start, self._buf_tokens = len(self.texts), 0
        return made

    def _consolidate(self, end: int) -> Optional[int]:
        a = self._buf_start
        if end <= a:
            return None
        k = len(self.event_ptr)
        c = self.conv_of[a]
        self.event_ptr.append(a)
        self.t_conv.append(c)
        raw = raw_embeddings(torch.stack(self.emb[a:end]), torch.tensor([0, end - a]))[0]
        summary = summarize(["\n".join(self.texts[a:end])], self.p.summaries)[0]
        s_emb = torch.nn.functional.normalize(self.encode([summary]).float(), dim=-1)[0]
        self.raw.append(raw)
        self.sum_emb.append(s_emb)
        self.summaries.append(summary)
        keys = self.keys.setdefault(c, [])
        keys.append(topic_keys(raw[None], s_emb[None])[0])
        local = len(keys) - 1
        first = k - local
        K = torch.stack(keys)
        sims, index, valid = candidate_rows(K, torch.zeros(len(keys), dtype=torch.long),
                                            torch.tensor([local]), self.p.tan_m)
        src, dst, conf, rel = accept_links(sims, index, valid, torch.tensor([local]),
                                           candidates=self.p.tan_candidates,
                                           conf_min=self.p.conf_min,
                                           min_earlier=self.p.min_earlier, judge=self.judge,
                                           texts=self.summaries[first:])
        for s, d, f, r in zip(src.tolist(), dst.tolist(), conf.tolist(), rel):
            self.edges.append((s + first, d + first, f, r))
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
