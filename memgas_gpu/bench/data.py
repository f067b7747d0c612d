"""Synthetic inputs for the benchmarks: LongMemEval-shaped embeddings, term matrices, texts.

Stages other than encoding run on precomputed random embeddings shaped like a packed
:class:`~memgas_gpu.retrieve.MemoryIndex`: ``haystacks`` conversations of ``sessions``
sessions, four interleaved granularity nodes per session, unit vectors around a few
topics per haystack (so the association graph has structure, like real chat).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

__all__ = ["Haystacks", "make_haystacks", "make_queries", "make_terms", "synthetic_texts",
           "index_from_nodes"]

N_GRAN = 4


@dataclass
class Haystacks:
    """Packed nodes of ``C`` conversations (``N`` sessions each, 4 nodes per session).

    Attributes:
        node_emb: ``[C*N*4, d]`` float32 unit vectors.
        session_of_node: ``[n]`` global session id (``conv * N + i``).
        gran_of_node: ``[n]`` granularity 0..3.
        conv_of_node: ``[n]`` conversation id.
    """

    node_emb: Tensor
    session_of_node: Tensor
    gran_of_node: Tensor
    conv_of_node: Tensor
    n_conv: int
    n_sessions: int

    @property
    def n_nodes(self) -> int:
        return int(self.node_emb.shape[0])

    @property
    def dim(self) -> int:
        return int(self.node_emb.shape[1])

    def conversation(self, c: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(node_emb, local session, granularity)`` of conversation ``c``."""
        a, b = c * self.n_sessions * N_GRAN, (c + 1) * self.n_sessions * N_GRAN
        sess = torch.arange(self.n_sessions).repeat_interleave(N_GRAN)
        return self.node_emb[a:b], sess, self.gran_of_node[a:b]

    def to(self, device) -> "Haystacks":
        return Haystacks(self.node_emb.to(device), self.session_of_node.to(device),
                         self.gran_of_node.to(device), self.conv_of_node.to(device),
                         self.n_conv, self.n_sessions)


def make_haystacks(n_conv: int, n_sessions: int, dim: int = 384, n_topics: int = 6,
                   seed: int = 0, device=None) -> Haystacks:
    """Random LongMemEval-shaped node embeddings (see the module docstring).

    Each session has a topic (shared per haystack draw) and a session vector; its four
    granularity nodes are noisy copies, normalised. Generated on ``device`` in chunks of
    conversations so large shapes (500 x 500 x 768) need no host copy.
    """
    dev = torch.device(device or "cpu")
    g = torch.Generator(device="cpu").manual_seed(seed)
    topics = torch.randn(n_topics, dim, generator=g).to(dev)
    per = n_sessions * N_GRAN
    out = torch.empty(n_conv * per, dim, dtype=torch.float32, device=dev)
    step = max(1, (1 << 24) // max(1, per * dim))
    for c0 in range(0, n_conv, step):
        c1 = min(n_conv, c0 + step)
        k = (c1 - c0) * n_sessions
        t = torch.randint(0, n_topics, (k,), generator=g).to(dev)
        sess = topics[t] + 0.8 * torch.randn(k, dim, generator=g).to(dev)
        nodes = sess.repeat_interleave(N_GRAN, 0) + 0.7 * torch.randn(k * N_GRAN, dim,
                                                                      generator=g).to(dev)
        out[c0 * per:c1 * per] = nodes / nodes.norm(dim=1, keepdim=True)
    n = n_conv * per
    sess_of = torch.arange(n, device=dev) // N_GRAN
    gran = torch.arange(N_GRAN, device=dev).repeat(n_conv * n_sessions)
    conv = sess_of // n_sessions
    return Haystacks(out, sess_of, gran, conv, n_conv, n_sessions)


def make_queries(h: Haystacks, per_conv: int = 1, noise: float = 0.1,
                 seed: int = 1) -> tuple[Tensor, Tensor]:
    """``per_conv`` queries per conversation, each near a random node of it.

    Returns:
        ``(query_emb [C*per_conv, d], query_conversation [C*per_conv])`` on ``h``'s device.
    """
    dev = h.node_emb.device
    g = torch.Generator(device="cpu").manual_seed(seed)
    conv = torch.arange(h.n_conv).repeat_interleave(per_conv)
    per = h.n_sessions * N_GRAN
    node = conv * per + torch.randint(0, per, (conv.numel(),), generator=g)
    q = h.node_emb[node.to(dev)] + noise * torch.randn(conv.numel(), h.dim, generator=g).to(dev)
    return q / q.norm(dim=1, keepdim=True), conv.to(dev)


@dataclass
class Terms:
    """CSR term counts of documents (sessions) and queries, grouped by haystack."""

    doc_indptr: Tensor
    doc_indices: Tensor
    doc_tf: Tensor
    doc_group: Tensor
    q_indptr: Tensor
    q_indices: Tensor
    q_tf: Tensor
    q_group: Tensor
    n_terms: int

    def to(self, device) -> "Terms":
        return Terms(*(getattr(self, f).to(device) for f in (
            "doc_indptr", "doc_indices", "doc_tf", "doc_group", "q_indptr", "q_indices",
            "q_tf", "q_group")), self.n_terms)


def _csr(rows: list[np.ndarray]) -> tuple[Tensor, Tensor, Tensor]:
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    idx, tf = [], []
    for i, r in enumerate(rows):
        u, c = np.unique(r, return_counts=True)
        idx.append(u)
        tf.append(c)
        indptr[i + 1] = indptr[i] + len(u)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64))
    return (torch.from_numpy(indptr), torch.from_numpy(cat(idx).astype(np.int64)),
            torch.from_numpy(cat(tf).astype(np.float32)))


