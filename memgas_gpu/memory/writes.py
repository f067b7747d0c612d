"""The write path of a memory index: what ``add_session`` checks, encodes and links."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from .. import ops
from .._io import find_surrogate
from ..data.model import Session
from ..granularity import CODES, N_GRAN
from .embed import encode_unique
from ..ops.csr import csr_edges, empty_csr
from ..retrieve.filters import check_date
from ..retrieve.graphs import candidates
from ..retrieve.params import GraphParams
from ..retrieve.signals import signal_texts
from .store import session_digest

__all__ = ["check_session", "session_texts", "Encoded", "encode_sessions",
           "stored_encoding", "append_session", "grow_graph", "AddOp", "ReplaceOp",
           "RemoveOp", "ForgetOp", "Op", "WriteContext", "apply_ops"]


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


@dataclass(frozen=True)
class AddOp:
    """Append ``session`` (with its texts and embeddings) to a conversation (created
    when new)."""

    conversation_id: str
    session: Session
    summary: str
    keywords: str
    encoded: Encoded
    metadata: Optional[dict] = None


@dataclass(frozen=True)
class ReplaceOp(AddOp):
    """Replace the session of the same id of a conversation, in its place."""


@dataclass(frozen=True)
class RemoveOp:
    """Forget one session of a conversation."""

    conversation_id: str
    session_id: str


@dataclass(frozen=True)
class ForgetOp:
    """Forget a conversation and every session of it."""

    conversation_id: str


#: one operation of a write (a write is one or more, applied all or none)
Op = Union[AddOp, ReplaceOp, RemoveOp, ForgetOp]


def encode_sessions(store, items: list, enc, dim: int) -> list:
    """Encode new distinct sessions, ``items`` = ``[(session, summary, keywords)]``, in
    one encoder call (each distinct text of the whole batch once); returns one
    :class:`Encoded` per item. Checks the embeddings (width ``dim``, finite) before
    anything changes."""
    dense_fn, _ = _check_registered(store)
    names = list(store.dense)
    texts, starts = [], []
    for session, summary, keywords in items:
        starts.append(len(texts))
        texts += [session.text, *session.turns, summary, keywords,
                  *(dense_fn[k](session, summary, keywords) for k in names)]
    emb, _ = encode_unique(enc, texts, progress=False)
    if emb.shape[-1] != dim:
        raise ValueError(f"the encoder gives {emb.shape[-1]}-dimensional embeddings; "
                         f"this index holds {dim}")
    out = []
    for (session, _, _), at in zip(items, starts):
        nt = len(session.turns)
        e = emb[at:at + 3 + nt + len(names)]
        if not bool(torch.isfinite(e).all()):
            raise ValueError(f"session {session.id!r}: the encoder returned NaN or infinite "
                             "embeddings; nothing was added")
        t = e[1:1 + nt].mean(0) if nt else torch.zeros(e.shape[-1])
        row = torch.stack([e[0], t, e[1 + nt], e[2 + nt]])
        out.append(Encoded(row, {k: e[3 + nt + i] for i, k in enumerate(names)},
                           e[1:1 + nt]))
    return out


def gran_rows(tables, slots: Tensor) -> Tensor:
    """``[len(slots), N_GRAN, d]`` S, T, U, K embeddings of some store slots (read from
    their chunks for a store opened on a folder)."""
    if tables.lazy:
        return tables.take(slots).gran
    return tables.gran[slots]


def slot_digest(tables, slot: int) -> bytes:
    """The content digest of one store slot."""
    if tables.lazy:
        return bytes(tables.take(torch.tensor([slot])).digest[0].tolist())
    return bytes(tables.digest[slot].tolist())


def stored_encoding(tables, slot: int) -> Encoded:
    """The :class:`Encoded` of a session the store holds in ``slot``."""
    if tables.lazy:
        tables, slot = tables.take(torch.tensor([slot])), 0
    return _stored_encoding(tables, slot)


def _stored_encoding(tables, slot: int) -> Encoded:
    """The :class:`Encoded` of a session the store holds in ``slot``."""
    turns = (tables.turns[int(tables.turn_ptr[slot]):int(tables.turn_ptr[slot + 1])]
             if tables.turns is not None else torch.zeros(0, tables.gran.shape[-1]))
    return Encoded(tables.gran[slot], {k: v[slot] for k, v in tables.dense.items()}, turns)


def append_session(store, session: Session, summary: str, keywords: str,
                   encoded: Encoded, digest: bytes) -> int:
    """Tokenise a new distinct session (its texts from :func:`session_texts`, its
    embeddings from :func:`encode_sessions` or a log record) and append it to ``store``;
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


