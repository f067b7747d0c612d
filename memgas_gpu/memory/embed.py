"""Embed the granularities of a dataset: one encoder call per distinct text."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ..data.model import Dataset, Session
from ..expand.expansion import Expansion

__all__ = ["encode_unique", "SessionTable", "embed_sessions"]


def encode_unique(encoder: Any, texts: Sequence[str], store: Any = None,
                  progress: Optional[bool] = None) -> tuple[Tensor, dict]:
    """Embed ``texts`` encoding each distinct string once.

    Args:
        encoder: an :class:`~memgas_gpu.encode.Encoder` (or anything with
            ``encode(list[str]) -> Tensor``).
        texts: texts, duplicates allowed.
        store: optional :class:`~memgas_gpu.encode.EmbeddingStore`: embeddings are then
            read from / committed to disk (resumable, shared across runs).
        progress: progress bar.

    Returns:
        ``(embeddings [len(texts), d] float32, stats)`` with ``stats`` =
        ``{"texts": n, "distinct": u, "encoded": e}``.
    """
    first: dict[str, int] = {}
    inverse = [first.setdefault(t, len(first)) for t in texts]
    unique = list(first)
    if store is not None:
        emb = store.encode(encoder, unique, progress=progress)
        encoded = getattr(store, "n_encoded", len(unique))
    else:
        emb = (encoder.encode(unique, progress=progress) if unique
               else torch.zeros(0, int(getattr(encoder, "dim", 0))))
        encoded = len(unique)
    emb = emb.float()
    idx = torch.tensor(inverse, dtype=torch.long)
    out = emb[idx] if len(texts) else emb[:0]
    return out, {"texts": len(texts), "distinct": len(unique), "encoded": int(encoded)}


@dataclass
class SessionTable:
    """Embeddings per distinct session.

    Attributes:
        gran: ``[n_distinct, 4, d]``: session text S, mean of turn embeddings T (zeros
            for a session without turns), summary U, keywords K.
        dense: table name → ``[n_distinct, d]`` embedding of a text of each session
            (``"concat"``: ``"{summary} {keywords} {session}"``, the reference's "hybrid"
            text; the tables of registered signals with a text of their own).
        sessions: the distinct Session objects, in table order.
        turns: ``[n_turns, d]`` embedding of every turn of the distinct sessions (table
            order), or None; session ``j``'s turns are ``turn_ptr[j]:turn_ptr[j+1]``.
        turn_ptr: ``[n_distinct + 1]`` int64, or None.
    """

    gran: Tensor
    dense: dict
    sessions: list[Session]
    turns: Optional[Tensor] = None
    turn_ptr: Optional[Tensor] = None

    @property
    def concat(self) -> Optional[Tensor]:
        return self.dense.get("concat")


def embed_sessions(ds: Dataset, exp: Expansion, encoder: Any, *, store: Any = None,
                   tables: Optional[dict] = None, progress: Optional[bool] = None
                   ) -> tuple[SessionTable, dict]:
    """S, T (turn mean), U, K embeddings for every distinct session, and the dense
    ``tables`` (``{name: text(session, summary, keywords) -> str}``)."""
    slot: dict[tuple, int] = {}
    sessions: list[Session] = []
    u_text: list[str] = []
    k_text: list[str] = []
    tables = dict(tables or {})
    extra: dict = {name: [] for name in tables}
    for c in ds:
        for s, u, k in zip(c.sessions, exp.summaries[c.id], exp.keywords[c.id]):
            if s.key in slot:
                continue
            slot[s.key] = len(sessions)
            sessions.append(s)
            u_text.append(u)
            k_text.append(k)
            for name, fn in tables.items():
                extra[name].append(fn(s, u, k))
    n = len(sessions)
    turn_counts = [len(s.turns) for s in sessions]
    texts = ([s.text for s in sessions] + [t for s in sessions for t in s.turns]
             + u_text + k_text + [x for name in tables for x in extra[name]])
    emb, stats = encode_unique(encoder, texts, store=store, progress=progress)
    d = emb.shape[1]
    s_emb = emb[:n]
    n_turns = sum(turn_counts)
    t_flat = emb[n:n + n_turns]
    off = n + n_turns
    u_emb, k_emb = emb[off:off + n], emb[off + n:off + 2 * n]
    dense = {name: emb[off + (2 + i) * n:off + (3 + i) * n] for i, name in enumerate(tables)}
    # T = mean of the session's turn embeddings (zeros when it has none), as the reference
    owner = torch.repeat_interleave(torch.arange(n), torch.tensor(turn_counts, dtype=torch.long))
    t_sum = torch.zeros(n, d).index_add_(0, owner, t_flat)
    t_emb = t_sum / torch.tensor(turn_counts, dtype=torch.float32).clamp_min(1).unsqueeze(1)
    gran = torch.stack([s_emb, t_emb, u_emb, k_emb], dim=1)
    turn_ptr = torch.cat([torch.zeros(1, dtype=torch.long),
                          torch.tensor(turn_counts, dtype=torch.long).cumsum(0)])
    return SessionTable(gran, dense, sessions, t_flat, turn_ptr), stats