def make_terms(n_conv: int, n_sessions: int, doc_len: int = 200, q_len: int = 8,
               n_terms: int = 30000, per_conv: int = 1, seed: int = 0) -> Terms:
    """Zipf-distributed term ids: one document per session, ``per_conv`` queries per haystack.

    Query terms are drawn from a random document of their haystack (half) and from the
    vocabulary (half), so queries hit their haystack's documents like real questions.
    """
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_terms + 1) ** 1.07
    p /= p.sum()
    docs = rng.choice(n_terms, size=(n_conv * n_sessions, doc_len), p=p)
    di, dx, dt = _csr(list(docs))
    queries = []
    for c in range(n_conv):
        for _ in range(per_conv):
            src = docs[c * n_sessions + rng.integers(n_sessions)]
            queries.append(np.concatenate([rng.choice(src, q_len // 2),
                                           rng.choice(n_terms, q_len - q_len // 2, p=p)]))
    qi, qx, qt = _csr(queries)
    return Terms(di, dx, dt, torch.arange(n_conv).repeat_interleave(n_sessions), qi, qx, qt,
                 torch.arange(n_conv).repeat_interleave(per_conv), n_terms)


def synthetic_texts(n: int, turns: int = 6, words: int = 40, seed: int = 0,
                    path: Optional[str] = None) -> list[str]:
    """``n`` encoder inputs in a dataset's own order: each session's text, then its turns.

    The texts come from :func:`memgas_gpu.synth.write_synthetic` (chat-like sentences),
    loaded with :func:`memgas_gpu.data.load_dataset` (messages merged in pairs into turns).
    """
    import tempfile

    from ..data import load_dataset
    from ..synth import write_synthetic

    sessions = max(3, n // (1 + turns // 2) + 1)
    with tempfile.TemporaryDirectory() as tmp:
        f = path or f"{tmp}/texts.json"
        write_synthetic(f, questions=1, sessions=sessions, turns=turns, words=words,
                        seed=seed, progress=False)
        ds = load_dataset(f, progress=False)
    out: list[str] = []
    for s in ds[0].sessions:
        out.append(s.text)
        out.extend(s.turns)
    return out[:n]


def index_from_nodes(node_emb: Tensor, sessions_per_conversation, graph=None, params=None):
    """A bare :class:`~memgas_gpu.retrieve.MemoryIndex` over precomputed node embeddings
    (the benchmarks' haystacks: no texts, no lexical data).

    Args:
        node_emb: ``[n_rows * N_GRAN, d]`` interleaved node embeddings (node
            ``N_GRAN*row + g``), conversations one after the other.
        sessions_per_conversation: session count of each conversation.
        graph: optional ``(indptr, indices)`` association graph (else built on use); its
            tensors (and device) serve the whole index's view as given.
        params: the graph's settings (default ``GraphParams()``).
    """
    from ..retrieve import MemoryIndex
    from ..memory.meta import ConversationMeta, GraphParams

    sizes = torch.as_tensor(list(sessions_per_conversation), dtype=torch.long)
    n_rows = int(sizes.sum())
    d = node_emb.shape[-1]
    p = params or GraphParams()
    metas = [ConversationMeta(str(c), [str(i) for i in range(int(k))], [""] * int(k))
             for c, k in enumerate(sizes.tolist())]
    return MemoryIndex(conversations=metas, questions=[],
                       conv_offsets=torch.cat([torch.zeros(1, dtype=torch.long),
                                               sizes.cumsum(0)]),
                       row_slot=torch.arange(n_rows),  # metadata stays on the CPU
                       gran=node_emb.reshape(n_rows, N_GRAN, d), concat=None,
                       q_emb=node_emb.new_zeros(0, d),
                       q_conv=torch.zeros(0, dtype=torch.long),
                       graphs={p.key(): graph} if graph is not None else {}, params=p,
                       config={})
