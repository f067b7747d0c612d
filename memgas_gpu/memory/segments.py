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
  (:mod:`.cache`).  The read path (:mod:`.engine`, :mod:`.signals`, :mod:`.cues`,
  :mod:`.graphs`, :mod:`memgas_gpu.lexical`) reads views, and only views.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..granularity import N_GRAN
from ..ops.csr import empty_csr, join_csr, split_csr
from .meta import ConversationMeta, GraphParams
from .store import StoreTables, has_unused_terms, without_unused_terms

__all__ = ["Segment", "State", "View", "next_version", "split_graph", "local_graph",
           "with_segment", "without_segment"]

_VERSIONS = itertools.count(1)


def next_version() -> int:
    """A version number never used before in this process (segments and states)."""
    return next(_VERSIONS)


@dataclass(frozen=True, eq=False)
class Segment:
    """One conversation (immutable; see the module docstring).

    Attributes:
        meta: id, session ids and dates (treat as read-only).
        slots: ``[n]`` int64 store slot of each session, in order.
        days: ``[n]`` float64 days since 1970-01-01 of each session's date (NaN: none),
            read once when the segment is made (:func:`~memgas_gpu.retrieve.cues.dates.
            session_days`) unless given.
        graphs: graph key (:meth:`GraphParams.key`) → local CSR ``(indptr, indices)``;
            graphs of other settings are added when first read (same content for the
            same version, so sharing the dict between states is safe).
        version: unique among every segment and state of the process.
    """

    meta: ConversationMeta
    slots: Tensor
    graphs: dict = field(default_factory=dict)
    version: int = field(default_factory=next_version)
    days: Optional[Tensor] = None
    #: what reads derive from this conversation alone (its BM25 postings per setting,
    #: its speakers): the same for the same version, kept for every view of it
    derived: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.days is None:
            from ..retrieve.cues.dates import session_days

            object.__setattr__(self, "days", session_days(self.meta.session_dates))

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
    """

    segments: tuple
    ids: dict
    tables: StoreTables
    version: int = field(default_factory=next_version)
    _live: frozenset = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_live", frozenset(s.version for s in self.segments))

    def holds(self, versions) -> bool:
        """Whether every segment version in ``versions`` is one of this state's."""
        return all(v in self._live for v in versions)

    def position(self, conversation_id) -> int:
        i = self.ids.get(conversation_id)
        if i is None:
            raise KeyError(f"no conversation {conversation_id!r} in this index")
        return i


def split_graph(indptr: Tensor, indices: Tensor, conv_offsets: Tensor) -> list:
    """Block-diagonal graph of consecutive conversations (``conv_offsets``: their rows)
    → one local graph per conversation."""
    return split_csr(indptr, indices, (conv_offsets * N_GRAN).tolist())


def local_graph(node_emb: Tensor, n_rows: int, params: GraphParams,
                device: str = "cpu") -> tuple[Tensor, Tensor]:
    """The association graph of one conversation's ``[n_rows * N_GRAN, d]`` nodes."""
    from ..retrieve.graphs import graph_chunk

    if n_rows == 0:
        return empty_csr(0)
    return graph_chunk(node_emb, [n_rows], params, device)


