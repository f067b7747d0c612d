"""The write path of a memory index: what ``add_session`` checks, encodes and links."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import ops
from .._io import find_surrogate
from ..data.model import Session
from ..granularity import CODES, N_GRAN
from .embed import encode_unique
from ..ops.csr import csr_edges
from ..retrieve.filters import check_date
from ..retrieve.graphs import candidates
from ..retrieve.params import GraphParams
from ..retrieve.signals import signal_texts

__all__ = ["check_session", "session_texts", "Encoded", "encode_session",
           "stored_encoding", "append_session", "grow_graph"]


def check_session(conversation_id, session, summary, keywords) -> None:
    """Refuse, before anything changes, what :meth:`MemoryIndex.add_session` cannot store
    (one line naming the field)."""
    if not isinstance(conversation_id, str) or not conversation_id:
        raise TypeError(f"conversation_id must be a non-empty string, got "
                        f"{conversation_id!r}")
    if not isinstance(session, Session):
        raise TypeError(f"session must be a memgas_gpu.Session, got {type(session).__name__}"
                        " (Session.from_messages builds one from chat messages)")
    if not isinstance(session.id, str) or not session.id:
        raise TypeError(f"session.id must be a non-empty string, got {session.id!r}")
    if not isinstance(session.date, str):
        raise TypeError(f"session {session.id!r}: date must be a string ('' when "
                        f"unknown), got {session.date!r}")
    if not isinstance(session.turns, (tuple, list)) or \
            not all(isinstance(t, str) for t in session.turns):
        raise TypeError(f"session {session.id!r}: turns must be a tuple of strings")
    for name, value in (("summary", summary), ("keywords", keywords)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a string or None, got {type(value).__name__}")
    bad = find_surrogate({"conversation_id": conversation_id, "session.id": session.id,
                          "session.date": session.date, "session.turns": list(session.turns),
                          "summary": summary or "", "keywords": keywords or ""})
    if bad is not None:
        raise ValueError(f"{bad} holds a lone UTF-16 surrogate (not valid Unicode text); "
                         "nothing was added")
    check_date(session.date, f"session {session.id!r}: date")


def session_texts(session: Session, summary, keywords) -> tuple[str, str]:
    """The summary and keyword texts ``add_session`` stores: the given ones, else the
    offline extractor's on this session alone."""
    if summary is None or keywords is None:
        from ..expand.offline import OfflineExtractor

        u, k = OfflineExtractor().expand([session.text], progress=False)
        summary = u[0] if summary is None else summary
        keywords = k[0] if keywords is None else keywords
    return summary, keywords


@dataclass(frozen=True)
class Encoded:
    """The embeddings of one stored session: ``row`` ``[N_GRAN, d]`` (S, T = mean of
    the turns, U, K), ``dense`` ``{table: [d]}`` (every dense table the index stores),
    ``turns`` ``[n_turns, d]``.  What the write-ahead log keeps of an add, so that a
    replay links exactly what was acknowledged, without the encoder."""

    row: Tensor
    dense: dict
    turns: Tensor


def _check_registered(store) -> tuple[dict, dict]:
    dense_fn, lexical_fn = signal_texts("dense"), signal_texts("lexical")
    missing = [k for k in store.dense if k not in dense_fn] + \
        [k for k in (store.terms or {}) if k not in CODES and k not in lexical_fn]
    if missing:
        raise ValueError(f"this index stores data of the signal table(s) {missing}, whose "
                         "signals are not registered in this process: register them before "
                         "adding sessions")
    return dense_fn, lexical_fn


def encode_session(store, session: Session, summary: str, keywords: str, enc,
                   dim: int) -> Encoded:
    """Encode a new distinct session's texts (each distinct text once); checks the
    embeddings (width ``dim``, finite) before anything changes."""
    dense_fn, _ = _check_registered(store)
    names = list(store.dense)
    texts = [session.text, *session.turns, summary, keywords,
             *(dense_fn[k](session, summary, keywords) for k in names)]
    emb, _ = encode_unique(enc, texts, progress=False)
    if emb.shape[-1] != dim:
        raise ValueError(f"the encoder gives {emb.shape[-1]}-dimensional embeddings; "
                         f"this index holds {dim}")
    if not bool(torch.isfinite(emb).all()):
        raise ValueError(f"session {session.id!r}: the encoder returned NaN or infinite "
                         "embeddings; nothing was added")
    nt = len(session.turns)
    t = emb[1:1 + nt].mean(0) if nt else torch.zeros(emb.shape[-1])
    row = torch.stack([emb[0], t, emb[1 + nt], emb[2 + nt]])
    return Encoded(row, {k: emb[3 + nt + i] for i, k in enumerate(names)}, emb[1:1 + nt])


def stored_encoding(tables, slot: int) -> Encoded:
    """The :class:`Encoded` of a session the store holds in ``slot``."""
    turns = (tables.turns[int(tables.turn_ptr[slot]):int(tables.turn_ptr[slot + 1])]
             if tables.turns is not None else torch.zeros(0, tables.gran.shape[-1]))
    return Encoded(tables.gran[slot], {k: v[slot] for k, v in tables.dense.items()}, turns)


def append_session(store, session: Session, summary: str, keywords: str,
                   encoded: Encoded, digest: bytes) -> int:
    """Tokenise a new distinct session (its texts from :func:`session_texts`, its
    embeddings from :func:`encode_session` or a log record) and append it to ``store``;
    returns its slot.

    Raises:
        ValueError: the embeddings do not fit the store (nothing changed).
    """
    _, lexical_fn = _check_registered(store)
    d = store.gran.buf.shape[-1]
    nt = len(session.turns)
    if tuple(encoded.row.shape) != (N_GRAN, d) or set(encoded.dense) != set(store.dense) \
            or any(tuple(v.shape) != (d,) for v in encoded.dense.values()) \
            or (store.turns is not None and tuple(encoded.turns.shape) != (nt, d)):
        raise ValueError(f"session {session.id!r}: embeddings of another shape than this "
                         "index stores; nothing was added")
    docs = None
    if store.lexical is not None:
        from ..lexical import TermMatrix

        lex = store.lexical
        parts = {"S": [session.text], "T": list(session.turns), "U": [summary],
                 "K": [keywords]}
        for k in store.terms:
            if k not in parts:
                parts[k] = [lexical_fn[k](session, summary, keywords)]
        docs = {g: TermMatrix.from_ids([lex.vocab.encode(lex.tokenizer.tokens(x))
                                        for x in parts[g]]) for g in store.terms}
    return store.append(encoded.row, encoded.dense, encoded.turns, session.turns, docs,
                        digest)


def grow_graph(graph, gran: Tensor, p: GraphParams):
    """Local ``graph`` of a conversation with its new last session linked (only its
    nodes get new edges, as in a rebuild); ``gran``: ``[n, N_GRAN, d]``."""
    n = int(gran.shape[0])
    emb = gran.reshape(n * N_GRAN, -1)
    sess = torch.arange(n).repeat_interleave(N_GRAN)
    gmm = p.rule == "gmm"
    new = ops.association_edges(emb, sess.to(emb.device), m=candidates(p, n * N_GRAN),
                                skip_sessions=p.skip_sessions,
                                accept="gmm" if gmm else "all",
                                first_node=(n - 1) * N_GRAN).cpu()
    return ops.symmetric_csr(torch.cat([csr_edges(*graph), new], dim=1), n * N_GRAN)
