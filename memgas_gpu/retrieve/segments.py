"""Conversations as segments, published states, and the views the read path runs on.

* A :class:`Segment` is one conversation: its session ids and dates, the store slots of
  its sessions (:mod:`.store`), and its association graphs as *local* CSR (nodes
  ``N_GRAN * position + g``).  Segments are never changed: a write makes a new segment
  with a new ``version``.
* A :class:`State` is what a write publishes: every segment, the conversation ids, and a
  snapshot of the store's tables.  Readers take the current state once and see the
  index as it was then, whatever writers do meanwhile.
* A :class:`View` packs some segments of a state into the block-diagonal layout of the
  read path (rows conversation by conversation, graphs joined), with the attributes the
  signals, lexical scores, cues and graphs read.  A view over one conversation costs
  what that conversation costs; its derived data (BM25 postings, cue tables, graphs of
  other settings) lives in the view, which the index's cache owns
  (:mod:`.cache`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..granularity import N_GRAN
from .meta import ConversationMeta, GraphParams
from .store import StoreTables, has_unused_terms, without_unused_terms

__all__ = ["Segment", "State", "View", "next_version", "split_graph", "join_graphs",
           "local_graph", "empty_local", "with_segment"]

_VERSIONS = itertools.count(1)


def next_version() -> int:
    """A version number never used before in this process (segments and states)."""
    return next(_VERSIONS)


def empty_local(n_rows: int) -> tuple[Tensor, Tensor]:
    """Local CSR of ``n_rows`` sessions and no edges."""
    return (torch.zeros(n_rows * N_GRAN + 1, dtype=torch.long),
            torch.zeros(0, dtype=torch.long))


@dataclass(frozen=True, eq=False)
class Segment:
    """One conversation (immutable; see the module docstring).

    Attributes:
        meta: id, session ids and dates (treat as read-only).
        slots: ``[n]`` int64 store slot of each session, in order.
        graphs: graph key (:meth:`GraphParams.key`) → local CSR ``(indptr, indices)``;
            graphs of other settings are added when first read (same content for the
            same version, so sharing the dict between states is safe).
        version: unique among every segment and state of the process.
    """

    meta: ConversationMeta
    slots: Tensor
    graphs: dict = field(default_factory=dict)
    version: int = field(default_factory=next_version)

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def n(self) -> int:
        return int(self.slots.numel())

    @property
    def session_ids(self) -> list:
        return self.meta.session_ids


@dataclass(frozen=True, eq=False)
class State:
    """What one write publishes (see the module docstring).

    Attributes:
        segments: every conversation, in index order.
        ids: conversation id → position in ``segments``.
        tables: the store snapshot the segments' slots point into.
        version: unique per published state.
        packed: optional ready :class:`View` of every conversation, exactly as given to
            the constructor (so reading ``index.gran`` after a build or a load copies
            nothing).
    """

    segments: tuple
    ids: dict
    tables: StoreTables
    version: int = field(default_factory=next_version)
    packed: Optional["View"] = None

    def position(self, conversation_id) -> int:
        i = self.ids.get(conversation_id)
        if i is None:
            raise KeyError(f"no conversation {conversation_id!r} in this index")
        return i


def split_graph(indptr: Tensor, indices: Tensor, conv_offsets: Tensor) -> list:
    """Block-diagonal CSR → one local CSR per conversation (nodes renumbered from 0)."""
    out = []
    offs = conv_offsets.tolist()
    for a, b in zip(offs[:-1], offs[1:]):
        na, nb = a * N_GRAN, b * N_GRAN
        p0, p1 = int(indptr[na]), int(indptr[nb])
        out.append((indptr[na:nb + 1] - p0, indices[p0:p1] - na))
    return out


def join_graphs(parts: Sequence[tuple]) -> tuple[Tensor, Tensor]:
    """Local CSRs of consecutive conversations → one block-diagonal CSR."""
    if not parts:
        return torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    ptrs, idxs = [torch.zeros(1, dtype=torch.long)], []
    nnz = node = 0
    for ip, ix in parts:
        ptrs.append(ip[1:] + nnz)
        idxs.append(ix + node)
        nnz += int(ix.numel())
        node += int(ip.numel()) - 1
    return torch.cat(ptrs), torch.cat(idxs)


def local_graph(node_emb: Tensor, n_rows: int, params: GraphParams,
                device: str = "cpu") -> tuple[Tensor, Tensor]:
    """The association graph of one conversation's ``[n_rows * N_GRAN, d]`` nodes."""
    from .graphs import graph_chunk

    if n_rows == 0:
        return empty_local(0)
    return graph_chunk(node_emb, [n_rows], params, device)