class View:
    """Some conversations of a :class:`State`, packed for the read path.

    The attributes mirror a packed index: ``conversations``, ``conv_offsets``,
    ``row_slot`` (into the store tables ``gran``, ``concat``, ``turns``, ``turn_ptr``,
    ``turn_text``), ``lexical`` (its own derived caches), ``params``, ``config``, and
    :meth:`graph`.  ``cache`` holds whatever else a reader derives from it.  ``conv``
    is the ``[C]`` index of each of its conversations in the state.  A view never
    changes once made: its caches only memoize what its data determines.

    A ``canonical`` view renumbers the slots it uses in order of first use and keeps
    only the vocabulary terms they use (what a fresh build of the same conversations
    stores), copying the tables when the store holds more.

    Args:
        graphs: joined graphs of exactly these conversations, by setting key, when the
            caller holds them already (a build or a load: nothing is joined again).
    """

    def __init__(self, state: State, conv: Sequence[int], params: GraphParams,
                 config: dict, canonical: bool = False,
                 graphs: Optional[dict] = None) -> None:
        segs = [state.segments[c] for c in conv]
        self.canonical = canonical
        self.state = state
        self.segments = segs
        self.conv = torch.as_tensor(list(conv), dtype=torch.long)
        self.conversations = [s.meta for s in segs]
        sizes = torch.tensor([s.n for s in segs], dtype=torch.long)
        self.conv_offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        row_slot = (torch.cat([s.slots for s in segs]) if segs
                    else torch.zeros(0, dtype=torch.long))
        self.params = params
        self.config = config
        #: anything a reader derives from this view (cue tables, node blocks, ...)
        self.cache: dict = {}
        #: graph key → joined CSR of these conversations
        self.graph_cache: dict = dict(graphs or {})
        t = state.tables
        if canonical:
            row_slot, t = _canonical(row_slot, t)
        self.row_slot = row_slot
        self.tables = t
        self.gran, self.concat = t.gran, t.concat
        self.turns, self.turn_ptr, self.turn_text = t.turns, t.turn_ptr, t.turn_text
        self.lexical = t.lexical_index()

    def derived(self, name: str, build):
        """``build()``, kept in the view's derived-data cache under ``name`` (one home
        for derived data: :mod:`.cache`)."""
        got = self.cache.get(name)
        if got is None:
            got = self.cache[name] = build()
        return got

    def per_conversation(self, i: int, name, build):
        """``build()``, kept with the segment of this view's conversation ``i`` (every
        view of that segment version shares it: a batch over conversations never seen
        together reuses what each one's earlier reads derived)."""
        memo = self.segments[i].derived
        got = memo.get(name)
        if got is None:
            got = memo.setdefault(name, build())
        return got

    def postings(self, granularity: str, params, device):
        """BM25 postings of one granularity over this view's conversations: each
        conversation's own (kept with its segment), joined (a concatenation, no
        statistics computed again)."""
        from ..lexical.signals import Rows, join_postings, lexical_postings

        lex = self.lexical
        key = ("postings", granularity, float(params.k1), float(params.b), params.method,
               str(device))

        def build():
            if self.canonical:  # renumbered tables and vocabulary: built whole
                return lexical_postings(self, granularity, params, device)
            parts = []
            for i, seg in enumerate(self.segments):
                one = Rows(lex, torch.tensor([0, seg.n]), seg.slots)
                # keyed by the vocabulary too: a view of another vocabulary (a canonical
                # snapshot) numbers its terms otherwise
                got = self.per_conversation(
                    i, key + (id(lex.vocab),),
                    lambda: (lexical_postings(one, granularity, params, device,
                                              cache=False), lex.vocab))
                parts.append(got[0])
            return join_postings(parts, self.conv_offsets, self.row_slot, lex.n_terms)

        return self.derived(key, build)

    def session_days(self) -> Tensor:
        """``[n_rows]`` float64 days since 1970-01-01 of each row's session date (NaN:
        none): the segments' own, never parsed again."""
        return self.derived("session_days", lambda: torch.cat(
            [s.days for s in self.segments]) if self.segments
            else torch.zeros(0, dtype=torch.float64))

    def latest_days(self) -> list:
        """Per conversation: its latest session date in days (NaN: none known)."""
        def build():
            out = []
            for s in self.segments:
                known = s.days[~torch.isnan(s.days)]
                out.append(float(known.max()) if known.numel() else float("nan"))
            return out

        return self.derived("latest_days", build)

    def positions(self, conversation_ids: Sequence[str]) -> Tensor:
        """``[len(conversation_ids)]`` position in this view of each conversation.

        Raises:
            KeyError: a conversation the view does not hold.
        """
        ids = self.derived("ids", lambda: {m.id: i for i, m in enumerate(self.conversations)})
        try:
            return torch.tensor([ids[c] for c in conversation_ids], dtype=torch.long)
        except KeyError as e:
            raise KeyError(f"no conversation {e.args[0]!r} in this view") from None

    def is_canonical(self) -> bool:
        """Whether the view stores what a fresh build of its conversations would: every
        slot of its tables used, numbered in order of first use, and no vocabulary term
        that neither a document nor a question uses."""
        got = self.cache.get("canonical")
        if got is None:
            n = self.tables.n_slots
            got = torch.equal(_first_use(self.row_slot, n), torch.arange(n)) and \
                not has_unused_terms(self.tables)
            self.cache["canonical"] = got
        return got

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

    def dense_table(self, name: str) -> Optional[Tensor]:
        """The dense table ``name`` (``[n_slots, d]``, rows by slot), or None."""
        return self.tables.dense.get(name)

    def provides(self, need: str) -> bool:
        """Whether the view holds what a signal ``needs``: ``"gran"``, ``"turns"``, a
        dense table name, or ``"lexical:<documents>"``."""
        if need == "gran":
            return True
        if need == "turns":
            return self.turns is not None
        if need.startswith("lexical:"):
            return self.lexical is not None and need[len("lexical:"):] in self.lexical.docs
        return need in self.tables.dense

    @property
    def keeps_text(self) -> bool:
        """Whether the view holds turn texts (evidence, the speaker cue)."""
        return self.turn_text is not None

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
        got = join_csr([s.graphs[key] for s in self.segments])
        self.graph_cache[key] = got
        return got

    def _build(self, which: list, params: GraphParams, device: Optional[str]) -> None:
        """Build one setting's graph of the segments ``which`` (positions in this view)
        and keep it with them: the same content for the same segment version."""
        from ..retrieve.graphs import build_graph

        sub = View(self.state, [int(self.conv[i]) for i in which], self.params, self.config)
        ip, ix = build_graph(sub, params, device=device, progress=False)
        for i, local in zip(which, split_graph(ip, ix, sub.conv_offsets)):
            self.segments[i].graphs.setdefault(params.key(), local)

    @property
    def graphs(self) -> dict:
        """Every graph setting all its conversations hold (key → joined graph)."""
        return {k: self.graph(GraphParams.from_key(k, self.params))
                for k in sorted(self.saved_graph_keys())}

    def saved_graph_keys(self) -> frozenset:
        """The graph settings every conversation of the view holds (what a save keeps)."""
        if not self.segments:
            return frozenset()
        keys = set(self.segments[0].graphs)
        for s in self.segments[1:]:
            keys &= s.graphs.keys()
        return frozenset(keys)


