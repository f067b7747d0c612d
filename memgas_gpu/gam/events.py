"""Events (utterances) of many conversations packed in tensors, and their local links.

GAM's memory unit is the *event*: one utterance ``[speaker]: text`` (a
:attr:`~memgas_gpu.data.model.Session.messages` entry, not the library's paired turns).
:class:`EventTable` holds every event of a dataset, conversation by conversation
(``conv_ptr[c]:conv_ptr[c+1]``), sessions in order, with what the write and read paths
need: the embedding, the token count (for token windows and the 2,048-token buffer cap),
the session position, the speaker and whether the text carries a time anchor.

The Event Progression Graph (EPG) links an event to the previous event of its session
(temporal order) and to the most similar of the few events before it in its buffer
(local semantic link): :func:`epg_links`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from ..data.model import Dataset
from ..data.speakers import speaker_of
from ..memory.embed import encode_unique

__all__ = ["EventTable", "build_events", "has_time_anchor", "count_tokens", "epg_links",
           "check_event_inputs"]

_MONTHS = ("january|february|march|april|may|june|july|august|september|october|"
           "november|december|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec")
_TIME = re.compile(
    r"\b(?:(?:19|20)\d\d|" + _MONTHS + r"|monday|tuesday|wednesday|thursday|friday|"
    r"saturday|sunday|weekend|yesterday|today|tonight|tomorrow|ago|last (?:week|month|"
    r"year|night|time)|next (?:week|month|year)|this (?:week|month|year|morning|"
    r"evening)|recently|lately|\d{1,2}(?::\d\d)?\s?(?:am|pm)|(?:a|one|two|three|few|"
    r"couple of) (?:days?|weeks?|months?|years?))\b", re.I)


def has_time_anchor(text: str) -> bool:
    """True when ``text`` names a date or time (years, months, weekdays, relative times
    such as "yesterday", "last week", "two days ago"): GAM's time factor favours such
    events for temporal questions."""
    return _TIME.search(text) is not None


def count_tokens(encoder: Any, texts: Sequence[str]) -> list[int]:
    """Tokens of each text: the encoder's tokenizer when it has ``count_tokens``,
    else whitespace words."""
    if hasattr(encoder, "count_tokens") and texts:
        return list(encoder.count_tokens(list(texts)))
    return [len(t.split()) for t in texts]


def check_event_inputs(emb: Tensor, tokens: Sequence, what: str,
                       dim: Optional[int] = None,
                       label: Optional[Callable[[int], str]] = None) -> None:
    """Refuse embeddings and token counts a memory cannot rank with (one line).

    Args:
        emb: ``[n, d]`` event embeddings: floats, finite, ``d == dim`` when given.
        tokens: ``n`` token counts: integers ``>= 0``.
        what: what the values are, for the message (e.g. ``"GamWriter.add"``).
        label: optional name of row ``i`` for the message (e.g. its turn id).

    Raises:
        ValueError: naming ``what`` and the first bad row.
    """
    def row(i: int) -> str:
        return f"{i} ({label(i)})" if label is not None else str(i)

    if not isinstance(emb, Tensor) or emb.dim() != 2 or not emb.is_floating_point():
        raise ValueError(f"{what}: embeddings must be a float tensor [n, d], got "
                         f"{type(emb).__name__} {tuple(getattr(emb, 'shape', ()))}")
    if dim is not None and emb.shape[1] != dim:
        raise ValueError(f"{what}: embedding width {emb.shape[1]}, the memory's is {dim}")
    if emb.shape[0] != len(tokens):
        raise ValueError(f"{what}: {emb.shape[0]} embeddings for {len(tokens)} token counts")
    bad = ~torch.isfinite(emb).all(1)
    if bool(bad.any()):
        raise ValueError(f"{what}: embedding {row(int(torch.nonzero(bad)[0]))} has NaN or "
                         "infinite values")
    ok = [isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))
          for t in tokens] if not isinstance(tokens, Tensor) else None
    t = torch.as_tensor([int(x) if k else -1 for x, k in zip(tokens, ok)]
                        if ok is not None else tokens)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise ValueError(f"{what}: token counts must be integers, got {t.dtype}")
    neg = t < 0
    if bool(neg.any()):
        i = int(torch.nonzero(neg)[0])
        got = tokens[i] if ok is not None else int(t[i])
        raise ValueError(f"{what}: token count {row(i)} must be an integer >= 0, "
                         f"got {got!r}")


@dataclass
class EventTable:
    """Every event of a dataset, packed.

    Attributes:
        texts: event texts ``[speaker]: content``, conversation by conversation.
        turn_ids: ``"session_id:message_index"`` of each event (the evidence ids).
        emb: ``[E, d]`` float32 L2-normalised embeddings.
        tokens: ``[E]`` int64 token counts.
        session: ``[E]`` int64 session position within the conversation.
        speaker: ``[E]`` int64 speaker id, indexing ``speakers`` (per dataset).
        speakers: speaker names.
        time_anchor: ``[E]`` bool (:func:`has_time_anchor`).
        conv_ptr: ``[C+1]`` int64, conversation ``c`` owns events ``conv_ptr[c]:conv_ptr[c+1]``.
        conv_ids: conversation ids.
    """

    texts: list[str]
    turn_ids: list[str]
    emb: Tensor
    tokens: Tensor
    session: Tensor
    speaker: Tensor
    speakers: list[str]
    time_anchor: Tensor
    conv_ptr: Tensor
    conv_ids: list[str]

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def conv(self) -> Tensor:
        """``[E]`` conversation position of each event."""
        counts = self.conv_ptr[1:] - self.conv_ptr[:-1]
        return torch.repeat_interleave(torch.arange(counts.numel()), counts)

    @property
    def session_start(self) -> Tensor:
        """``[E]`` bool: the event opens a session (or a conversation)."""
        first = torch.ones(len(self), dtype=torch.bool)
        if len(self) > 1:
            first[1:] = (self.session[1:] != self.session[:-1]) | (self.conv[1:] != self.conv[:-1])
        return first


def build_events(dataset: Dataset, encoder: Any, *, store: Any = None,
                 emb: Optional[Tensor] = None, progress: Optional[bool] = False) -> EventTable:
    """Events of every conversation of ``dataset``, each distinct text encoded once.

    Args:
        dataset: a loaded dataset (sessions with :attr:`Session.messages`).
        encoder: an :class:`~memgas_gpu.encode.Encoder` (anything with ``encode``; its
            ``count_tokens`` when present gives the token counts).
        store: optional :class:`~memgas_gpu.encode.EmbeddingStore` (encode once, on disk).
        emb: precomputed ``[E, d]`` embeddings in event order (skips the encoder call).
        progress: progress bar of the encoder.
    """
    texts, turn_ids, session, speaker, conv_of, ptr = [], [], [], [], [], [0]
    names: dict[str, int] = {}
    for c in dataset:
        for si, s in enumerate(c.sessions):
            for j, m in enumerate(s.messages):
                texts.append(m)
                turn_ids.append(f"{s.id}:{j}")
                conv_of.append(c.id)
                session.append(si)
                speaker.append(names.setdefault(speaker_of(m), len(names)))
        ptr.append(len(texts))
    if emb is None:
        emb, _ = encode_unique(encoder, texts, store=store, progress=progress)
    tokens = count_tokens(encoder, texts)
    if len(texts):
        check_event_inputs(emb, tokens, f"events of {dataset.source or 'the dataset'}",
                           label=lambda i: f"{conv_of[i]} {turn_ids[i]}")
        emb = torch.nn.functional.normalize(emb.float(), dim=-1)
    else:
        emb = torch.zeros(0, getattr(encoder, "dim", 1))
    return EventTable(
        texts=texts, turn_ids=turn_ids, emb=emb,
        tokens=torch.tensor(tokens, dtype=torch.long),
        session=torch.tensor(session, dtype=torch.long),
        speaker=torch.tensor(speaker, dtype=torch.long), speakers=list(names),
        time_anchor=torch.tensor([has_time_anchor(t) for t in texts], dtype=torch.bool),
        conv_ptr=torch.tensor(ptr, dtype=torch.long), conv_ids=[c.id for c in dataset])


def epg_links(emb: Tensor, topic: Tensor, window: int = 4) -> tuple[Tensor, Tensor]:
    """Edges of the Event Progression Graphs of all topics at once.

    Every event is linked to the previous event of its topic (temporal edge) and to the
    most similar of the ``window`` events before it in its topic (local semantic edge;
    it may be the same event, then there is one edge).

    Args:
        emb: ``[E, d]`` normalised event embeddings.
        topic: ``[E]`` topic id of each event (events of a topic are contiguous).
        window: look-back of the local semantic link.

    Returns:
        ``(src, dst)`` int64 edges from each event to an earlier event of its topic
        (undirected in use), sorted by ``src``.
    """
    E = emb.shape[0]
    if E < 2:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    idx = torch.arange(E)
    lag = torch.arange(1, window + 1)
    prev = idx[:, None] - lag[None, :]  # [E, w]
    ok = (prev >= 0)
    prev_c = prev.clamp_min(0)
    ok &= topic[prev_c] == topic[:, None]
    sim = (emb[:, None, :] * emb[prev_c]).sum(-1).masked_fill(~ok, -float("inf"))
    best = sim.argmax(1)
    has = ok[:, 0]
    src = torch.cat([idx[has], idx[has]])
    dst = torch.cat([prev_c[has, 0], prev_c[has, best[has]]])
    keep = torch.ones_like(src, dtype=torch.bool)
    n = int(has.sum())
    keep[n:] = dst[n:] != dst[:n]
    src, dst = src[keep], dst[keep]
    order = torch.argsort(src * E + dst)
    return src[order], dst[order]
