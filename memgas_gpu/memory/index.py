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
(:meth:`MemoryIndex.retrieve`, :meth:`MemoryIndex.search`) takes the current state once,
packs only the conversations it asks about into the block-diagonal layout of the read
path (:class:`~memgas_gpu.memory.segments.View`, cached by :mod:`.cache`) and hands
that view to the read path, which reads nothing else.

The packed tensors of the whole index (``conv_offsets``, ``row_slot``, ``gran``, the
graphs, ...) are those of :meth:`MemoryIndex.snapshot`: exactly what a fresh build of
the same sessions holds.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from .._checks import float_dtype, require_encoder, resolve_device
from ..data.model import Dataset, Question, Session, per_session
from ..errors import MemgasError
from ..expand.expansion import expand_dataset
from .cache import DEFAULT_MAX_VIEWS, ViewCache
from .chunks import ChunkedStore
from .durable import Durable
from .lazy import MAX_RESIDENT_BYTES, Base, Resident
from .embed import embed_sessions, encode_unique
from ..retrieve.engine import DEFAULT_METHOD, resolve
from ..retrieve.graphs import build_graph
from .meta import BuildParams, ConversationMeta, GraphParams
from ..retrieve.search import (Retrieval, SearchRequest, SearchResult, question_indices,
                     rank_queries, rank_questions)
from .segments import Segment, State, View, split_graph
from ..retrieve.signals import QueryBatch, signal_texts
from .store import DIGEST_BYTES, SessionStore, session_digest
from ..retrieve.filters import check_metadata
from .writes import (AddOp, Encoded, ForgetOp, RemoveOp, ReplaceOp, WriteContext,
                     apply_ops, check_session, encode_sessions, session_texts,
                     stored_encoding)
from .texts import TextTable

__all__ = ["MemoryIndex", "DurableMemory", "BuildParams", "GraphParams",
           "EncoderMismatchError"]


class EncoderMismatchError(MemgasError, ValueError):
    """A query encoder that differs from the one the index was built with."""