def _first_use(row_slot: Tensor, n_slots: int) -> Tensor:
    """The slots ``row_slot`` uses, in order of first use."""
    first = torch.full((n_slots,), row_slot.numel(), dtype=torch.long)
    first.scatter_reduce_(0, row_slot, torch.arange(row_slot.numel()), "amin")
    used = torch.nonzero(first < row_slot.numel()).squeeze(1)
    return used[torch.argsort(first[used])]


def _canonical(row_slot: Tensor, t: StoreTables) -> tuple[Tensor, StoreTables]:
    """Rows renumbered to slots in order of first use, and tables holding only those
    slots and the terms they use; the same tensors when nothing changes."""
    n = t.n_slots
    order = _first_use(row_slot, n)
    if not torch.equal(order, torch.arange(n)):
        new_of = torch.full((n,), -1, dtype=torch.long)
        new_of[order] = torch.arange(order.numel())
        row_slot, t = new_of[row_slot], t.take(order)
    return row_slot, without_unused_terms(t)


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



def without_segment(state: State, i: int, tables: StoreTables) -> State:
    """``state`` without conversation ``i`` (later conversations move up one)."""
    segs = list(state.segments)
    del segs[i]
    return State(tuple(segs), {s.id: j for j, s in enumerate(segs)}, tables)
