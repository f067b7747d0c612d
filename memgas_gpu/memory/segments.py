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


class State:
    """What one write publishes (see the module docstring): every conversation, keyed
    by id, and a snapshot of the store.  Immutable once made.

    A state of a memory opened on a folder rests on a *base*
    (:class:`~memgas_gpu.memory.lazy.Base`: the conversations of the commit it was
    opened on, each read the first time it is needed) and holds the conversations
    written since as *overrides*; a memory in RAM holds every conversation as an
    override.  Conversations are ordered by *ordinal* (the memory's order: a new
    conversation comes last, a forgotten one leaves no gap in the order).

    Attributes:
        over: conversation id → ``(ordinal, Segment)``, or ``(None, None)`` for one
            forgotten (so that a commit removes it).
        tables: the store snapshot the segments' slots point into.
        base: the conversations read lazily (None: none).
        n: how many conversations the state holds.
        next_ordinal: the ordinal of the next new conversation.
        base_keys: the graph settings every conversation of the base holds.
        version: unique per published state.
    """

    __slots__ = ("over", "tables", "base", "n", "next_ordinal", "base_keys", "version",
                 "_order", "__weakref__")

    def __init__(self, over: dict, tables: StoreTables, base=None, n: Optional[int] = None,
                 next_ordinal: Optional[int] = None, base_keys: frozenset = frozenset()
                 ) -> None:
        self.over = over
        self.tables = tables
        self.base = base
        if n is None:
            n = sum(1 for _, seg in over.values() if seg is not None)
        self.n = n
        if next_ordinal is None:
            next_ordinal = 1 + max((o for o, seg in over.values() if seg is not None),
                                   default=-1)
        self.next_ordinal = next_ordinal
        self.base_keys = base_keys
        self.version = next_version()
        self._order = None

    @classmethod
    def of(cls, segments: Sequence, tables: StoreTables) -> "State":
        """A state in RAM of ``segments`` in order (ids unique)."""
        over = {}
        for i, seg in enumerate(segments):
            if seg.id in over:
                raise ValueError(f"conversation id {seg.id!r} appears twice (positions "
                                 f"{over[seg.id][0]} and {i}): ids must be unique")
            over[seg.id] = (i, seg)
        return cls(over, tables, n=len(segments), next_ordinal=len(segments))

    # ------------------------------------------------------------------ one conversation
    def get(self, conversation_id) -> Optional[Segment]:
        """The segment of a conversation (read from the base the first time), or None."""
        got = self.over.get(conversation_id)
        if got is not None:
            return got[1]
        if self.base is not None and isinstance(conversation_id, str):
            return self.base.segment(conversation_id)
        return None

    def __contains__(self, conversation_id) -> bool:
        return self.ordinal(conversation_id) is not None

    def ordinal(self, conversation_id) -> Optional[int]:
        """A conversation's place in the memory's order (no segment read), or None."""
        got = self.over.get(conversation_id)
        if got is not None:
            return got[0]
        if self.base is not None and isinstance(conversation_id, str):
            return self.base.ordinal(conversation_id)
        return None

    def version_of(self, conversation_id) -> Optional[int]:
        """The version of a conversation's segment (no segment read), or None."""
        got = self.over.get(conversation_id)
        if got is not None:
            return got[1].version if got[1] is not None else None
        if self.base is not None and self.base.ordinal(conversation_id) is not None:
            return self.base.version_of(conversation_id)
        return None

    def segment(self, conversation_id) -> Segment:
        seg = self.get(conversation_id)
        if seg is None:
            raise KeyError(f"no conversation {conversation_id!r} in this index")
        return seg

    def holds(self, keys) -> bool:
        """Whether every ``(conversation id, version)`` of ``keys`` is current here."""
        return all(self.version_of(c) == v for c, v in keys)

    # ------------------------------------------------------------------ every one
    def order(self) -> list:
        """Every conversation id, in the memory's order (the base's directory listed,
        no segment read; computed once per state)."""
        got = self._order
        if got is None:
            pairs = [(o, c) for c, (o, seg) in self.over.items() if seg is not None]
            if self.base is not None:
                pairs += [(e[1], e[0]) for e in self.base.entries() if e[0] not in self.over]
            pairs.sort()
            got = self._order = [c for _, c in pairs]
        return got

    @property
    def segments(self) -> tuple:
        """Every segment, in order (each read from the base when needed: O(memory))."""
        return tuple(self.segment(c) for c in self.order())

    def iter_segments(self):
        """Every segment in order, one at a time (a base's are not kept resident)."""
        for c in self.order():
            got = self.over.get(c)
            yield got[1] if got is not None else self.base.segment(c, keep=False)

    @property
    def ids(self) -> dict:
        """Conversation id → position in the memory's order."""
        return {c: i for i, c in enumerate(self.order())}

    def position(self, conversation_id) -> int:
        if conversation_id not in self:
            raise KeyError(f"no conversation {conversation_id!r} in this index")
        return self.order().index(conversation_id)

    def graph_keys(self) -> Optional[frozenset]:
        """The graph settings every conversation holds (None: it holds none)."""
        keys = None
        if self.base is not None and self.base.count > sum(
                1 for c in self.over if self.base.ordinal(c) is not None):
            keys = set(self.base_keys)
        for _, seg in self.over.values():
            if seg is None:
                continue
            if keys is None:
                keys = set(seg.graphs)
            elif not keys <= seg.graphs.keys():
                keys &= seg.graphs.keys()
        return frozenset(keys) if keys is not None else None

    def n_rows(self) -> int:
        """Sessions over every conversation (the base's from its directory entries)."""
        n = sum(seg.n for _, seg in self.over.values() if seg is not None)
        if self.base is not None:
            n += sum(e[6] for e in self.base.entries() if e[0] not in self.over)
        return n

    def changed(self) -> dict:
        """``{id: (ordinal, segment or None)}`` of the conversations written since the
        base (every one, for a state in RAM)."""
        return dict(self.over)

    def with_over(self, over: dict, tables: StoreTables, n: int, next_ordinal: int
                  ) -> "State":
        return State(over, tables, self.base, n, next_ordinal, self.base_keys)


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
    (the constructor's) are its conversations' ids, in the memory's order.  A view
    never changes once made: its caches only memoize what its data determines.

    A ``canonical`` view renumbers the slots it uses in order of first use and keeps
    only the vocabulary terms they use (what a fresh build of the same conversations
    stores), copying the tables when the store holds more.

    Args:
        graphs: joined graphs of exactly these conversations, by setting key, when the
            caller holds them already (a build or a load: nothing is joined again).
    """

    def __init__(self, state: State, conv: Sequence[str], params: GraphParams,
                 config: dict, canonical: bool = False,
                 graphs: Optional[dict] = None) -> None:
        segs = [state.segment(c) for c in conv]
        self.canonical = canonical
        self.state = state
        self.segments = segs
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
        #: the view's tables hold its own rows only (a store read a chunk at a time)
        self.local = False
        if canonical:
            row_slot, t = _canonical(row_slot, t)
        elif t.lazy:
            row_slot, t = _local(row_slot, t)
            self.local = True
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
            if self.canonical or self.local:  # renumbered tables: built whole
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

        sub = View(self.state, [self.conversations[i].id for i in which], self.params,
                   self.config)
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


def _local(row_slot: Tensor, t) -> tuple[Tensor, StoreTables]:
    """Rows renumbered to the slots they use in order of first use, and those slots'
    tables, read from the store's chunks."""
    n = row_slot.numel()
    if not n:
        return row_slot, t.take(row_slot)
    uniq, inv = torch.unique(row_slot, return_inverse=True)
    first = torch.full((uniq.numel(),), n, dtype=torch.long)
    first.scatter_reduce_(0, inv, torch.arange(n), "amin")
    order = torch.argsort(first)
    new_of = torch.empty_like(order)
    new_of[order] = torch.arange(order.numel())
    return new_of[inv], t.take(uniq[order])


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


def with_segment(state: State, conversation_id: str, seg: Segment,
                 tables: StoreTables) -> State:
    """``state`` with the conversation replaced by ``seg`` (or added last) and the store
    snapshot ``tables``."""
    over = dict(state.over)
    ordinal = state.ordinal(conversation_id)
    n, nxt = state.n, state.next_ordinal
    if ordinal is None:
        ordinal, nxt, n = nxt, nxt + 1, n + 1
    over[conversation_id] = (ordinal, seg)
    return state.with_over(over, tables, n, nxt)


def without_segment(state: State, conversation_id: str, tables: StoreTables) -> State:
    """``state`` without the conversation (later conversations move up one)."""
    over = dict(state.over)
    over[conversation_id] = (None, None)  # a commit removes it from the folder
    return state.with_over(over, tables, state.n - 1, state.next_ordinal)