class MemoryIndex:
    """Multi-granularity memory of many conversations.

    Build with :meth:`build` (an empty ``Dataset([])`` gives an empty memory), grow
    with :meth:`add_session` / :meth:`remove_session`, query with :meth:`search` (new
    texts) or :meth:`retrieve` (the dataset's questions), persist with :meth:`save` /
    :meth:`load`.

    **Threads.** One index may be shared by many threads.  Every read (``search``,
    ``retrieve``, :meth:`view`, :meth:`snapshot`) sees the index as it was when the
    read started: a state published by a complete write, never a half-applied one.
    Writes (``add_session``, ``remove_session``) are serialized by a lock (a new
    session is encoded before it, so writers encode at the same time) and never wait
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
                 max_views: int = DEFAULT_MAX_VIEWS, digest: Optional[Tensor] = None,
                 generation: int = 0, segment_days: Optional[list] = None) -> None:
        dense = dict(tables or {})
        if concat is not None:
            dense["concat"] = concat
        store = SessionStore(gran, dense, turns, turn_ptr, turn_text, lexical, digest,
                             generation)
        offs = conv_offsets.tolist()
        # segments keep their graphs on the CPU; the first view keeps the tensors given
        parts = {k: split_graph(ip.cpu(), ix.cpu(), conv_offsets)
                 for k, (ip, ix) in graphs.items()}
        segs = [Segment(ConversationMeta(c.id, list(c.session_ids), list(c.session_dates),
                                         c.session_metadata),
                        row_slot[offs[i]:offs[i + 1]].clone(),
                        {k: parts[k][i] for k in parts},
                        days=segment_days[i] if segment_days is not None else None)
                for i, c in enumerate(conversations)]
        q_ids = [conversations[c].id for c in q_conv.tolist()]
        self._setup(store, segs, questions, q_emb, q_ids, params, config,
                    frozenset(graphs) | {params.key()}, max_views, graphs=graphs)

    def _setup(self, store: SessionStore, segments: Optional[list], questions: list,
               q_emb: Tensor, q_ids: list, params: GraphParams, config: dict,
               graph_keys: frozenset, max_views: int = DEFAULT_MAX_VIEWS,
               graphs: Optional[dict] = None, directory=None,
               max_resident_bytes: int = MAX_RESIDENT_BYTES) -> None:
        """The one assembler of a memory: a store, its conversations' segments (in
        order) or the ``directory`` of a commit they are read from when needed
        (:mod:`.lazy`), the dataset's questions (``q_ids``: each one's conversation)."""
        self._resident = Resident(max_resident_bytes)
        if store.base is not None:
            store.base.resident = self._resident
        if directory is None:
            state = State.of(segments, store.tables())
        else:
            state = State({}, store.tables(), Base(directory, self._resident),
                          directory.count, directory.next_ordinal, frozenset(graph_keys))
        self.questions = questions
        self.q_emb = q_emb
        self.params = params
        self.config = config
        #: the folder and version this index was loaded from or last saved to
        #: (:class:`~memgas_gpu.storage.folder.FolderVersion`), else None
        self.folder_version = None
        #: ``{folder: version}`` of every folder this index was loaded from or saved to
        #: (folders absolute, symbolic links resolved); a save into one of them after
        #: another writer's is refused (docs/failure.md)
        self.folder_versions: dict = {}
        #: ``{signal: module}`` of the custom signals a loaded folder recorded
        self.signal_modules: dict = {}
        self._encoder = None
        self._write_lock = threading.RLock()
        self._save_lock = threading.Lock()  # one save at a time (:meth:`save`)
        self._cache = ViewCache(max_views)
        self._store = store
        self._graph_keys = frozenset(graph_keys)
        self._state = state
        self._tip = self._state  # the state writes build on (ahead while logging)
        self._q_ids = list(q_ids)
        self._question_conversations = frozenset(self._q_ids)
        if directory is None:
            # the view of every conversation, with the joined graphs given: nothing is
            # joined again for the first read of the whole index
            self._view_at(state.order(), state, graphs=graphs)

    @classmethod
    def from_parts(cls, parts, max_views: int = DEFAULT_MAX_VIEWS,
                   max_resident_bytes: int = MAX_RESIDENT_BYTES) -> "MemoryIndex":
        """A memory of what a reader read (a :class:`~memgas_gpu.storage.commit.Parts`,
        checked by :func:`~memgas_gpu.storage.validate.check_parts`): the one way every
        folder format becomes a memory.  A format-4 commit's conversations stay in its
        directory until they are needed (:mod:`.lazy`)."""
        from ..lexical import LexicalIndex, TermMatrix, Tokenizer
        from ..lexical.tokenize import Vocabulary

        h, s, q = parts.header, parts.store, parts.questions
        lexical = None
        if isinstance(s, dict) and s["lexical"] is not None:
            docs, ptr, raw, off = s["lexical"]
            data, off = raw.numpy().tobytes(), off.tolist()
            vocab = Vocabulary(data[a:b].decode("utf-8") for a, b in zip(off[:-1], off[1:]))
            queries = TermMatrix(*q["terms"][:2], q["terms"][2].float())
            lexical = LexicalIndex(Tokenizer.from_config(h["lexical"]["tokenizer"]), vocab,
                                   {g: TermMatrix(*v) for g, v in docs.items()}, dict(ptr),
                                   queries)
        if not isinstance(s, dict):  # the commit's chunks, read when needed
            store = SessionStore.lazy(ChunkedStore(s), int(h.get("generation") or 0))
        else:
            store = SessionStore(s["gran"].float(),
                                 {k: v.float() for k, v in s["dense"].items()},
                                 s["turns"].float() if s["turns"] is not None else None,
                                 s["turn_ptr"], s["turn_text"], lexical, s["digest"],
                                 int(h.get("generation") or 0), commit_refs=s.get("refs"))
        lazy = not isinstance(parts.segments, list)
        segments = None if lazy else [
            Segment(ConversationMeta(m["id"], list(m["session_ids"]),
                                     list(m["session_dates"]), m.get("session_metadata")),
                    slots.to(torch.int64), dict(graphs),
                    days=days.to(torch.float64) if days is not None else None)
            for m, slots, days, graphs in parts.segments]
        questions = [Question(id=r["id"], text=r["text"], type=r["type"], date=r["date"],
                              answer=r["answer"],
                              evidence_session_ids=tuple(r["evidence_session_ids"]),
                              evidence_turn_ids=tuple(r.get("evidence_turn_ids", ())),
                              is_abstention=r["is_abstention"]) for r in q["records"]]
        params = GraphParams(**h["params"])
        idx = cls.__new__(cls)
        keys = frozenset(h["graphs"])
        idx._setup(store, segments, questions, q["q_emb"].float(), list(q["conversations"]),
                   params, h["config"], keys | {params.key()} if not lazy else keys,
                   max_views, directory=parts.segments if lazy else None,
                   max_resident_bytes=max_resident_bytes)
        if lazy:
            idx._graph_keys = keys | {params.key()}
        idx.signal_modules = dict(h.get("signal_modules") or {})
        return idx

    def __getstate__(self) -> dict:
        """For copies and Ray tasks: the published state, without the lock and the
        derived-data cache (rebuilt on the other side)."""
        d = dict(self.__dict__)
        d.pop("_write_lock", None)
        d.pop("_save_lock", None)
        d["_cache"] = self._cache.max_views
        d["_resident"] = self._resident.max_bytes
        for k in ("_state", "_tip"):  # a copy holds every conversation in RAM
            st = d[k]
            if st.base is not None:
                d[k] = State.of(list(st.segments), st.tables)
        return d

    def __setstate__(self, d: dict) -> None:
        d = dict(d)
        d["_cache"] = ViewCache(d["_cache"])
        d["_resident"] = Resident(d.get("_resident", MAX_RESIDENT_BYTES))
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
        p = (params or BuildParams()).replace(**settings)
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
        dense = signal_texts("dense")
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
                                p.tokenizer, extra=signal_texts("lexical"))
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
        full = idx.view()
        graph = build_graph(full, idx.params, device=device, progress=progress,
                            mapper=graph_mapper)
        for seg, local in zip(full.segments, split_graph(*graph, full.conv_offsets)):
            seg.graphs.setdefault(idx.params.key(), local)
        full.graph_cache[idx.params.key()] = graph
        timings["graph_s"] = time.perf_counter() - t0
        idx.config["timings"] = timings
        return idx

    # ------------------------------------------------------------------ reads
    def view(self, conversation_ids: Optional[Sequence[str]] = None,
             state: Optional[State] = None) -> View:
        """The read path's packed view of some conversations (default all) of ``state``
        (default: the current one), from the cache; conversations in index order.

        Raises:
            KeyError: a conversation id the state does not hold.
        """
        st = state or self._state
        if conversation_ids is None:
            return self._view_at(st.order(), st)
        ids = list(conversation_ids)
        for c in ids:
            if c not in st:
                raise KeyError(f"no conversation {c!r} in this index")
        return self._view_at(ids, st)

    def _view_at(self, conversation_ids, state: State, graphs: Optional[dict] = None
                 ) -> View:
        conv = sorted(set(conversation_ids), key=state.ordinal)
        keys = tuple((c, state.version_of(c)) for c in conv)
        versions = tuple(v for _, v in keys)
        return self._cache.get(("view", versions), versions,
                               lambda: View(state, conv, self.params, self.config,
                                            graphs=graphs),
                               live=lambda: self._state.holds(keys))

    def state(self) -> State:
        """The current published state (one consistent version of every conversation)."""
        return self._state

    def clear_cache(self) -> None:
        """Drop every derived structure (rebuilt on the next read); stored data stays."""
        self._cache.clear()

    def snapshot(self, state: Optional[State] = None) -> View:
        """The whole index as one view, exactly as a fresh build of the same sessions
        would store it (slots in order of first use, only the terms they use): what
        :meth:`save` writes."""
        st = state or self._state
        order = st.order()
        full = self._view_at(order, st)
        if full.is_canonical():
            return full
        keys = tuple((c, st.version_of(c)) for c in order)
        versions = tuple(v for _, v in keys)
        return self._cache.get(("canonical", versions), versions,
                               lambda: View(st, order, self.params,
                                            self.config, canonical=True),
                               live=lambda: self._state.holds(keys))

    def saved_graph_keys(self, view: View) -> frozenset:
        """The graph settings a save of ``view`` keeps: those every conversation holds
        (the index's own settings when it holds no conversation)."""
        return view.saved_graph_keys() if view.segments else self._graph_keys

    def graph_keys_of(self, state: State) -> frozenset:
        """The graph settings every conversation of ``state`` holds (the index's own when
        it holds none), without packing a view."""
        keys = state.graph_keys()
        return self._graph_keys if keys is None else keys

    def question_view(self, questions=None) -> tuple[View, QueryBatch, Tensor]:
        """The view of the conversations the dataset's questions ``questions`` (indices
        into :attr:`questions`, default all) ask about, their :class:`QueryBatch` laid
        out on it, and the question indices.

        Raises:
            TypeError, IndexError: ``questions`` are not indices of this index's questions.
        """
        qi = question_indices(len(self.questions), questions)
        st = self._state
        ids = [self._q_ids[i] for i in qi.tolist()]
        for c in ids:
            st.segment(c)  # KeyError: not held
        view = self._view_at(set(ids), st)
        lex = view.lexical
        qs = [self.questions[i] for i in qi.tolist()]
        batch = QueryBatch(self.q_emb[qi], view.positions(ids),
                           lex.queries.rows(qi) if lex is not None else None,
                           [q.text for q in qs], [q.date for q in qs])
        return view, batch, qi

    def retrieve(self, questions=None, method: Optional[str] = None,
                 params=None, device: Optional[str] = None, **settings) -> Retrieval:
        """Rank the sessions of each of the dataset's questions' conversation.

        Args:
            questions: indices into :attr:`questions` (default: all).
            method: a preset name (:data:`~memgas_gpu.retrieve.METHODS`; default
                ``memgas_hybrid``): ``"memgas"`` (full), ablations ``"no_gmm"``,
                ``"no_ppr"``, ``"no_router"``, ``"no_association"``, flat ``"session"``,
                ``"turn"``, ``"summary"``, ``"keyword"``, ``"concat"``, lexical
                ``"bm25"`` and ``"memgas_hybrid"``.
            params: a :class:`~memgas_gpu.retrieve.ReadParams` replacing the preset.
            device: where to compute (default: CUDA if available).
            **settings: ReadParams fields overriding the preset (None = keep).

        Returns:
            A :class:`~memgas_gpu.retrieve.Retrieval`.
        """
        resolve_device(device)  # before any work
        view, batch, qi = self.question_view(questions)
        method = method or DEFAULT_METHOD
        p, info = resolve(view, method, params, **settings)
        return rank_questions(view, batch, qi, method, p, info, device)

    def search(self, conversation_id, queries: Sequence[str], k: int = 10,
               method: Optional[str] = None, encoder: Any = None, evidence: int = 3,
               device: Optional[str] = None, question_date: Optional[str] = None,
               after: Optional[str] = None, before: Optional[str] = None,
               metadata: Optional[dict] = None, **settings) -> list:
        """Rank the sessions of a conversation for new query texts.

        The search sees the index as it was when it started (writes running meanwhile
        are not in it) and costs what the asked conversations cost.

        Args:
            conversation_id: one id for every query, or a list with one id per query.
            queries: the query texts.
            k: sessions returned per query.
            method, **settings: as :meth:`retrieve`.
            encoder: the index's encoder (default: reloaded from the index's record); a
                different encoder is an error.
            evidence: best turns returned per session (by ``<query, turn>`` when the
                index keeps turn embeddings, else none).
            device: where to compute.
            question_date: when the queries are asked (any date format; anchors
                relative time expressions such as "last week" for the time cue).
            after, before: return only sessions dated on or after / on or before these
                dates (any format python-dateutil reads; a session without a readable
                date is left out when either is given).
            metadata: return only sessions whose metadata holds every one of these
                key/value pairs.  Filters choose what is returned; the scores are those
                of the whole conversation.

        Returns:
            One :class:`~memgas_gpu.retrieve.SearchResult` per query; empty lists for a
            conversation without sessions, and for a conversation id the memory does
            not hold (nothing was added to it yet, or it was forgotten).
        """
        return self.search_many([SearchRequest(
            conversation_id, queries, k, method, evidence, question_date, after, before,
            metadata, settings)], encoder=encoder, device=device)[0]

    def search_many(self, requests: Sequence["SearchRequest"], encoder: Any = None,
                    device: Optional[str] = None) -> list:
        """Answer many searches at once (the callers of a server, say): every query of
        every request encoded in one encoder batch, and the requests that share their
        method and settings answered by one read-path call over the union of their
        conversations.  Each request gets what :meth:`search` with its arguments returns
        (up to float rounding of a batch).

        Args:
            requests: :class:`~memgas_gpu.retrieve.search.SearchRequest` objects.
            encoder, device: as :meth:`search`.

        Returns:
            One list of :class:`~memgas_gpu.retrieve.SearchResult` per request.

        Raises:
            TypeError, ValueError: a bad argument of a request (nothing is encoded).
        """
        reqs = [r.checked() for r in requests]
        require_encoder(encoder)
        resolve_device(device)  # before the queries are encoded
        st = self._state
        groups: dict = {}
        for i, r in enumerate(reqs):
            groups.setdefault(r.group(), []).append(i)
        plan = []
        for idxs in groups.values():
            asked = [(i, j) for i in idxs for j, c in enumerate(reqs[i].conversation_id)
                     if c in st]
            view = self._view_at({reqs[i].conversation_id[j] for i, j in asked}, st)
            r0 = reqs[idxs[0]]
            p, _ = resolve(view, r0.method or DEFAULT_METHOD, None, **r0.settings)
            plan.append((view, p, asked))
        out = [[SearchResult(c, [], [], []) for c in r.conversation_id] for r in reqs]
        texts = [reqs[i].queries[j] for _, _, asked in plan for i, j in asked]
        if not texts:
            return out
        distinct = list(dict.fromkeys(texts))  # each distinct question encoded once
        q_emb = self.query_encoder(encoder).encode(distinct, progress=False).float().cpu()
        if len(distinct) < len(texts):
            row = {t: i for i, t in enumerate(distinct)}
            q_emb = q_emb[torch.tensor([row[t] for t in texts])]
        at = 0
        for view, p, asked in plan:
            if not asked:
                continue
            got = rank_queries(
                view, [reqs[i].conversation_id[j] for i, j in asked],
                [reqs[i].queries[j] for i, j in asked], q_emb[at:at + len(asked)], p,
                k=[reqs[i].k for i, _ in asked], evidence=[reqs[i].evidence for i, _ in asked],
                device=device, question_date=[reqs[i].question_date for i, _ in asked],
                keep=[reqs[i].keep for i, _ in asked])
            at += len(asked)
            for (i, j), res in zip(asked, got):
                out[i][j] = res
        return out

    def save(self, path, dtype: torch.dtype = torch.float32, **options):
        """Write the memory to the folder ``path`` (docs/index-format.md): one complete
        commit of one snapshot (writes running meanwhile are not in it), the format a
        memory opened with :meth:`open` keeps, so opening it converts nothing.  An
        index already there is replaced atomically (readers see the old or the new
        one).  ``options``: ``force``, ``lock_timeout`` of
        :func:`~memgas_gpu.storage.folder.save_index`.  ``dtype``: how embeddings are
        stored, ``torch.float32`` (default), ``torch.float16`` or ``torch.bfloat16``, or
        the name of one (``"float16"``); anything else is a TypeError."""
        from ..storage.folder import save_index

        dtype = float_dtype(dtype)
        return save_index(self, path, dtype=dtype, **options)

    def saving(self):
        """The lock every save of this index holds, from its snapshot to its new folder
        version (one save at a time: a save that starts after another returned writes a
        state at least as new)."""
        return self._save_lock

    def commit_input(self, state: Optional[State] = None, *, canonical: bool = False,
                     lsn: int = 0, dtype: torch.dtype = torch.float32):
        """What a commit of ``state`` (default: the current one) writes
        (:class:`~memgas_gpu.storage.commit.CommitInput`); ``canonical``: as a fresh
        build of the same sessions would store it (slots in order of first use, only
        the terms they use: what :meth:`save` writes)."""
        import dataclasses

        from ..retrieve.signals import custom_signal_modules
        from ..storage.commit import CommitInput

        st = state or self._state
        if canonical:
            view = self.snapshot(st)
            offs = view.conv_offsets.tolist()
            segments = [_Stored(s.meta, view.row_slot[offs[i]:offs[i + 1]], s.days,
                                s.graphs, None) for i, s in enumerate(view.segments)]
            tables = view.tables
            keys = self.saved_graph_keys(view)
        else:
            segments, tables, keys = _InOrder(st), st.tables, self.graph_keys_of(st)
        lex = tables.lexical_base
        header = {"params": dataclasses.asdict(self.params), "config": self.config,
                  "tables": tables.dense_names,
                  "lexical": lex.describe() if lex is not None else None,
                  "signal_modules": {**self.signal_modules, **custom_signal_modules()}}
        if lex is not None:
            header["lexical"]["n_terms"] = int(tables.n_terms)
        questions = {"records": [{"id": q.id, "text": q.text, "type": q.type, "date": q.date,
                                  "answer": q.answer,
                                  "evidence_session_ids": list(q.evidence_session_ids),
                                  "evidence_turn_ids": list(q.evidence_turn_ids),
                                  "is_abstention": q.is_abstention} for q in self.questions],
                     "conversations": list(self._q_ids), "q_emb": self.q_emb.float(),
                     "terms": lex.queries if lex is not None else None}
        if canonical:
            return CommitInput(segments, tables, header, frozenset(keys), questions, lsn,
                               dtype)
        base = st.base

        def base_slots(cid):
            seg = base.segment(cid, keep=False)
            return seg.slots if seg is not None else None

        return CommitInput(segments, tables, header, frozenset(keys), questions, lsn, dtype,
                           ordinals=segments.ordinals(), changed=st.changed(),
                           n_conversations=st.n, next_ordinal=st.next_ordinal,
                           base_slots=base_slots if base is not None else None)

    @classmethod
    def load(cls, path, *, max_resident_bytes: Optional[int] = None) -> "MemoryIndex":
        """Read the memory in the folder ``path`` (written by :meth:`save`, ``memgas
        index`` or a memory opened with :meth:`open`, as its writer last made it
        durable: its last commit and the log after it), in memory only.  Older folder
        formats load too (docs/index-format.md).  A folder of format 4 is read lazily:
        its root now, each conversation (and store chunk) the first time a read needs
        it, at most ``max_resident_bytes`` of them kept (default 256 MiB;
        :mod:`memgas_gpu.memory.lazy`).

        Raises:
            IndexFormatError: not a memory's folder, or a damaged one (one line naming
                the file and the field or offset).
        """
        from ..storage.folder import load_index

        return load_index(path, cls, max_resident_bytes=MAX_RESIDENT_BYTES
                          if max_resident_bytes is None else max_resident_bytes)

    @classmethod
    def open(cls, path, encoder: Any = None, *, readonly: bool = False,
             checkpoint_bytes: Optional[int] = None,
             checkpoint_seconds: Optional[float] = None,
             lock_timeout: float = 0.0,
             max_resident_bytes: Optional[int] = None) -> "MemoryIndex":
        """A memory kept in the folder ``path`` (a
        :class:`~memgas_gpu.memory.durable.DurableMemory`): every ``add_session``,
        ``add_sessions``, ``replace_session``, ``remove_session`` and
        ``forget_conversation`` is written to the folder's log and synced before it
        returns, so it survives a crash of the process (docs/failure.md, "A durable
        memory").

        Creates an empty memory there when the folder does not exist (with ``encoder``,
        default the bundled one); opens a folder written by :meth:`save`, ``memgas
        index`` or an earlier ``open`` (older formats are converted once, by the first
        commit), replaying what its log holds after the last commit.  One process writes
        a folder at a time; any number follow it read-only.

        Args:
            encoder: the encoder of new sessions and queries (checked against the one
                the memory records).
            readonly: follow the folder without writing (no lock): :meth:`refresh`
                reads what the writer added since.
            checkpoint_bytes, checkpoint_seconds: a write runs a checkpoint once the log
                has grown by this many bytes (default 64 MiB) or this long after the
                last one (default 300 s); ``close`` always does.
            lock_timeout: seconds to wait for another writer to close the folder.
            max_resident_bytes: opening reads the folder's root, not the memory: each
                conversation's segment and each store chunk is read the first time a
                search, a write or a listing of its content needs it, and at most this
                many bytes of them are kept (default 256 MiB), the least recently used
                dropped first and read again when needed (:mod:`memgas_gpu.memory.lazy`).

        Raises:
            IndexLockError: another process has the folder open for writing (naming it).
            IndexFormatError: the folder is not a memory, or is damaged.
            SettingsError: an option out of its bounds (naming it).
        """
        return DurableMemory.open(path, encoder, readonly=readonly,
                                  checkpoint_bytes=checkpoint_bytes,
                                  checkpoint_seconds=checkpoint_seconds,
                                  lock_timeout=lock_timeout,
                                  max_resident_bytes=max_resident_bytes)

    @property
    def folder(self) -> Optional[str]:
        """The folder a memory was opened on (:meth:`open`); None for a memory in RAM."""
        return None

    @property
    def log_stats(self):
        """The write-ahead log's counters of a memory opened on a folder; None for a
        memory in RAM."""
        return None

    def close(self) -> None:
        """Nothing to release for a memory in RAM (a memory opened on a folder
        checkpoints and releases it)."""

    def __enter__(self) -> "MemoryIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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

    def use_encoder(self, encoder: Any) -> None:
        """Make ``encoder`` the memory's encoder of new sessions and queries (checked
        against the one it records)."""
        require_encoder(encoder)
        self._check_encoder(encoder)
        self._encoder = encoder

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
                    encoder: Any = None, metadata: Optional[dict] = None) -> None:
        """Append ``session`` to a conversation (created when the id is new) and link it.

        Only the new session's nodes get edges (to earlier sessions), so every stored
        graph ends up identical to a full rebuild with the same texts.  A session another
        conversation already holds with the same content (id, turns, summary and
        keywords) is stored once, as in a build.  Costs what this conversation costs;
        everything is checked, encoded and linked before the index changes, so a failure
        leaves it as it was.  On a memory opened on a folder (:meth:`open`), the session
        is in the folder's log, synced, before this returns.

        Args:
            conversation_id: the conversation to grow (a new id creates it).
            session: the new, latest session.
            summary, keywords: its U and K texts.  ``None``: the offline extractor on
                this session alone (corpus statistics of one session; pass the texts
                to reproduce another source exactly).
            encoder: the encoder the index was built with (default: the one used by
                :meth:`build` in this process); its fingerprint must match.
            metadata: the session's metadata in this conversation (string keys;
                strings, numbers, booleans or None), returned by :meth:`get_session`
                and matched by ``search(..., metadata=...)``.

        Raises:
            TypeError, ValueError: a malformed id, session, text or metadata, or a
                session id the conversation has (nothing changed).
        """
        self.add_sessions(conversation_id, [session], summaries=[summary],
                          keywords=[keywords], metadata=[metadata], encoder=encoder)

    def add_sessions(self, conversation_id: str, sessions: Sequence[Session], *,
                     summaries: Optional[Sequence] = None,
                     keywords: Optional[Sequence] = None,
                     metadata: Optional[Sequence] = None, encoder: Any = None) -> None:
        """Append several sessions to a conversation as one write: all of them or none
        (every one is checked, the new ones encoded together in one encoder call, then
        all are linked in order and published at once; on a memory opened on a folder
        they are one log record, so a crash leaves all of them or none).  Equals
        ``add_session`` of each in order.

        Args:
            sessions: the new sessions, in order (ids distinct, none the conversation
                holds).
            summaries, keywords, metadata: one per session (None: as ``add_session``).

        Raises:
            TypeError, ValueError: a malformed argument, two sessions of one id, or a
                session id the conversation holds (nothing changed).
        """
        sessions = list(sessions) if not isinstance(sessions, Session) else [sessions]
        per = per_session(len(sessions), summaries=summaries, keywords=keywords,
                          metadata=metadata)
        seen = set()
        for s, u, k in zip(sessions, per["summaries"], per["keywords"]):
            check_session(conversation_id, s, u, k)
            if s.id in seen:
                raise ValueError(f"session id {s.id!r} appears twice in one write; nothing "
                                 "was added")
            seen.add(s.id)
        mds = [check_metadata(m) for m in per["metadata"]]
        require_encoder(encoder)
        texts = [session_texts(s, u, k) for s, u, k in
                 zip(sessions, per["summaries"], per["keywords"])]
        fresh = self._encode_new(conversation_id, sessions, texts, encoder)
        self._write(lambda st: [self._add_op(st, conversation_id, s, u, k, m, f, encoder)
                                for s, (u, k), m, f in zip(sessions, texts, mds, fresh)])

    def replace_session(self, conversation_id: str, session: Session, *,
                        summary: Optional[str] = None, keywords: Optional[str] = None,
                        encoder: Any = None, metadata: Optional[dict] = None) -> None:
        """Replace the session of ``session.id`` of a conversation by ``session`` (its
        turns, date, texts and metadata), in its place, as one write: the memory equals
        a build with the new session where the old one was (the conversation's graphs
        are rebuilt; costs what this conversation costs).

        Raises:
            KeyError: an unknown conversation or session id.
            TypeError, ValueError: a malformed argument (nothing changed).
        """
        check_session(conversation_id, session, summary, keywords)
        md = check_metadata(metadata)
        require_encoder(encoder)
        summary, keywords = session_texts(session, summary, keywords)
        fresh = self._encode_new(conversation_id, [session], [(summary, keywords)], encoder,
                                 replace=True)[0]

        def change(st):
            op = self._add_op(st, conversation_id, session, summary, keywords, md, fresh,
                              encoder)
            return [ReplaceOp(op.conversation_id, op.session, op.summary, op.keywords,
                              op.encoded, op.metadata)]

        self._write(change)

    def _add_op(self, st: State, conversation_id: str, session: Session, summary: str,
                keywords: str, metadata: dict, fresh: Optional[Encoded],
                encoder: Any) -> AddOp:
        """The add of ``session`` with its embeddings: ``fresh`` (encoded before the
        lock), the store's when it holds the session, else encoded now."""
        encoded = fresh
        if encoded is None:
            slot = self._store.find(session_digest(session, summary, keywords))
            encoded = (stored_encoding(st.tables, slot) if slot is not None else
                       encode_sessions(self._store, [(session, summary, keywords)],
                                       self.query_encoder(encoder), self.dim)[0])
        return AddOp(conversation_id, session, summary, keywords, encoded, metadata)

    def _encode_new(self, conversation_id: str, sessions: list, texts: list, encoder: Any,
                    replace: bool = False) -> list:
        """The embeddings of the sessions the store does not hold yet, encoded outside
        the write lock (so that concurrent writers encode at once and share their log
        fsyncs); None for one the store holds (it is shared, not encoded again), or that
        the conversation has already (the write refuses it) unless ``replace``."""
        with self._write_lock:
            self._check_writable()
            st = self._tip
            self._store.track(st)
            seg = st.get(conversation_id)
            held = set(seg.meta.session_ids) if seg is not None else set()
            want = [not ((s.id in held and not replace)
                         or self._store.find(session_digest(s, u, k)) is not None)
                    for s, (u, k) in zip(sessions, texts)]
        if not any(want):
            return [None] * len(sessions)
        new = [(s, u, k) for s, (u, k), w in zip(sessions, texts, want) if w]
        encoded = iter(encode_sessions(self._store, new, self.query_encoder(encoder),
                                       self.dim))
        return [next(encoded) if w else None for w in want]

    def remove_session(self, conversation_id: str, session_id: str) -> None:
        """Forget one session of a conversation.

        The conversation's graphs are rebuilt (later sessions lose candidates and move up
        one position, so their edges change) and the session's rows are dropped, so the
        index equals a rebuild without the session: same graph edges, embeddings and BM25
        statistics.  A session shared with another conversation (LongMemEval haystacks)
        keeps its embeddings for the others.  Costs what this conversation costs.  Its
        data leaves memory and files at the next compaction (docs/failure.md).

        Raises:
            KeyError: unknown conversation or session id.
        """
        self._write(lambda st: [RemoveOp(conversation_id, session_id)])

    def forget_conversation(self, conversation_id: str) -> None:
        """Forget a conversation: every session of it, and the conversation itself (it
        is no longer listed; a search of it answers empty).  Costs what this conversation
        costs; its data leaves memory and files at the next compaction
        (docs/failure.md).

        Raises:
            KeyError: an unknown conversation id.
            ValueError: the dataset's evaluation questions ask about it (rebuild the
                index without the conversation instead).
        """
        self._write(lambda st: [ForgetOp(conversation_id)])

    def compact(self) -> int:
        """Drop the stored sessions no conversation uses any more (removed ones) now,
        instead of when they outnumber half the stored ones; returns how many were
        dropped.  Costs a copy of every live session's data.  On a memory opened on a
        folder, a full commit follows and the log is emptied, so that no file of the
        folder holds the removed sessions' texts or embeddings any more."""
        with self._write_lock:
            st = self._tip
            self._store.track(st)
            dropped = self._store.garbage
            if dropped:
                new, gone = self._compact(st)
                self._tip = new
                self._publish(new, gone)
        return dropped

    def _context(self) -> WriteContext:
        return WriteContext(self.params, self.dim, self._question_conversations,
                            self.graph_keys_of)

    def _write(self, change) -> None:
        """One write: ``change(tip)`` gives its operations (built under the write lock,
        on the state writes build on), applied all or none; then :meth:`_commit` makes
        it happen (in RAM: published at once)."""
        with self._write_lock:
            self._check_writable()
            st = self._tip
            self._store.track(st)
            ops = change(st)
            new, stale = apply_ops(self._store, st, ops, self._context())
            if new is st:
                return
            if self._store.wants_compaction():
                new, gone = self._compact(new)
                stale = [*stale, *gone]
            self._tip = new
            done = self._commit(ops, new, stale)
        if done is not None:
            done()

    def _check_writable(self) -> None:
        """Refuse a write before anything is done (a memory in RAM takes every write)."""

    def _commit(self, ops: list, state: State, stale: Sequence[int]):
        """Make a write happen, under the write lock (so in write order): a memory in RAM
        publishes ``state`` at once.  Returns what to run once the lock is released
        (None: nothing): a memory on a folder waits there for its log record's fsync,
        shared with other writers."""
        self._publish(state, stale)
        return None

    def _replay(self, ops: list) -> bool:
        """Apply a log record's operations again (recovery, a reader following the
        writer) and publish the state; False when it was there already."""
        with self._write_lock:
            st = self._tip
            new, stale = apply_ops(self._store, st, ops, self._context(), replay=True)
            if new is st:
                return False
            if self._store.wants_compaction():
                new, gone = self._compact(new)
                stale = [*stale, *gone]
            self._tip = new
            self._publish(new, stale)
            return True

    def _reset(self, other: "MemoryIndex") -> None:
        """Take ``other``'s store and state (a follower that read a newer commit) and
        publish them: readers see the old or the new memory."""
        with self._write_lock:
            old = (self._state.base, self._store.base)
            new = (other._state.base, other._store.base)
            for got in new:  # its conversations and store chunks resident in ours
                if got is not None:
                    got.resident = self._resident
            self._store, self._tip = other._store, other._state
            self._publish(other._state, ())
            self._cache.clear()  # every conversation has a new version
            for got in old:  # what we kept of the old commit
                if got is not None and got not in new:
                    self._resident.drop(got.id)

    def _compact(self, st: State) -> tuple[State, list]:
        """Copy the live slots into new buffers and renumber every segment (amortized:
        only when more than half the store is garbage)."""
        segments = list(zip(st.order(), st.iter_segments()))
        rows = [s.slots.to(torch.int64) for _, s in segments]
        # the live slots counted again over every conversation (not taken from the counts
        # a commit kept: a compaction drops what they call garbage)
        refs = torch.bincount(torch.cat(rows), minlength=self._store.n_slots) if rows \
            else torch.zeros(self._store.n_slots, dtype=torch.int64)
        store, remap = self._store.compacted(refs)
        self._store = store
        over, stale = {}, []
        for c, s in segments:
            over[c] = (st.ordinal(c), Segment(s.meta, remap[s.slots], s.graphs, days=s.days))
            stale.append(s.version)
        return State(over, store.tables(), n=st.n, next_ordinal=st.next_ordinal), stale

    def _publish(self, state: State, stale: Sequence[int]) -> None:
        self._state = state  # one reference swap: readers see the old or the new state
        self._cache.forget(stale)

    # ------------------------------------------------------------------ what it holds
    @property
    def version(self) -> int:
        """Changes with every write (a process-unique number)."""
        return self._state.version

    @property
    def conversations(self) -> list[ConversationMeta]:
        """Every conversation's id, session ids and dates, in order (a memory opened on a
        folder reads every conversation's segment: :meth:`conversation_ids` reads
        none)."""
        return [s.meta for s in self._state.segments]

    def conversation_ids(self) -> list:
        """Every conversation id, in order (from the folder's directory: no conversation
        is read)."""
        return list(self._state.order())

    @property
    def n_conversations(self) -> int:
        return self._state.n

    @property
    def n_rows(self) -> int:
        return self._state.n_rows()

    def drop_resident(self) -> None:
        """Drop every segment and store chunk read from the folder (each is read again
        when next needed); what was written since the memory was opened stays."""
        self._resident.clear()

    def residency(self) -> dict:
        """The segments read from a folder that the memory keeps: ``resident_bytes``,
        ``resident_segments``, ``max_resident_bytes``, ``segment_loads``, ``evictions``
        (zeros for a memory in RAM)."""
        return self._resident.stats()

    @property
    def dim(self) -> int:
        return self._state.tables.dim

    @property
    def build_params(self) -> BuildParams:
        """The write path's settings this index was built with (sources by name)."""
        return BuildParams.from_record((self.config or {}).get("build"))

    def sessions(self, conversation_id: str) -> list:
        """``[{"id", "date", "metadata"}]`` of a conversation's sessions, in order.

        Raises:
            KeyError: an unknown conversation id.
        """
        meta = self._state.segment(conversation_id).meta
        return [{"id": sid, "date": date, "metadata": meta.metadata(j)}
                for j, (sid, date) in enumerate(zip(meta.session_ids, meta.session_dates))]

    def get_session(self, conversation_id: str, session_id: str) -> dict:
        """One session as the memory holds it: ``{"id", "date", "metadata", "turns"}``
        (``turns``: its turn texts, ``[role]: content`` messages paired by newlines, or
        None when the index keeps no texts).

        Raises:
            KeyError: an unknown conversation or session id.
        """
        st = self._state
        seg = st.segment(conversation_id)
        if session_id not in seg.meta.session_ids:
            raise KeyError(f"conversation {conversation_id!r} has no session "
                           f"{session_id!r}")
        j = seg.meta.session_ids.index(session_id)
        t = st.tables
        slot = int(seg.slots[j])
        if t.lazy:
            t, slot = t.take(torch.tensor([slot])), 0
        turns = (t.turn_text.strings(range(int(t.turn_ptr[slot]), int(t.turn_ptr[slot + 1])))
                 if t.turn_text is not None else None)
        return {"id": session_id, "date": seg.meta.session_dates[j],
                "metadata": seg.meta.metadata(j), "turns": turns}

    def question_conversation_ids(self) -> list:
        """The conversation id of each dataset question."""
        return list(self._q_ids)

    @property
    def q_conv(self) -> Tensor:
        """``[n_questions]`` position of each dataset question's conversation."""
        ids = self._state.ids
        return torch.tensor([ids[c] for c in self._q_ids], dtype=torch.long)

    def conversation_index(self, conversation_id: str) -> int:
        return self._state.position(conversation_id)


