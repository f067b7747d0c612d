"""Term-count matrices (CSR) and the lexical side of a memory index."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..granularity import CODES, expand_ranges
from .tokenize import Tokenizer, Vocabulary

__all__ = ["TermMatrix", "LexicalIndex", "LEXICAL_GRANULARITIES", "build_lexical"]

#: granularities with lexical documents (all of them): S (session text), T (one document
#: per turn), U (summary), K (keywords)
LEXICAL_GRANULARITIES = tuple(CODES)
#: stopword list of an index's default tokenizer (why: docs/hybrid.md, "Tokenizer")
INDEX_STOPWORDS = "en_plus"


@dataclass
class TermMatrix:
    """``[n, V]`` term counts in CSR form: row ``i`` has terms
    ``indices[indptr[i]:indptr[i+1]]`` (each once, ascending) with counts ``tf``.
    ``length`` is the row's token count (``tf.sum()`` of the row)."""

    indptr: Tensor  # [n+1] int64
    indices: Tensor  # [nnz] int64
    tf: Tensor  # [nnz] float32

    @property
    def n_rows(self) -> int:
        return self.indptr.numel() - 1

    @classmethod
    def from_ids(cls, docs: Sequence[Sequence[int]]) -> "TermMatrix":
        ptr, idx, val = [0], [], []
        for d in docs:
            c = sorted(Counter(d).items())
            idx.extend(t for t, _ in c)
            val.extend(n for _, n in c)
            ptr.append(len(idx))
        return cls(torch.tensor(ptr, dtype=torch.int64), torch.tensor(idx, dtype=torch.int64),
                   torch.tensor(val, dtype=torch.float32))

    def rows(self, which: Tensor) -> "TermMatrix":
        """The rows ``which`` (any order, repeats allowed) as a new matrix."""
        which = which.to(torch.int64)
        cnt = self.indptr[which + 1] - self.indptr[which]
        ptr = torch.cat([torch.zeros(1, dtype=torch.int64), cnt.cumsum(0)])
        _, src = expand_ranges(self.indptr, which)
        return TermMatrix(ptr, self.indices[src], self.tf[src])

    def to(self, device) -> "TermMatrix":
        return TermMatrix(self.indptr.to(device), self.indices.to(device), self.tf.to(device))