# ---------------------------------------------------------------------------- applying
@dataclass(frozen=True)
class WriteContext:
    """What applying a write needs of its memory: the graph settings (``params``), the
    embedding size, the conversations holding the dataset's questions (never
    forgotten), and the graph settings a new conversation gets (``graph_keys(state)``)."""

    params: GraphParams
    dim: int
    protected: frozenset
    graph_keys: object


def _with_metadata(meta, n: int, metadata: Optional[dict]):
    """The session metadata list after appending a session with ``metadata`` to a
    conversation of ``n`` sessions (None while no session has any)."""
    old = meta.session_metadata if meta is not None else None
    if not metadata and not old:
        return None
    return [*(old if old else [{}] * n), dict(metadata or {})]


def _slot_for(store, st, op) -> tuple[int, bool]:
    """The slot of ``op``'s session content: shared (one more reference) when the store
    holds it, else appended; and whether it was shared."""
    digest = session_digest(op.session, op.summary, op.keywords)
    slot = store.find(digest)
    if slot is not None:
        store.ref(slot)
        return slot, True
    return append_session(store, op.session, op.summary, op.keywords,
                          op.encoded, digest), False


def _add(store, st, op, ctx: WriteContext, replay: bool):
    from .meta import ConversationMeta
    from .segments import Segment, with_segment

    cid = op.conversation_id
    old = st.get(cid)
    if old is not None and op.session.id in old.meta.session_ids:
        if replay:
            j = old.meta.session_ids.index(op.session.id)
            digest = session_digest(op.session, op.summary, op.keywords)
            if slot_digest(st.tables, int(old.slots[j])) == digest:
                return st, []  # already there: a replayed record
        raise ValueError(f"conversation {cid!r} already has a session {op.session.id!r}")
    slot, _ = _slot_for(store, st, op)
    tables = store.tables()
    slots = torch.cat([old.slots if old is not None else torch.zeros(0, dtype=torch.long),
                       torch.tensor([slot])])
    keys = old.graphs.keys() if old is not None else ctx.graph_keys(st)
    gran = gran_rows(tables, slots)
    graphs = {k: grow_graph(old.graphs[k] if old is not None else empty_csr(0),
                            gran, GraphParams.from_key(k, ctx.params))
              for k in keys}
    meta = ConversationMeta(cid, [*(old.meta.session_ids if old else ()), op.session.id],
                            [*(old.meta.session_dates if old else ()), op.session.date],
                            _with_metadata(old.meta if old else None, old.n if old else 0,
                                           op.metadata))
    from ..retrieve.cues.dates import session_days

    days = torch.cat([old.days if old is not None else torch.zeros(0, dtype=torch.float64),
                      session_days([op.session.date])])
    seg = Segment(meta, slots, graphs, days=days)
    new = with_segment(st, cid, seg, tables)
    return new, [old.version] if old is not None else []


def _rebuilt(st, old, meta, slots, days, ctx: WriteContext, tables):
    """A segment of ``old``'s conversation with other sessions: every graph rebuilt."""
    from .segments import Segment, local_graph

    graphs = {k: local_graph(gran_rows(tables, slots).reshape(-1, ctx.dim), slots.numel(),
                             GraphParams.from_key(k, ctx.params)) for k in old.graphs}
    return Segment(meta, slots, graphs, days=days)


