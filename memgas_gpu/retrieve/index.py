"""``MemoryIndex``: every conversation of a dataset packed in tensors, ready to query.

Layout (all CPU tensors; moved to the query device on demand):

* ``rows``: every (conversation, session) pair, conversation by conversation
  (``conv_offsets[c]:conv_offsets[c+1]`` are conversation ``c``'s sessions, in order);
* ``table``: embeddings per *distinct* session (``row_slot[row]`` points into it), so
  sessions shared between LongMemEval haystacks are stored and encoded once;
* graph nodes: ``N_GRAN`` per row, interleaved ``N_GRAN*row + g`` with g in (S, T, U, K)
  (:mod:`memgas_gpu.granularity`), the association graph as one block-diagonal
  symmetric CSR over all conversations;
* questions: embeddings ``q_emb`` and their conversation ``q_conv``;
* turns (optional): every turn's embedding and text of the distinct sessions.

docs/architecture.md follows a dataset file to a ranking through these modules.
"""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from .. import ops
from ..data.model import Dataset, Question, Session
from ..errors import MemgasError
from ..expand.granularity import expand_dataset
from ..granularity import N_GRAN
from .embed import embed_sessions, encode_unique
from .graphs import build_graph, edges_of, graph_chunk
from .meta import ConversationMeta, GraphParams
from .texts import TextTable

__all__ = ["MemoryIndex", "GraphParams", "EncoderMismatchError"]


class EncoderMismatchError(MemgasError, ValueError):
    """A query encoder that differs from the one the index was built with."""


