"""``MemoryIndex``: the memory users hold — many conversations, each its own segment.

Storage (docs/architecture.md, "The index"):

* a **session store** (:mod:`.store`) of every *distinct* session's tables — S/T/U/K
  embeddings, ``concat``, turn embeddings and texts, lexical documents — so a session
  shared between LongMemEval haystacks is stored and encoded once; appends are
  amortized;
* one **segment** per conversation (:mod:`.segments`): its session ids and dates, the
  store slots of its sessions, and its association graphs as local CSR;
* the dataset's **questions** (embeddings ``q_emb``, conversation ``q_conv``), for
  evaluation.

A write (:meth:`MemoryIndex.add_session`, :meth:`MemoryIndex.remove_session`) builds a
new segment for the one conversation it changes and publishes a new state; a read
(:meth:`MemoryIndex.retrieve`, :meth:`MemoryIndex.search`) takes the current state once
and packs only the conversations it asks about into the block-diagonal layout of the
read path (:class:`~memgas_gpu.retrieve.segments.View`, cached by :mod:`.cache`).

The packed attributes of a whole index (``conv_offsets``, ``row_slot``, ``gran``,
``graphs``, ...) remain available, exactly as a fresh build of the same sessions
would hold them; after a write they are packed again on first access.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from .._checks import float_dtype, require_encoder
from ..data.model import Dataset, Question, Session
from ..errors import MemgasError
from ..expand.expansion import expand_dataset
from ..granularity import N_GRAN
from .cache import DEFAULT_MAX_VIEWS, ViewCache
from .embed import embed_sessions, encode_unique
from .graphs import build_graph
from .meta import BuildParams, ConversationMeta, GraphParams
from .segments import (Segment, State, View, empty_local, local_graph, split_graph,
                       with_segment)
from .signals import stored_texts
from .store import DIGEST_BYTES, SessionStore, session_digest
from .writes import append_session, check_session, grow_graph, session_texts
from .texts import TextTable

__all__ = ["MemoryIndex", "BuildParams", "GraphParams", "EncoderMismatchError"]


class EncoderMismatchError(MemgasError, ValueError):
    """A query encoder that differs from the one the index was built with."""


class MemoryIndex:
    """Multi-granularity memory of many conversations.

    Build with :meth:`build` (an empty ``Dataset([])`` gives an empty memory), grow
    with :meth:`add_session` / :meth:`remove_session`, query with :meth:`search` (new
    texts) or :meth:`retrieve` (the dataset's questions), persist with :meth:`save` /
    :meth:`load`.

    **Threads.** One index may be shared by many threads.  Every read (``search``,
    ``retrieve``, :meth:`snapshot`, the packed attributes) sees the index as it was when
    the read started: a state published by a complete write, never a half-applied one.
    Writes (``add_session``, ``remove_session``) are serialized by a lock and never wait
    for reads; each costs what its own conversation costs, whatever else the index
    holds.  A read of some conversations costs what those conversations cost; its
    derived data (BM25 postings, cue tables, other graph settings) is cached per
    conversation version (``max_views`` views, least recently used evicted).
    Across processes, see :meth:`save`.
    """

    def __init__(self, *, conversations: list[ConversationMeta], questions: list[Question],
                 conv_offsets: Tensor, row_slot: Tensor, gran: Tensor,
                 concat: Optional[Tensor], q_emb: Tensor, q_conv: Tensor,
                 graphs: dict[str, tuple[Tensor, Tensor]], params: GraphParams,
                 config: dict, lexical: Any = None, turns: Optional[Tensor] = None,
                 turn_ptr: Optional[Tensor] = None,
                 turn_text: Optional[TextTable] = None, tables: Optional[dict] = None,
                 max_views: int = DEFAULT_MAX_VIEWS, digest: Optional[Tensor] = None) -> None:
        ids: dict = {}
        for i, c in enumerate(conversations):
            if c.id in ids:
                raise ValueError(f"conversation id {c.id!r} appears twice (positions "
                                 f"{ids[c.id]} and {i}): ids must be unique")
            ids[c.id] = i
        self.questions = questions
        self.q_emb = q_emb
        self.q_conv = q_conv
        self.params = params
        self.config = config
        #: the folder and version this index was loaded from or last saved to
        #: (:class:`~memgas_gpu.retrieve.persist.FolderVersion`), else None
        self.folder_version = None
        #: ``{folder: version}`` of every folder this index was loaded from or saved to
        #: (folders absolute, symbolic links resolved); a save into one of them after
        #: another writer's is refused (docs/failure.md)
        self.folder_versions: dict = {}
        self._encoder = None
        self._write_lock = threading.RLock()
        self._save_lock = threading.Lock()  # one save at a time (persist.save_index)
        self._cache = ViewCache(max_views)
        dense = dict(tables or {})
        if concat is not None:
            dense["concat"] = concat
        self._store = SessionStore(gran, dense, turns, turn_ptr, turn_text, lexical, digest)
        self._graph_keys = frozenset(graphs)
        offs = conv_offsets.tolist()
        parts = {k: split_graph(ip, ix, conv_offsets) for k, (ip, ix) in graphs.items()}
        segs = tuple(
            Segment(ConversationMeta(c.id, list(c.session_ids), list(c.session_dates)),
                    row_slot[offs[i]:offs[i + 1]].clone(), {k: parts[k][i] for k in parts})
            for i, c in enumerate(conversations))
        state = State(segs, ids, self._store.tables())
        packed = View(state, range(len(segs)), params, config)
        # exactly the tensors given: reading them back copies nothing
        packed.row_slot, packed.conv_offsets = row_slot, conv_offsets
        packed.lexical = lexical
        packed.graph_cache.update(graphs)
        self._state = State(segs, ids, state.tables, version=state.version, packed=packed)
        packed.state = self._state

    def __getstate__(self) -> dict:
        """For copies and Ray tasks: the published state, without the lock and the
        derived-data cache (rebuilt on the other side)."""
        d = dict(self.__dict__)
        d.pop("_write_lock", None)
        d.pop("_save_lock", None)
        d["_cache"] = self._cache.max_views
        return d

    def __setstate__(self, d: dict) -> None:
        d = dict(d)
        d["_cache"] = ViewCache(d["_cache"])
        d["_write_lock"] = threading.RLock()
        d["_save_lock"] = threading.Lock()
        self.__dict__.update(d)

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, dataset: Dataset, encoder: Any = None, params: Optional[BuildParams] = None,
              *, store: Any = None, device: Optional[str] = None,
              progress: Optional[bool] = None, graph_mapper=None,
              **settings) -> "MemoryIndex":
        """Expand, encode and link every conversation of ``dataset``.

        Args:
            dataset: a loaded :class:`~memgas_gpu.Dataset` (``Dataset([])``: an empty
                memory to grow with :meth:`add_session`).
            encoder: an :class:`~memgas_gpu.encode.Encoder` (default: the bundled
                all-MiniLM-L6-v2 on ``device``).
            params: the write path's :class:`BuildParams` (default: the paper's settings;
                stored with the index).
            store: optional :class:`~memgas_gpu.encode.EmbeddingStore` (resumable
                on-disk embeddings shared across runs).
            device: where to build the graph (``None``: CUDA if available).
            progress: progress of each stage (:mod:`memgas_gpu.progress`: a bar on
                a terminal, plain lines in a log); False: none.
            graph_mapper: how graph chunks run (see :func:`build_graph`; the Ray
                backend passes parallel tasks).
            **settings: :class:`BuildParams` fields replacing ``params``' (``summaries=``,
                ``keywords=``, ``m=``, ``skip_sessions=``, ``concat=``, ``lexical=``,
                ``keep_turns=``, ``keep_text=``, ``tokenizer=``).
        """
        require_encoder(encoder)
        p = (params or BuildParams()).with_settings(**settings)
        if not isinstance(dataset, Dataset):
            raise TypeError(f"dataset must be a memgas_gpu.Dataset, got "
                            f"{type(dataset).__name__}")
        if encoder is None:
            from ..encode import Encoder

            encoder = Encoder(device=device)
        timings = {}
        t0 = time.perf_counter()
        exp = expand_dataset(dataset, summaries=p.summaries, keywords=p.keywords,
                             progress=progress)
        timings["expand_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dense = stored_texts("dense")
        if not p.concat:
            dense.pop("concat", None)
        table, enc_stats = embed_sessions(dataset, exp, encoder, store=store, tables=dense,
                                          progress=progress)
        questions = [q for c in dataset for q in c.questions]
        q_emb, q_stats = encode_unique(encoder, [q.text for q in questions], store=store,
                                       progress=progress)
        timings["encode_s"] = time.perf_counter() - t0
        lex = None
        if p.lexical:
            from ..lexical import build_lexical

            t0 = time.perf_counter()
            lex = build_lexical(dataset, exp, table.sessions, [q.text for q in questions],
                                p.tokenizer, extra=stored_texts("lexical"))
            timings["lexical_s"] = time.perf_counter() - t0
        slot = {s.key: i for i, s in enumerate(table.sessions)}
        texts: dict = {}
        for c in dataset:  # a shared session is expanded once: its first texts
            for s, u, k in zip(c.sessions, exp.summaries[c.id], exp.keywords[c.id]):
                texts.setdefault(s.key, (u, k))
        digest = torch.tensor(list(b"".join(session_digest(s, *texts[s.key])
                                            for s in table.sessions)),
                              dtype=torch.uint8).reshape(-1, DIGEST_BYTES)
        row_slot = torch.tensor([slot[s.key] for c in dataset for s in c.sessions],
                                dtype=torch.long)
        sizes = torch.tensor([len(c.sessions) for c in dataset], dtype=torch.long)
        conv_offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        q_conv = torch.tensor([ci for ci, c in enumerate(dataset) for _ in c.questions],
                              dtype=torch.long)
        metas = [ConversationMeta(c.id, [s.id for s in c.sessions], [s.date for s in c.sessions])
                 for c in dataset]
        describe = getattr(encoder, "describe", None)
        config = {
            "encoder": describe() if callable(describe) else {"model": repr(encoder)},
            "encoder_fingerprint": getattr(encoder, "fingerprint", None),
            "encoder_source": _encoder_source(encoder),
            "expansion": exp.config,
            "dataset": {"format": dataset.format, "source": dataset.source},
            "encoding": {"sessions_and_texts": enc_stats, "questions": q_stats},
            "build": p.describe(),
        }
        d = table.gran.shape[-1]
        idx = cls(conversations=metas, questions=questions, conv_offsets=conv_offsets,
                  row_slot=row_slot, gran=table.gran, concat=None, tables=table.dense,
                  q_emb=q_emb if len(questions) else torch.zeros(0, d),
                  q_conv=q_conv, graphs={},
                  params=p.graph(), config=config,
                  lexical=lex, turns=table.turns if p.keep_turns else None,
                  turn_ptr=table.turn_ptr,
                  turn_text=TextTable.from_strings(t for x in table.sessions for t in x.turns)
                  if p.keep_text else None, digest=digest)
        if lex is not None:
            idx.config["lexical"] = lex.describe()
        idx._encoder = encoder
        t0 = time.perf_counter()
        key = idx.params.key()
        graph = build_graph(idx._state.packed, idx.params, device=device, progress=progress,
                            mapper=graph_mapper)
        idx._adopt_graph(key, graph)
        timings["graph_s"] = time.perf_counter() - t0
        idx.config["timings"] = timings
        return idx

    def _adopt_graph(self, key: str, graph: tuple) -> None:
        """Store a block-diagonal graph of every conversation in their segments."""
        st = self._state
        for seg, local in zip(st.segments, split_graph(*graph, st.packed.conv_offsets
                                                       if st.packed is not None
                                                       else self._full().conv_offsets)):
            seg.graphs.setdefault(key, local)
        if st.packed is not None:
            st.packed.graph_cache[key] = graph
        self._graph_keys = self._graph_keys | {key}

    @classmethod
    def from_nodes(cls, node_emb: Tensor, sessions_per_conversation, graph=None,
                   params: Optional[GraphParams] = None) -> "MemoryIndex":
        """A bare index over precomputed node embeddings (benchmarks, tensor-level use).

        Args:
            node_emb: ``[n_rows * N_GRAN, d]`` interleaved node embeddings (node
                ``N_GRAN*row + g``), conversations one after the other.
            sessions_per_conversation: session count of each conversation.
            graph: optional ``(indptr, indices)`` association graph (else built on use).
            params: the graph's settings (default :class:`GraphParams`).
        """
        sizes = torch.as_tensor(list(sessions_per_conversation), dtype=torch.long)
        n_rows = int(sizes.sum())
        d = node_emb.shape[-1]
        p = params or GraphParams()
        metas = [ConversationMeta(str(c), [str(i) for i in range(int(k))], [""] * int(k))
                 for c, k in enumerate(sizes.tolist())]
        graphs = {}
        if graph is not None:
            graphs[p.key()] = (graph[0].cpu(), graph[1].cpu())
        idx = cls(conversations=metas, questions=[],
                  conv_offsets=torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)]),
                  row_slot=torch.arange(n_rows),  # metadata stays on the CPU
                  gran=node_emb.reshape(n_rows, N_GRAN, d), concat=None,
                  q_emb=node_emb.new_zeros(0, d), q_conv=torch.zeros(0, dtype=torch.long),
                  graphs=graphs, params=p, config={})
        if graph is not None:  # keep the caller's tensors (and device) for the packed view
            idx._state.packed.graph_cache[p.key()] = graph
        return idx

    # ------------------------------------------------------------------ reads
    def view(self, conversations: Optional[Sequence[int]] = None,
             state: Optional[State] = None) -> View:
        """The read path's packed view of some conversations (positions, default all) of
        ``state`` (default: the current one), from the cache."""
        st = state or self._state
        n = len(st.segments)
        conv = range(n) if conversations is None else sorted(set(int(c) for c in
                                                                 conversations))
        if len(conv) == n and st.packed is not None:
            return st.packed
        versions = tuple(st.segments[c].version for c in conv)
        key = ("view", tuple(conv), versions)
        return self._cache.get(key, versions,
                               lambda: View(st, conv, self.params, self.config),
                               live=lambda: self._current(conv, versions))

    def _current(self, conv, versions) -> bool:
        """Whether conversations ``conv`` are still at ``versions`` (not rewritten)."""
        segs = self._state.segments
        return all(c < len(segs) and segs[c].version == v for c, v in zip(conv, versions))

    def state(self) -> State:
        """The current published state (one consistent version of every conversation)."""
        return self._state

    def clear_cache(self) -> None:
        """Drop every derived structure (rebuilt on the next read); stored data stays."""
        self._cache.clear()

    def _full(self) -> View:
        return self.view()

    def snapshot(self) -> View:
        """The whole index as one immutable packed view, as a fresh build of the same
        sessions would store it (slots in order of first use): what :meth:`save`
        writes.  It also carries ``questions``, ``q_emb``, ``q_conv`` and ``graphs``."""
        st = self._state
        full = self.view(state=st)
        if not full.is_canonical():
            versions = tuple(s.version for s in st.segments)
            full = self._cache.get(("canonical", versions), versions,
                                   lambda: View(st, range(len(st.segments)), self.params,
                                                self.config, canonical=True),
                                   live=lambda: self._current(range(len(versions)),
                                                              versions))
        full.questions, full.q_emb, full.q_conv = self.questions, self.q_emb, self.q_conv
        full.graph_keys = self._persisted_keys(st)
        return full

    def _persisted_keys(self, st: State) -> frozenset:
        """Graph settings every conversation holds (saved with the index)."""
        if not st.segments:
            return self._graph_keys
        keys = set(st.segments[0].graphs)
        for s in st.segments[1:]:
            keys &= s.graphs.keys()
        return frozenset(keys)

    def retrieve(self, questions=None, method: Optional[str] = None, **kwargs):
        """Rank sessions for the index's own questions; see
        :func:`memgas_gpu.retrieve.retrieve`."""
        from .search import retrieve

        return retrieve(self, questions, method=method, **kwargs)

    def search(self, conversation_id, queries: Sequence[str], k: int = 10,
               method: Optional[str] = None, **kwargs) -> list:
        """Rank a conversation's sessions for new query texts (encoded with the index's
        own encoder); one :class:`~memgas_gpu.retrieve.SearchResult` per query with
        session ids, scores and the best-matching turns.  See
        :func:`memgas_gpu.retrieve.search`."""
        from .search import search

        return search(self, conversation_id, queries, k=k, method=method, **kwargs)

    def save(self, path, dtype: torch.dtype = torch.float32, **options):
        """Write the index folder (see ``docs/index-format.md``) from one snapshot (writes
        running meanwhile are not in it); ``options``: ``force``, ``lock_timeout`` of
        :func:`~memgas_gpu.retrieve.persist.save_index`.  ``dtype``: how embeddings are
        stored, ``torch.float32`` (default), ``torch.float16`` or ``torch.bfloat16``, or
        the name of one (``"float16"``); anything else is a TypeError."""
        from .persist import save_index

        dtype = float_dtype(dtype)
        return save_index(self, path, dtype=dtype, **options)

    @classmethod
    def load(cls, path) -> "MemoryIndex":
        """Read an index folder written by :meth:`save`."""
        from .persist import load_index

        return load_index(path, cls)

    # ------------------------------------------------------------------ encoder
    def query_encoder(self, encoder: Any = None):
        """The encoder for new queries: ``encoder``, the one :meth:`build` used in this
        process, or the one the index records (reloaded once, without network access
        unless allowed: :func:`memgas_gpu.encode.recorded_encoder`).

        Raises:
            EncoderMismatchError: its fingerprint differs from the index's.
            EncoderRecordError: the recorded encoder cannot be opened here.
        """
        require_encoder(encoder)
        enc = encoder or self._encoder
        if enc is None:
            if not self.config.get("encoder_source"):
                raise EncoderMismatchError("this index does not record its encoder (built "
                                           "with a custom one): pass encoder=")
            from ..encode import recorded_encoder  # offline unless downloads are allowed

            enc = recorded_encoder(self.config)
        self._check_encoder(enc)
        if encoder is None:
            self._encoder = enc
        return enc

    def _check_encoder(self, enc) -> None:
        want = self.config.get("encoder_fingerprint")
        got = getattr(enc, "fingerprint", None)
        if want and got and want != got:
            raise EncoderMismatchError(
                f"the query encoder ({_describe(enc)}) differs from the one this index was "
                f"built with ({(self.config.get('encoder') or {}).get('model')}, "
                f"fingerprint {want}): scores would be meaningless")

    # ------------------------------------------------------------------ writes
    def add_session(self, conversation_id: str, session: Session, *,
                    summary: Optional[str] = None, keywords: Optional[str] = None,
                    encoder: Any = None) -> None:
        """Append ``session`` to a conversation (created when the id is new) and link it.

        Only the new session's nodes get edges (to earlier sessions), so every stored
        graph ends up identical to a full rebuild with the same texts.  A session another
        conversation already holds (same id and turns) is stored once, as in a build.
        Costs what this conversation costs; everything is checked, encoded and linked
        before the index changes, so a failure leaves it as it was.

        Args:
            conversation_id: the conversation to grow (a new id creates it).
            session: the new, latest session.
            summary, keywords: its U and K texts.  ``None``: the offline extractor on
                this session alone (corpus statistics of one session; pass the texts
                to reproduce another source exactly).
            encoder: the encoder the index was built with (default: the one used by
                :meth:`build` in this process); its fingerprint must match.

        Raises:
            TypeError, ValueError: a malformed id, session or text (nothing changed).
        """
        check_session(conversation_id, session, summary, keywords)
        with self._write_lock:
            st = self._state
            ci = st.ids.get(conversation_id)
            old = st.segments[ci] if ci is not None else None
            if old is not None and session.id in old.meta.session_ids:
                raise ValueError(f"conversation {conversation_id!r} already has a session "
                                 f"{session.id!r}")
            enc = self.query_encoder(encoder)
            summary, keywords = session_texts(session, summary, keywords)
            digest = session_digest(session, summary, keywords)
            store = self._store
            store.track(st.segments)
            mark = store.mark()
            slot = store.find(digest)
            shared = slot is not None
            try:
                if shared:
                    store.ref(slot)
                else:
                    slot = append_session(store, session, summary, keywords, enc, self.dim,
                                          digest)
                tables = store.tables()
                slots = torch.cat([old.slots if old is not None
                                   else torch.zeros(0, dtype=torch.long),
                                   torch.tensor([slot])])
                keys = (old.graphs.keys() if old is not None else self._persisted_keys(st))
                graphs = {k: grow_graph(old.graphs[k] if old is not None else empty_local(0),
                                        tables.gran[slots],
                                        GraphParams.from_key(k, self.params)) for k in keys}
            except BaseException:  # no published state refers to what changed: undo it
                if shared:
                    store.unref(slot, undo=True)
                else:
                    store.rollback(mark)
                raise
            meta = ConversationMeta(conversation_id,
                                    [*(old.meta.session_ids if old else ()), session.id],
                                    [*(old.meta.session_dates if old else ()), session.date])
            seg = Segment(meta, slots, graphs)
            self._publish(with_segment(st, len(st.segments) if ci is None else ci, seg,
                                       tables), [old.version] if old is not None else [])

    def remove_session(self, conversation_id: str, session_id: str) -> None:
        """Forget one session of a conversation.

        The conversation's graphs are rebuilt (later sessions lose candidates and move up
        one position, so their edges change) and the session's rows are dropped, so the
        index equals a rebuild without the session: same graph edges, embeddings and BM25
        statistics.  A session shared with another conversation (LongMemEval haystacks)
        keeps its embeddings for the others.  Costs what this conversation costs.

        Raises:
            KeyError: unknown conversation or session id.
        """
        with self._write_lock:
            st = self._state
            ci = st.position(conversation_id)
            old = st.segments[ci]
            if session_id not in old.meta.session_ids:
                raise KeyError(f"conversation {conversation_id!r} has no session "
                               f"{session_id!r}")
            j = old.meta.session_ids.index(session_id)
            keep = torch.cat([old.slots[:j], old.slots[j + 1:]])
            t = st.tables
            graphs = {k: local_graph(t.gran[keep].reshape(-1, self.dim), keep.numel(),
                                     GraphParams.from_key(k, self.params))
                      for k in old.graphs}
            ids, dates = list(old.meta.session_ids), list(old.meta.session_dates)
            del ids[j], dates[j]
            store = self._store
            store.track(st.segments)
            store.unref(int(old.slots[j]))
            seg = Segment(ConversationMeta(conversation_id, ids, dates), keep, graphs)
            new = with_segment(st, ci, seg, st.tables)
            stale = [old.version]
            if store.wants_compaction():
                new, gone = self._compact(new)
                stale += gone
            self._publish(new, stale)

    def compact(self) -> int:
        """Drop the stored sessions no conversation uses any more (removed ones) now,
        instead of when they outnumber the live ones; returns how many were dropped.
        Costs a copy of every live session's data."""
        with self._write_lock:
            st = self._state
            self._store.track(st.segments)
            dropped = self._store.garbage
            if dropped:
                new, gone = self._compact(st)
                self._publish(new, gone)
            return dropped

    def _compact(self, st: State) -> tuple[State, list]:
        """Copy the live slots into new buffers and renumber every segment (amortized:
        only when more than half the store is garbage)."""
        store, remap = self._store.compacted()
        self._store = store
        segs = tuple(Segment(s.meta, remap[s.slots], s.graphs) for s in st.segments)
        return State(segs, st.ids, store.tables()), [s.version for s in st.segments]

    def _publish(self, state: State, stale: Sequence[int]) -> None:
        self._state = state  # one reference swap: readers see the old or the new state
        self._cache.forget(stale)

    # ------------------------------------------------------------------ packed view
    @property
    def version(self) -> int:
        """Changes with every write (a process-unique number)."""
        return self._state.version

    @property
    def conversations(self) -> list[ConversationMeta]:
        return [s.meta for s in self._state.segments]

    @property
    def n_conversations(self) -> int:
        return len(self._state.segments)

    @property
    def conv_offsets(self) -> Tensor:
        return self._full().conv_offsets

    @property
    def n_rows(self) -> int:
        return sum(s.n for s in self._state.segments)

    @property
    def dim(self) -> int:
        return int(self._state.tables.gran.shape[-1])

    @property
    def keeps_text(self) -> bool:
        """Whether the index stores turn texts (evidence, the speaker cue)."""
        return self._state.tables.turn_text is not None

    @property
    def build_params(self) -> BuildParams:
        """The write path's settings this index was built with (sources by name)."""
        return BuildParams.from_record((self.config or {}).get("build"))

    @property
    def cache(self) -> dict:
        """Derived data of the whole index's current view (see :mod:`.cache`)."""
        return self._full().cache

    def stores(self, need: str) -> bool:
        """Whether the index stores what a signal needs (``"gran"``, ``"turns"``, a dense
        table, ``"lexical:<documents>"``; see :func:`memgas_gpu.retrieve.signals.has`),
        read from the current state without packing anything."""
        t = self._state.tables
        if need == "gran":
            return True
        if need == "turns":
            return t.turns is not None
        if need.startswith("lexical:"):
            return t.lexical_docs is not None and need[len("lexical:"):] in t.lexical_docs
        return need in t.dense

    @property
    def question_terms(self):
        """Term counts of the dataset's questions (a TermMatrix), or None."""
        lex = self._store.lexical
        return lex.queries if lex is not None else None

    row_slot = property(lambda self: self.snapshot().row_slot)
    gran = property(lambda self: self.snapshot().gran)
    concat = property(lambda self: self.snapshot().concat)

    def stored(self, table: str) -> Optional[Tensor]:
        """The dense table ``table`` (rows by slot, as :attr:`row_slot` numbers them), or
        None when the index does not store it."""
        return self.snapshot().stored(table)
    turns = property(lambda self: self.snapshot().turns)
    turn_ptr = property(lambda self: self.snapshot().turn_ptr)
    turn_text = property(lambda self: self.snapshot().turn_text)
    lexical = property(lambda self: self.snapshot().lexical)

    @property
    def graphs(self) -> dict:
        """Every saved graph setting (key → block-diagonal CSR of all conversations)."""
        snap = self.snapshot()
        return {k: snap.graph(GraphParams.from_key(k, self.params))
                for k in sorted(snap.graph_keys)}

    def conversation_index(self, conversation_id: str) -> int:
        return self._state.position(conversation_id)

    def node_embeddings(self, rows: Optional[Tensor] = None) -> Tensor:
        """``[n_rows*N_GRAN, d]`` interleaved node embeddings (node ``N_GRAN*row + g``)."""
        return self._full().node_embeddings(rows)

    def best_turns(self, query_emb: Tensor, rows: Tensor, n: int = 3) -> list:
        """For each session row, its ``n`` turns most similar to ``query_emb``:
        ``[(turn index, text or None, <query, turn>)]``, best first (empty when the
        index keeps no turn embeddings)."""
        from .search import best_turns

        return best_turns(self._full(), query_emb, rows, n)

    # ------------------------------------------------------------------ graph
    def graph(self, params: Optional[GraphParams] = None, device: Optional[str] = None
              ) -> tuple[Tensor, Tensor]:
        """The association graph (CSR ``indptr, indices``) of every conversation, built
        once per setting (and saved with the index from then on)."""
        got = self._full().graph(params or self.params, device)
        self._graph_keys = self._graph_keys | {(params or self.params).key()}
        return got


def _encoder_source(encoder) -> Optional[dict]:
    """Where to reload ``encoder`` from (None for a custom encoder object)."""
    src = getattr(encoder, "source", None)
    if not isinstance(src, str):
        return None
    from ..encode import bundled_model_path

    return {"path": src, "bundled": src == bundled_model_path()}


def _describe(enc) -> str:
    d = getattr(enc, "describe", None)
    return str(d().get("model")) if callable(d) else repr(enc)