class DurableMemory(Durable, MemoryIndex):
    """A memory kept in a folder (:meth:`MemoryIndex.open`): the same methods as
    :class:`MemoryIndex`, every write logged and synced before it returns, checkpoints,
    recovery, compaction that deletes, read-only followers (``refresh``); see
    :mod:`memgas_gpu.memory.durable`.  Thread-safe; one writer process per folder, any
    number of followers.  A copy (``copy.copy``, pickling for Ray) is a plain
    :class:`MemoryIndex` in RAM."""

    _plain = MemoryIndex


@dataclass(frozen=True)
class _Stored:
    """A conversation as a commit stores it (a canonical snapshot's renumbered slots)."""

    meta: ConversationMeta
    slots: Tensor
    days: Tensor
    graphs: dict
    version: Optional[int]

    @property
    def n(self) -> int:
        return int(self.slots.numel())


class _InOrder:
    """Every segment of a state in order, read one at a time when iterated (what a full
    commit of a memory opened on a folder writes), and their ordinals."""

    def __init__(self, state: State) -> None:
        self.state = state

    def __iter__(self):
        return self.state.iter_segments()

    def ordinals(self):
        st = self.state
        return _Ordinals(st)


class _Ordinals:
    def __init__(self, state: State) -> None:
        self.state = state

    def __iter__(self):
        return (self.state.ordinal(c) for c in self.state.order())


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