class MemoryIndex:
    """Packed multi-granularity memory of many conversations.

    Build with :meth:`build`, query with :meth:`retrieve`, persist with
    :meth:`save` / :meth:`load`, grow with :meth:`add_session`.
    """

    def __init__(self, *, conversations: list[ConversationMeta], questions: list[Question],
                 conv_offsets: Tensor, row_slot: Tensor, gran: Tensor,
                 concat: Optional[Tensor], q_emb: Tensor, q_conv: Tensor,
                 graphs: dict[str, tuple[Tensor, Tensor]], params: GraphParams,
                 config: dict, lexical: Any = None, turns: Optional[Tensor] = None,
                 turn_ptr: Optional[Tensor] = None,
                 turn_text: Optional[TextTable] = None) -> None:
        self.conversations = conversations
        self.questions = questions
        self.conv_offsets = conv_offsets
        self.row_slot = row_slot
        self.gran = gran
        #: ``[n_distinct, d]`` embedding of ``"{summary} {keywords} {session}"`` (the
        #: ``concat`` baseline; the reference calls it "hybrid"), or None
        self.concat = concat
        self.q_emb = q_emb
        self.q_conv = q_conv
        self.graphs = graphs
        self.params = params
        self.config = config
        #: tokenised texts for the BM25 signals (:class:`memgas_gpu.lexical.LexicalIndex`)
        self.lexical = lexical
        #: optional per-turn embeddings of the distinct sessions (``dense_Tmax`` signal):
        #: session slot ``j`` owns ``turns[turn_ptr[j]:turn_ptr[j+1]]``
        self.turns = turns
        self.turn_ptr = turn_ptr
        #: optional turn texts, aligned with ``turn_ptr`` (evidence shown by ``search``)
        self.turn_text = turn_text
        #: incremented by every add_session / remove_session (keys derived caches)
        self.version = 0
        #: the folder and version this index was loaded from or last saved to
        #: (:class:`~memgas_gpu.retrieve.persist.FolderVersion`), else None; a save into
        #: that folder after another writer's is refused (docs/failure.md)
        self.folder_version = None
        self._encoder = None

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, dataset: Dataset, encoder: Any = None, *, summaries="offline",
              keywords="offline", store: Any = None, m: int = 30, skip_sessions: int = 5,
              concat: bool = True, device: Optional[str] = None,
              progress: Optional[bool] = None, lexical: bool = True,
              tokenizer: Any = None, graph_mapper=None,
              keep_turns: bool = True, keep_text: bool = True) -> "MemoryIndex":
        """Expand, encode and link every conversation of ``dataset``.

        Args:
            dataset: a loaded :class:`~memgas_gpu.Dataset`.
            encoder: an :class:`~memgas_gpu.encode.Encoder` (default: the bundled
                all-MiniLM-L6-v2 on ``device``).
            summaries, keywords: sources (see :func:`~memgas_gpu.expand.expand_dataset`).
            store: optional :class:`~memgas_gpu.encode.EmbeddingStore` (resumable
                on-disk embeddings shared across runs).
            m: candidates per node for the GMM test (default 30).
            skip_sessions: the first sessions of a conversation get no outgoing edges
                (default 5).
            concat: also embed ``"{summary} {keywords} {session}"`` (the reference's
                "hybrid" text, for ``method="concat"``).
            device: where to build the graph (``None``: CUDA if available).
            progress: progress of each stage (:mod:`memgas_gpu.progress`: a bar on
                a terminal, plain lines in a log); False: none.
            graph_mapper: how graph chunks run (see :func:`build_graph`; the Ray
                backend passes parallel tasks).
            lexical: also tokenise S, T, U, K and the questions for the BM25 signals
                (``method="memgas_hybrid"``, ``"bm25"``); needs PyStemmer for stemming.
            tokenizer: a :class:`memgas_gpu.lexical.Tokenizer` (default: lowercase,
                Lucene English stopwords, Snowball English stemming).
            keep_turns: keep every turn's embedding (for the ``dense_Tmax`` signal of
                ``memgas_hybrid``; already computed for T, costs memory only).
            keep_text: keep every turn's text (the evidence :meth:`search` returns).
        """
        if encoder is None:
            from ..encode import Encoder

            encoder = Encoder(device=device)
        timings = {}
        t0 = time.perf_counter()
        exp = expand_dataset(dataset, summaries=summaries, keywords=keywords,
                             progress=progress)
        timings["expand_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        table, enc_stats = embed_sessions(dataset, exp, encoder, store=store, concat=concat,
                                          progress=progress)
        questions = [q for c in dataset for q in c.questions]
        q_emb, q_stats = encode_unique(encoder, [q.text for q in questions], store=store,
                                       progress=progress)
        timings["encode_s"] = time.perf_counter() - t0
        lex = None
        if lexical:
            from ..lexical import build_lexical

            t0 = time.perf_counter()
            lex = build_lexical(dataset, exp, table.sessions, [q.text for q in questions],
                                tokenizer)
            timings["lexical_s"] = time.perf_counter() - t0
        slot = {s.key: i for i, s in enumerate(table.sessions)}
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
        }
        idx = cls(conversations=metas, questions=questions, conv_offsets=conv_offsets,
                  row_slot=row_slot, gran=table.gran, concat=table.concat,
                  q_emb=q_emb if len(questions) else torch.zeros(0, table.gran.shape[-1]),
                  q_conv=q_conv, graphs={},
                  params=GraphParams(m=m, skip_sessions=skip_sessions), config=config,
                  lexical=lex, turns=table.turns if keep_turns else None,
                  turn_ptr=table.turn_ptr,
                  turn_text=TextTable.from_strings(t for x in table.sessions for t in x.turns)
                  if keep_text else None)
        if lex is not None:
            idx.config["lexical"] = lex.describe()
        idx._encoder = encoder
        t0 = time.perf_counter()
        idx.graphs[idx.params.key()] = build_graph(idx, idx.params, device=device,
                                                   progress=progress, mapper=graph_mapper)
        timings["graph_s"] = time.perf_counter() - t0
        idx.config["timings"] = timings
        return idx

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
        return cls(conversations=metas, questions=[],
                   conv_offsets=torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)]),
                   row_slot=torch.arange(n_rows),  # metadata stays on the CPU
                   gran=node_emb.reshape(n_rows, N_GRAN, d), concat=None,
                   q_emb=node_emb.new_zeros(0, d), q_conv=torch.zeros(0, dtype=torch.long),
                   graphs={} if graph is None else {p.key(): graph}, params=p, config={})

    # ------------------------------------------------------------------ API
    def retrieve(self, questions=None, method: str = "memgas", **kwargs):
        """Rank sessions for the index's own questions; see
        :func:`memgas_gpu.retrieve.retrieve`."""
        from .search import retrieve

        return retrieve(self, questions, method=method, **kwargs)

    def search(self, conversation_id, queries: Sequence[str], k: int = 10,
               method: str = "memgas_hybrid", **kwargs) -> list:
        """Rank a conversation's sessions for new query texts (encoded with the index's
        own encoder); one :class:`~memgas_gpu.retrieve.SearchResult` per query with
        session ids, scores and the best-matching turns.  See
        :func:`memgas_gpu.retrieve.search`."""
        from .search import search

        return search(self, conversation_id, queries, k=k, method=method, **kwargs)

    def save(self, path, dtype: torch.dtype = torch.float32, **options):
        """Write the index folder (see ``docs/index-format.md``; ``options``: ``force``,
        ``lock_timeout`` of :func:`~memgas_gpu.retrieve.persist.save_index`)."""
        from .persist import save_index

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

    def add_session(self, conversation_id: str, session: Session, *,
                    summary: Optional[str] = None, keywords: Optional[str] = None,
                    encoder: Any = None) -> None:
        """Append ``session`` to a conversation and link it (incremental write path).

        Only the new session's nodes get edges (to earlier sessions), so every stored
        graph ends up identical to a full rebuild with the same texts.

        Args:
            conversation_id: the conversation to grow.
            session: the new, latest session.
            summary, keywords: its U and K texts.  ``None``: the offline extractor on
                this session alone (corpus statistics of one session; pass the texts
                to reproduce another source exactly).
            encoder: the encoder the index was built with (default: the one used by
                :meth:`build` in this process); its fingerprint must match.
        """
        from ..expand.offline import OfflineExtractor

        ci = self.conversation_index(conversation_id)
        if session.id in self.conversations[ci].session_ids:
            raise ValueError(f"conversation {conversation_id!r} already has a session "
                             f"{session.id!r}")
        enc = self.query_encoder(encoder)
        if summary is None or keywords is None:
            u, k = OfflineExtractor().expand([session.text])
            summary = u[0] if summary is None else summary
            keywords = k[0] if keywords is None else keywords
        texts = [session.text, *session.turns, summary, keywords]
        if self.concat is not None:
            texts.append(f"{summary} {keywords} {session.text}")
        emb, _ = encode_unique(enc, texts, progress=False)
        nt = len(session.turns)
        t = emb[1:1 + nt].mean(0) if nt else torch.zeros(self.dim)
        if self.turns is not None:
            self.turns = torch.cat([self.turns, emb[1:1 + nt].to(self.turns.dtype)])
        if self.turn_ptr is not None:
            self.turn_ptr = torch.cat([self.turn_ptr, self.turn_ptr[-1:] + nt])
        if self.turn_text is not None:
            self.turn_text = self.turn_text.append(session.turns)
        row = torch.stack([emb[0], t, emb[1 + nt], emb[2 + nt]]).to(self.gran.dtype)
        slot = self.gran.shape[0]
        self.gran = torch.cat([self.gran, row.unsqueeze(0)])
        if self.concat is not None:
            self.concat = torch.cat([self.concat, emb[3 + nt:4 + nt].to(self.concat.dtype)])
        if self.lexical is not None:
            self.lexical.append_session(session, summary, keywords)
            # question terms first seen in this session must now match it
            self.lexical.set_queries([q.text for q in self.questions])
        r = int(self.conv_offsets[ci + 1])  # the new row, at the end of conversation ci
        self.row_slot = torch.cat([self.row_slot[:r], torch.tensor([slot]), self.row_slot[r:]])
        self.conv_offsets = self.conv_offsets.clone()
        self.conv_offsets[ci + 1:] += 1
        meta = self.conversations[ci]
        meta.session_ids.append(session.id)
        meta.session_dates.append(session.date)
        for key in list(self.graphs):
            self.graphs[key] = self._grow_graph(self.graphs[key], ci, r, key)
        self.version += 1

    def _grow_graph(self, graph, ci: int, r: int, key: str):
        """``graph`` with row ``r`` (the new last session of conversation ``ci``) linked:
        only its nodes get new edges, as in a rebuild."""
        a, b = int(self.conv_offsets[ci]), int(self.conv_offsets[ci + 1])
        old = edges_of(graph)
        old = torch.where(old >= r * N_GRAN, old + N_GRAN, old)  # later conversations shift
        emb = self.node_embeddings(torch.arange(a, b))
        sess = torch.arange(b - a).repeat_interleave(N_GRAN)
        p = GraphParams.from_key(key, self.params)
        gmm = p.rule == "gmm"
        new = ops.association_edges(emb, sess, m=p.m if gmm else p.topk,
                                    skip_sessions=p.skip_sessions,
                                    accept="gmm" if gmm else "all",
                                    first_node=(b - a - 1) * N_GRAN)
        return ops.symmetric_csr(torch.cat([old, new + a * N_GRAN], dim=1),
                                 self.n_rows * N_GRAN)

    def remove_session(self, conversation_id: str, session_id: str) -> None:
        """Forget one session of a conversation.

        The conversation's graph block is rebuilt (later sessions lose candidates and
        move up one position, so their edges change) and every tensor, the lexical
        documents and the turn texts lose the session's entries, so the index equals a
        rebuild without the session: same graph edges, embeddings and BM25 statistics.
        A session shared with another conversation (LongMemEval haystacks) keeps its
        embeddings for the others.

        Raises:
            KeyError: unknown conversation or session id.
        """
        ci = self.conversation_index(conversation_id)
        meta = self.conversations[ci]
        if session_id not in meta.session_ids:
            raise KeyError(f"conversation {conversation_id!r} has no session {session_id!r}")
        j = meta.session_ids.index(session_id)
        a = int(self.conv_offsets[ci])
        r = a + j
        slot = int(self.row_slot[r])
        self.row_slot = torch.cat([self.row_slot[:r], self.row_slot[r + 1:]])
        self.conv_offsets = self.conv_offsets.clone()
        self.conv_offsets[ci + 1:] -= 1
        del meta.session_ids[j]
        del meta.session_dates[j]
        if not bool((self.row_slot == slot).any()):
            self._drop_slot(slot)
        b = int(self.conv_offsets[ci + 1])
        for key in list(self.graphs):
            old = edges_of(self.graphs[key])
            lo, hi = a * N_GRAN, (b + 1) * N_GRAN  # the block before removal
            keep = ((old[0] < lo) | (old[0] >= hi)) & ((old[1] < lo) | (old[1] >= hi))
            old = old[:, keep]
            old = torch.where(old >= hi, old - N_GRAN, old)
            ip, ix = graph_chunk(self.node_embeddings(torch.arange(a, b)), [b - a],
                                 GraphParams.from_key(key, self.params), "cpu")
            block = edges_of((ip, ix)) + a * N_GRAN
            self.graphs[key] = ops.symmetric_csr(torch.cat([old, block], 1),
                                                 self.n_rows * N_GRAN)
        if self.lexical is not None:
            self.lexical.invalidate()
        self.version += 1

    def _drop_slot(self, slot: int) -> None:
        """Remove distinct session ``slot`` (no row uses it) from every table."""
        keep = torch.arange(self.gran.shape[0]) != slot
        self.gran = self.gran[keep]
        if self.concat is not None:
            self.concat = self.concat[keep]
        if self.turn_ptr is not None:
            t0, t1 = int(self.turn_ptr[slot]), int(self.turn_ptr[slot + 1])
            if self.turns is not None:
                self.turns = torch.cat([self.turns[:t0], self.turns[t1:]])
            if self.turn_text is not None:
                self.turn_text = self.turn_text.drop(t0, t1)
            self.turn_ptr = torch.cat([self.turn_ptr[:slot + 1],
                                       self.turn_ptr[slot + 2:] - (t1 - t0)])
        if self.lexical is not None:
            self.lexical.remove_slot(slot)
        self.row_slot = torch.where(self.row_slot > slot, self.row_slot - 1, self.row_slot)

    def best_turns(self, query_emb: Tensor, rows: Tensor, n: int = 3) -> list:
        """For each session row, its ``n`` turns most similar to ``query_emb``:
        ``[(turn index, text or None, <query, turn>)]``, best first (empty when the
        index keeps no turn embeddings)."""
        if self.turns is None or self.turn_ptr is None:
            return [[] for _ in range(len(rows))]
        out = []
        for r in rows.tolist():
            slot = int(self.row_slot[r])
            t0, t1 = int(self.turn_ptr[slot]), int(self.turn_ptr[slot + 1])
            sims = (self.turns[t0:t1].float() @ query_emb.float()).tolist()
            top = sorted(range(t1 - t0), key=lambda i: -sims[i])[:n]
            out.append([(i, self.turn_text[t0 + i] if self.turn_text is not None else None,
                         sims[i]) for i in top])
        return out

    # ------------------------------------------------------------------ shapes
    @property
    def n_conversations(self) -> int:
        return len(self.conversations)

    @property
    def n_rows(self) -> int:
        return int(self.row_slot.numel())

    @property
    def dim(self) -> int:
        return int(self.gran.shape[-1])

    def conversation_index(self, conversation_id: str) -> int:
        for i, c in enumerate(self.conversations):
            if c.id == conversation_id:
                return i
        raise KeyError(f"no conversation {conversation_id!r} in this index")

    def node_embeddings(self, rows: Optional[Tensor] = None) -> Tensor:
        """``[n_rows*N_GRAN, d]`` interleaved node embeddings (node ``N_GRAN*row + g``)."""
        slots = self.row_slot if rows is None else self.row_slot[rows]
        return self.gran[slots].reshape(-1, self.dim)

    # ------------------------------------------------------------------ graph
    def graph(self, params: Optional[GraphParams] = None, device: Optional[str] = None
              ) -> tuple[Tensor, Tensor]:
        """The association graph (CSR ``indptr, indices``), built once per setting."""
        params = params or self.params
        key = params.key()
        if key not in self.graphs:
            self.graphs[key] = build_graph(self, params, device=device)
        return self.graphs[key]


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