class LexicalIndex:
    """Tokenised documents of the distinct sessions of a memory index, and its questions.

    A memory index shares one tokenizer, vocabulary and question-term matrix between
    the lexical indexes of its views (:mod:`memgas_gpu.memory.segments`); each view
    has its own documents and derived caches.

    Attributes:
        tokenizer: the :class:`Tokenizer` used (its settings are persisted).
        vocab: the term vocabulary (grows as sessions are added).
        n_terms: the vocabulary size these documents were taken at: every document term
            id is below it, and query terms at or above it (added later by a writer)
            match nothing here.
        docs: per granularity (``"S"``, ``"T"``, ``"U"``, ``"K"``) a :class:`TermMatrix`
            over documents; the documents of distinct session ``slot`` are rows
            ``doc_ptr[g][slot]:doc_ptr[g][slot+1]`` (one for S, U, K; one per turn for T).
        doc_ptr: per granularity ``[D+1]`` int64.
        queries: a :class:`TermMatrix` with one row per question of the index.
        score_cache: derived BM25 postings per (granularity, setting, device), built on
            first use by :func:`memgas_gpu.lexical.lexical_postings` (not persisted).
        graphs: lexical association graphs, built on first use (not persisted).
    """

    def __init__(self, tokenizer: Tokenizer, vocab: Vocabulary, docs: dict, doc_ptr: dict,
                 queries: TermMatrix, n_terms: Optional[int] = None) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.n_terms = len(vocab) if n_terms is None else int(n_terms)
        self.docs = docs
        self.doc_ptr = doc_ptr
        self.queries = queries
        self.graphs: dict = {}
        self.score_cache: dict = {}

    @classmethod
    def build(cls, sessions: Sequence, summaries: Sequence[str], keywords: Sequence[str],
              questions: Sequence[str], tokenizer: Optional[Tokenizer] = None,
              extra: Optional[dict] = None) -> "LexicalIndex":
        """Tokenise distinct ``sessions`` (slot order) with their summary and keyword
        texts, and the question texts (default tokenizer: ``Tokenizer(stopwords="en_plus")``).

        Args:
            extra: ``{document set: text(session, summary, keywords) -> str}``: further
                document sets of one document per session (lexical signals with a text of
                their own, :mod:`memgas_gpu.retrieve.signals`).
        """
        tok = tokenizer or Tokenizer(stopwords=INDEX_STOPWORDS)
        vocab = Vocabulary()
        docs, ptr = {}, {}
        texts = {"S": [[s.text] for s in sessions], "T": [list(s.turns) for s in sessions],
                 "U": [[u] for u in summaries], "K": [[k] for k in keywords]}
        for key, fn in (extra or {}).items():
            texts[key] = [[fn(s, u, k)] for s, u, k in zip(sessions, summaries, keywords)]
        for g, per in texts.items():
            docs[g] = TermMatrix.from_ids([vocab.encode(tok.tokens(t)) for d in per for t in d])
            ptr[g] = torch.tensor([0] + [len(d) for d in per], dtype=torch.int64).cumsum(0)
        # question terms get ids even when no document has them yet: a session added
        # later that contains them must match (as in a rebuild)
        queries = TermMatrix.from_ids([vocab.encode(tok.tokens(q)) for q in questions])
        return cls(tok, vocab, docs, ptr, queries)

    def encode_queries(self, texts: Sequence[str]) -> TermMatrix:
        """Term counts of query texts; terms no document here has are dropped (they
        match nothing)."""
        n = self.n_terms
        return TermMatrix.from_ids([[i for i in self.vocab.encode(self.tokenizer.tokens(t),
                                                                  grow=False) if i < n]
                                    for t in texts])

    # ------------------------------------------------------------------ persistence
    def tensors(self, prefix: str = "lexical.") -> dict:
        """Flat tensor dict (safetensors): CSR parts per granularity, queries, and the
        vocabulary as UTF-8 bytes with offsets."""
        out = {}
        for g in self.docs:
            m = self.docs[g]
            out.update({f"{prefix}{g}.indptr": m.indptr, f"{prefix}{g}.indices": m.indices,
                        f"{prefix}{g}.tf": m.tf, f"{prefix}{g}.doc_ptr": self.doc_ptr[g]})
        q = self.queries
        out.update({f"{prefix}q.indptr": q.indptr, f"{prefix}q.indices": q.indices,
                    f"{prefix}q.tf": q.tf})
        enc = [t.encode("utf-8") for t in self.vocab.terms]
        out[f"{prefix}vocab.bytes"] = torch.frombuffer(bytearray(b"".join(enc) or b"\0"),
                                                       dtype=torch.uint8).clone()
        out[f"{prefix}vocab.offsets"] = torch.tensor([0] + [len(e) for e in enc],
                                                     dtype=torch.int64).cumsum(0)
        return out

    @classmethod
    def from_tensors(cls, t: dict, tokenizer_config: dict, prefix: str = "lexical.",
                     keys: Sequence[str] = LEXICAL_GRANULARITIES) -> "LexicalIndex":
        raw = t[f"{prefix}vocab.bytes"].numpy().tobytes()
        off = t[f"{prefix}vocab.offsets"].tolist()
        vocab = Vocabulary(raw[a:b].decode("utf-8") for a, b in zip(off[:-1], off[1:]))
        docs, ptr = {}, {}
        for g in keys:
            docs[g] = TermMatrix(t[f"{prefix}{g}.indptr"], t[f"{prefix}{g}.indices"],
                                 t[f"{prefix}{g}.tf"].float())
            ptr[g] = t[f"{prefix}{g}.doc_ptr"]
        q = TermMatrix(t[f"{prefix}q.indptr"], t[f"{prefix}q.indices"], t[f"{prefix}q.tf"].float())
        return cls(Tokenizer.from_config(tokenizer_config), vocab, docs, ptr, q)

    def describe(self) -> dict:
        return {"tokenizer": self.tokenizer.describe(), "n_terms": len(self.vocab),
                "granularities": list(self.docs)}


def build_lexical(dataset, expansion, sessions: Sequence, questions: Sequence[str],
                  tokenizer: Optional[Tokenizer] = None,
                  extra: Optional[dict] = None) -> LexicalIndex:
    """:class:`LexicalIndex` of the distinct ``sessions`` (in embedding-table slot order),
    with their summary and keyword texts from ``expansion`` (``extra``: see
    :meth:`LexicalIndex.build`)."""
    u_by, k_by = {}, {}
    for c in dataset:
        for s, u, k in zip(c.sessions, expansion.summaries[c.id], expansion.keywords[c.id]):
            u_by.setdefault(s.key, u)
            k_by.setdefault(s.key, k)
    return LexicalIndex.build(sessions, [u_by[s.key] for s in sessions],
                              [k_by[s.key] for s in sessions], questions, tokenizer, extra)