def _remove(store, st, op, ctx: WriteContext, replay: bool):
    from .meta import ConversationMeta
    from .segments import with_segment

    cid, sid = op.conversation_id, op.session_id
    old = st.get(cid)
    if old is None or sid not in old.meta.session_ids:
        if replay:
            return st, []
        if old is None:
            raise KeyError(f"no conversation {cid!r} in this index")
        raise KeyError(f"conversation {cid!r} has no session {sid!r}")
    j = old.meta.session_ids.index(sid)
    keep = torch.cat([old.slots[:j], old.slots[j + 1:]])
    ids, dates = list(old.meta.session_ids), list(old.meta.session_dates)
    del ids[j], dates[j]
    md = None
    if old.meta.session_metadata:
        md = list(old.meta.session_metadata)
        del md[j]
        md = md if any(md) else None
    store.unref(int(old.slots[j]))
    days = torch.cat([old.days[:j], old.days[j + 1:]])
    seg = _rebuilt(st, old, ConversationMeta(cid, ids, dates, md), keep, days, ctx, st.tables)
    return with_segment(st, cid, seg, st.tables), [old.version]


def _replace(store, st, op, ctx: WriteContext, replay: bool):
    from .meta import ConversationMeta
    from .segments import with_segment

    cid, sid = op.conversation_id, op.session.id
    old = st.get(cid)
    if old is None or sid not in old.meta.session_ids:
        if old is None:
            raise KeyError(f"no conversation {cid!r} in this index")
        raise KeyError(f"conversation {cid!r} has no session {sid!r}")
    j = old.meta.session_ids.index(sid)
    digest = session_digest(op.session, op.summary, op.keywords)
    md_old = old.meta.metadata(j)
    if slot_digest(st.tables, int(old.slots[j])) == digest \
            and old.meta.session_dates[j] == op.session.date and md_old == (op.metadata or {}):
        return st, []  # the same session: nothing changes (a replayed record too)
    slot, _ = _slot_for(store, st, op)
    store.unref(int(old.slots[j]))
    tables = store.tables()
    slots = old.slots.clone()
    slots[j] = slot
    dates = list(old.meta.session_dates)
    dates[j] = op.session.date
    md = list(old.meta.session_metadata) if old.meta.session_metadata \
        else [{} for _ in dates]
    md[j] = dict(op.metadata or {})
    from ..retrieve.cues.dates import session_days

    days = old.days.clone()
    days[j] = session_days([op.session.date])[0]
    seg = _rebuilt(st, old, ConversationMeta(cid, list(old.meta.session_ids), dates,
                                             md if any(md) else None),
                   slots, days, ctx, tables)
    return with_segment(st, cid, seg, tables), [old.version]


def _forget(store, st, op, ctx: WriteContext, replay: bool):
    from .segments import without_segment

    cid = op.conversation_id
    old = st.get(cid)
    if old is None:
        if replay:
            return st, []
        raise KeyError(f"no conversation {cid!r} in this index")
    if cid in ctx.protected:
        raise ValueError(f"conversation {cid!r} holds evaluation questions of the dataset; "
                         "rebuild the index without it instead")
    for slot in old.slots.tolist():
        store.unref(slot)
    return without_segment(st, cid, st.tables), [old.version]


def apply_ops(store, st, ops, ctx: WriteContext, replay: bool = False):
    """The state after the operations ``ops`` (one write: all of them or none) on ``st``,
    and the segment versions they replaced; the store's appends and references are
    undone when one fails (no published state refers to them).  ``replay``: a log
    record applied again (an add already there, a remove or forget of what is gone,
    change nothing).

    Raises:
        KeyError, ValueError: an operation that cannot apply (nothing changed).
    """
    store.track(st)
    mark = store.mark()
    stale: list = []
    try:
        for op in ops:
            if isinstance(op, ReplaceOp):
                st, gone = _replace(store, st, op, ctx, replay)
            elif isinstance(op, AddOp):
                st, gone = _add(store, st, op, ctx, replay)
            elif isinstance(op, RemoveOp):
                st, gone = _remove(store, st, op, ctx, replay)
            elif isinstance(op, ForgetOp):
                st, gone = _forget(store, st, op, ctx, replay)
            else:
                raise TypeError(f"not a memory operation: {type(op).__name__}")
            stale += gone
    except BaseException:
        store.rollback(mark)
        raise
    return st, stale
