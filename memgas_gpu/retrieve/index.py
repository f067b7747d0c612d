"""``MemoryIndex``: every conversation of a dataset packed in tensors, ready to query.

Layout (all CPU tensors; moved to the query device on demand):

* ``rows``: every (conversation, session) pair, conversation by conversation
  (``conv_offsets[c]:conv_offsets[c+1]`` are conversation ``c``'s sessions, in order);
* ``table``: embeddings per *distinct* session (``row_slot[row]`` points into it), so
  sessions shared between LongMemEval haystacks are stored and encoded once;
* graph nodes: four per row, interleaved ``4*row + g`` with g in (S, T, U, K), the
  association graph as one block-diagonal symmetric CSR over all conversations;
* questions: embeddings ``q_emb`` and their conversation ``q_conv``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from ..data.model import Dataset, Question, Session
from ..expand.granularity import expand_dataset
from .. import ops
from ..progress import Progress
from .embed import embed_sessions, encode_unique

__all__ = ["MemoryIndex", "GraphParams"]

N_GRAN = 4


@dataclass
class GraphParams:
    """Association-graph settings (DESIGN.md "Write path")."""

    m: int = 30
    skip_sessions: int = 5
    rule: str = "gmm"  # "gmm" (MemGAS) or "topk" (the no_gmm ablation)
    topk: int = 5

    def key(self) -> str:
        return "gmm" if self.rule == "gmm" else f"topk{self.topk}"


@dataclass
class ConversationMeta:
    id: str
    session_ids: list[str]
    session_dates: list[str]


class MemoryIndex:
    """Packed multi-granularity memory of many conversations.

    Build with :meth:`build`, query with :meth:`retrieve`, persist with
    :meth:`save` / :meth:`load`, grow with :meth:`add_session`.
    """

    def __init__(self, *, conversations: list[ConversationMeta], questions: list[Question],
                 conv_offsets: Tensor, row_slot: Tensor, gran: Tensor,
                 hybrid: Optional[Tensor], q_emb: Tensor, q_conv: Tensor,
                 graphs: dict[str, tuple[Tensor, Tensor]], params: GraphParams,
                 config: dict, lexical: Any = None, turns: Optional[Tensor] = None,
                 turn_ptr: Optional[Tensor] = None) -> None:
        self.conversations = conversations
        self.questions = questions
        self.conv_offsets = conv_offsets
        self.row_slot = row_slot
        self.gran = gran
        self.hybrid = hybrid
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
        self._encoder = None

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, dataset: Dataset, encoder: Any = None, *, summaries="offline",
              keywords="offline", store: Any = None, m: int = 30, skip_sessions: int = 5,
              hybrid: bool = True, device: Optional[str] = None,
              progress: Optional[bool] = None, lexical: bool = True,
              tokenizer: Any = None, graph_mapper=None,
              keep_turns: bool = True) -> "MemoryIndex":
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
            hybrid: also embed the reference's hybrid text (for ``method="hybrid"``).
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
        table, enc_stats = embed_sessions(dataset, exp, encoder, store=store, hybrid=hybrid,
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
            "expansion": exp.config,
            "dataset": {"format": dataset.format, "source": dataset.source},
            "encoding": {"sessions_and_texts": enc_stats, "questions": q_stats},
        }
        idx = cls(conversations=metas, questions=questions, conv_offsets=conv_offsets,
                  row_slot=row_slot, gran=table.gran, hybrid=table.hybrid,
                  q_emb=q_emb if len(questions) else torch.zeros(0, table.gran.shape[-1]),
                  q_conv=q_conv, graphs={},
                  params=GraphParams(m=m, skip_sessions=skip_sessions), config=config,
                  lexical=lex, turns=table.turns if keep_turns else None,
                  turn_ptr=table.turn_ptr if keep_turns else None)
        if lex is not None:
            idx.config["lexical"] = lex.describe()
        idx._encoder = encoder
        t0 = time.perf_counter()
        idx.graphs[idx.params.key()] = build_graph(idx, idx.params, device=device,
                                                   progress=progress, mapper=graph_mapper)
        timings["graph_s"] = time.perf_counter() - t0
        idx.config["timings"] = timings
        return idx

    # ------------------------------------------------------------------ API
    def retrieve(self, questions=None, method: str = "memgas", **kwargs):
        """Rank sessions for questions; see :func:`memgas_gpu.retrieve.retrieve`."""
        from .search import retrieve

        return retrieve(self, questions, method=method, **kwargs)

    def save(self, path, dtype: torch.dtype = torch.float32):
        """Write the index folder (see ``docs/index-format.md``)."""
        from .persist import save_index

        return save_index(self, path, dtype=dtype)

    @classmethod
    def load(cls, path) -> "MemoryIndex":
        """Read an index folder written by :meth:`save`."""
        from .persist import load_index

        return load_index(path)

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
        enc = encoder or self._encoder
        if enc is None:
            raise ValueError("add_session needs the index's encoder: pass encoder=Encoder(...)")
        want = self.config.get("encoder_fingerprint")
        got = getattr(enc, "fingerprint", None)
        if want and got and want != got:
            raise ValueError(f"encoder fingerprint {got} differs from the index's {want}")
        if summary is None or keywords is None:
            u, k = OfflineExtractor().expand([session.text])
            summary = u[0] if summary is None else summary
            keywords = k[0] if keywords is None else keywords
        texts = [session.text, *session.turns, summary, keywords]
        if self.hybrid is not None:
            texts.append(f"{summary} {keywords} {session.text}")
        emb, _ = encode_unique(enc, texts, progress=False)
        nt = len(session.turns)
        t = emb[1:1 + nt].mean(0) if nt else torch.zeros(self.dim)
        if self.turns is not None:
            self.turns = torch.cat([self.turns, emb[1:1 + nt].to(self.turns.dtype)])
            self.turn_ptr = torch.cat([self.turn_ptr, self.turn_ptr[-1:] + nt])
        row = torch.stack([emb[0], t, emb[1 + nt], emb[2 + nt]]).to(self.gran.dtype)
        slot = self.gran.shape[0]
        self.gran = torch.cat([self.gran, row.unsqueeze(0)])
        if self.hybrid is not None:
            self.hybrid = torch.cat([self.hybrid, emb[3 + nt:4 + nt].to(self.hybrid.dtype)])
        if self.lexical is not None:
            self.lexical.append_session(session, summary, keywords,
                                        [q.text for q in self.questions])
        r = int(self.conv_offsets[ci + 1])  # the new row, at the end of conversation ci
        self.row_slot = torch.cat([self.row_slot[:r], torch.tensor([slot]), self.row_slot[r:]])
        self.conv_offsets = self.conv_offsets.clone()
        self.conv_offsets[ci + 1:] += 1
        meta = self.conversations[ci]
        meta.session_ids.append(session.id)
        meta.session_dates.append(session.date)
        for key in list(self.graphs):
            self.graphs[key] = self._grow_graph(self.graphs[key], ci, r, key)

    def _grow_graph(self, graph, ci: int, r: int, key: str):
        indptr, indices = graph
        n_new = self.n_rows * N_GRAN
        src = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
        cut = r * N_GRAN
        old = torch.stack([src, indices])
        old = torch.where(old >= cut, old + N_GRAN, old)  # later conversations shift
        a, b = int(self.conv_offsets[ci]), int(self.conv_offsets[ci + 1])
        emb = self.node_embeddings(torch.arange(a, b))
        sess = torch.arange(b - a).repeat_interleave(N_GRAN)
        p = self.params
        rule_all = key != "gmm"
        m = int(key[4:]) if rule_all else p.m
        new = ops.association_edges(emb, sess, m=m, skip_sessions=p.skip_sessions,
                                    accept="all" if rule_all else "gmm",
                                    first_node=(b - a - 1) * N_GRAN)
        return ops.symmetric_csr(torch.cat([old, new + a * N_GRAN], dim=1), n_new)

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
        """``[n_rows*4, d]`` interleaved node embeddings (node ``4*row + g``)."""
        slots = self.row_slot if rows is None else self.row_slot[rows]
        return self.gran[slots].reshape(-1, self.dim)

    def node_layout(self) -> tuple[Tensor, Tensor]:
        """``(session_of_node, conversation_of_node)`` over all nodes."""
        sizes = self.conv_offsets[1:] - self.conv_offsets[:-1]
        conv_of_row = torch.repeat_interleave(torch.arange(self.n_conversations), sizes)
        rows = torch.arange(self.n_rows)
        return rows.repeat_interleave(N_GRAN), conv_of_row.repeat_interleave(N_GRAN)

    # ------------------------------------------------------------------ graph
    def graph(self, params: Optional[GraphParams] = None, device: Optional[str] = None
              ) -> tuple[Tensor, Tensor]:
        """The association graph (CSR ``indptr, indices``), built once per setting."""
        params = params or self.params
        key = params.key()
        if key not in self.graphs:
            self.graphs[key] = build_graph(self, params, device=device)
        return self.graphs[key]


def _graph_chunk(node_emb: Tensor, sizes: list[int], params: GraphParams,
                 device: str) -> tuple[Tensor, Tensor]:
    """Association graph of consecutive whole conversations (``sizes`` sessions each)."""
    dev = torch.device(device)
    node_emb = node_emb.to(dev)
    conv_of_row = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    sess = torch.arange(int(sum(sizes))).repeat_interleave(N_GRAN).to(dev)
    conv = conv_of_row.repeat_interleave(N_GRAN).to(dev)
    if params.rule not in ("gmm", "topk"):
        raise ValueError(f"unknown graph rule {params.rule!r} (use 'gmm' or 'topk')")
    gmm = params.rule == "gmm"
    ip, ix = ops.build_association_graph(node_emb, sess, m=params.m if gmm else params.topk,
                                         skip_sessions=params.skip_sessions,
                                         conversation_of_node=conv,
                                         accept="gmm" if gmm else "all")
    return ip.cpu(), ix.cpu()


def _serial_map(fn, arg_lists):
    return (fn(*args) for args in arg_lists)


def build_graph(index: MemoryIndex, params: GraphParams, device: Optional[str] = None,
                max_nodes_per_chunk: int = 1 << 17, progress: Optional[bool] = None,
                mapper=None) -> tuple[Tensor, Tensor]:
    """Block-diagonal association graph of all conversations.

    Conversations are grouped into chunks of whole conversations (at most
    ``max_nodes_per_chunk`` nodes unless one conversation is larger) so memory stays
    bounded at LongMemEval-M scale; each chunk is independent, and ``mapper(fn,
    arg_lists)`` (default: in order, in this process; the Ray backend passes parallel
    tasks) must yield their results in order.
    """
    dev = str(torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    offs = index.conv_offsets.tolist()
    chunks = []
    c = 0
    while c < index.n_conversations:
        c_end = c + 1
        while (c_end < index.n_conversations
               and (offs[c_end + 1] - offs[c]) * N_GRAN <= max_nodes_per_chunk):
            c_end += 1
        chunks.append((c, c_end))
        c = c_end
    args = ((index.node_embeddings(torch.arange(offs[a], offs[b])),
             [offs[i + 1] - offs[i] for i in range(a, b)], params, dev) for a, b in chunks)
    bar = Progress(index.n_rows, f"graph ({params.key()})", unit="session", enabled=progress)
    indptr_parts, index_parts = [torch.zeros(1, dtype=torch.long)], []
    nnz = 0
    for (a, b), (ip, ix) in zip(chunks, (mapper or _serial_map)(_graph_chunk, args)):
        indptr_parts.append(ip[1:] + nnz)
        index_parts.append(ix + offs[a] * N_GRAN)
        nnz += int(ix.numel())
        bar.update(offs[b] - offs[a])
    bar.close()
    indptr = torch.cat(indptr_parts)
    indices = torch.cat(index_parts) if index_parts else torch.zeros(0, dtype=torch.long)
    return indptr, indices