class View:
    """Some conversations of a :class:`State`, packed for the read path.

    The attributes mirror a packed index: ``conversations``, ``conv_offsets``,
    ``row_slot`` (into the store tables ``gran``, ``concat``, ``turns``, ``turn_ptr``,
    ``turn_text``), ``lexical`` (its own derived caches), ``params``, ``config``, and
    :meth:`graph`.  ``cache`` holds whatever else a reader derives from it.  ``conv``
    is the ``[C]`` index of each of its conversations in the state.

    A ``canonical`` view renumbers the slots it uses in order of first use (what a
    fresh build of the same conversations stores), copying the tables when the store
    holds other slots too; :attr:`graphs` then holds every graph the index saves.
    """

    def __init__(self, state: State, conv: Sequence[int], params: GraphParams,
                 config: dict, canonical: bool = False) -> None:
        segs = [state.segments[c] for c in conv]
        self.state = state
        self.segments = segs
        self.conv = torch.as_tensor(list(conv), dtype=torch.long)
        self.conversations = [s.meta for s in segs]
        sizes = torch.tensor([s.n for s in segs], dtype=torch.long)
        self.conv_offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        self.row_slot = (torch.cat([s.slots for s in segs]) if segs
                         else torch.zeros(0, dtype=torch.long))
        self.params = params
        self.config = config
        #: anything a reader derives from this view (cue tables, node blocks, ...)
        self.cache: dict = {}
        #: graph key → joined CSR of these conversations
        self.graph_cache: dict = {}
        #: graph settings :attr:`graphs` lists (set by ``MemoryIndex.snapshot``)
        self.graph_keys: frozenset = frozenset()
        t = state.tables
        if canonical:
            t = self._renumber(t)
        self.tables = t
        self.gran, self.concat = t.gran, t.concat
        self.turns, self.turn_ptr, self.turn_text = t.turns, t.turn_ptr, t.turn_text
        self.lexical = t.lexical_index()

    def _first_use(self, n_slots: int) -> Tensor:
        """The slots the view uses, in order of first use."""
        rs = self.row_slot
        first = torch.full((n_slots,), rs.numel(), dtype=torch.long)
        first.scatter_reduce_(0, rs, torch.arange(rs.numel()), "amin")
        used = torch.nonzero(first < rs.numel()).squeeze(1)
        return used[torch.argsort(first[used])]

    def is_canonical(self) -> bool:
        """Whether the view stores what a fresh build of its conversations would: every
        slot of its tables used, numbered in order of first use, and no vocabulary term
        that neither a document nor a question uses."""
        got = self.cache.get("canonical")
        if got is None:
            n = self.tables.n_slots
            rs = self.row_slot
            got = ((rs.numel() == n and torch.equal(rs, torch.arange(n)))
                   or torch.equal(self._first_use(n), torch.arange(n))) \
                and not has_unused_terms(self.tables)
            self.cache["canonical"] = got
        return got

    def _renumber(self, t: StoreTables) -> StoreTables:
        """Slots in order of first use and only the terms they use; a copy of the tables
        only when needed."""
        n = t.n_slots
        rs = self.row_slot
        if not (rs.numel() == n and (n == 0 or torch.equal(rs, torch.arange(n)))):
            order = self._first_use(n)
            if not (order.numel() == n and torch.equal(order, torch.arange(n))):
                new_of = torch.full((n,), -1, dtype=torch.long)
                new_of[order] = torch.arange(order.numel())
                self.row_slot = new_of[rs]
                t = t.take(order)
        return without_unused_terms(t)

    # ------------------------------------------------------------------ shapes
    @property
    def n_conversations(self) -> int:
        return len(self.segments)

    @property
    def n_rows(self) -> int:
        return int(self.row_slot.numel())

    @property
    def dim(self) -> int:
        return int(self.gran.shape[-1])

    def node_embeddings(self, rows: Optional[Tensor] = None) -> Tensor:
        """``[rows*N_GRAN, d]`` interleaved node embeddings (node ``N_GRAN*row + g``)."""
        slots = self.row_slot if rows is None else self.row_slot[rows]
        return self.gran[slots].reshape(-1, self.dim)

    def stored(self, table: str) -> Optional[Tensor]:
        """The dense table ``table`` (``[n_slots, d]``, rows by slot), or None."""
        return self.tables.dense.get(table)

    def local(self, conversation_index: int) -> int:
        """Position in this view of the state's conversation ``conversation_index``."""
        return int(torch.searchsorted(self.conv, torch.tensor(conversation_index)))

    # ------------------------------------------------------------------ graphs
    def graph(self, params: Optional[GraphParams] = None, device: Optional[str] = None
              ) -> tuple[Tensor, Tensor]:
        """The association graph of these conversations (CSR over the view's nodes):
        each segment's stored graph, built for the segments that lack this setting."""
        params = params or self.params
        key = params.key()
        got = self.graph_cache.get(key)
        if got is not None:
            return got
        missing = [i for i, s in enumerate(self.segments) if key not in s.graphs]
        if missing:
            self._build(missing, params, device)
        got = join_graphs([s.graphs[key] for s in self.segments])
        self.graph_cache[key] = got
        return got

    def _build(self, which: list, params: GraphParams, device: Optional[str]) -> None:
        from .graphs import build_graph

        sub = View(self.state, [int(self.conv[i]) for i in which], self.params, self.config)
        sub.tables, sub.gran = self.tables, self.gran
        sub.row_slot = torch.cat([self.row_slot[int(self.conv_offsets[i]):
                                                int(self.conv_offsets[i + 1])]
                                  for i in which])
        ip, ix = build_graph(sub, params, device=device, progress=False)
        for i, local in zip(which, split_graph(ip, ix, sub.conv_offsets)):
            self.segments[i].graphs.setdefault(params.key(), local)

    @property
    def graphs(self) -> dict:
        """The graphs of :attr:`graph_keys` (the settings the index saves), joined."""
        return {k: self.graph(GraphParams.from_key(k, self.params))
                for k in sorted(self.graph_keys)}


def with_segment(state: State, i: int, seg: Segment, tables: StoreTables) -> State:
    """``state`` with conversation ``i`` replaced by ``seg`` (or appended, ``i ==
    len(segments)``) and the store snapshot ``tables``."""
    segs = list(state.segments)
    ids = state.ids
    if i == len(segs):
        segs.append(seg)
        ids = dict(ids)
        ids[seg.id] = i
    else:
        segs[i] = seg
    return State(tuple(segs), ids, tables)

