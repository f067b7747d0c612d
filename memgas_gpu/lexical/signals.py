"""Lexical session signals of a :class:`~memgas_gpu.retrieve.MemoryIndex`: BM25 of every
question against the sessions of its own conversation, per granularity.

=============  ==========================================================================
signal         score of session i for question q
=============  ==========================================================================
``bm25_S``     BM25 of q against session i's text; corpus = the conversation's sessions
``bm25_Tmax``  max over session i's turns of BM25(q, turn); corpus = the conversation's turns
``bm25_Tmean`` mean over session i's turns of the same turn scores
``bm25_U``     BM25 against session i's summary; corpus = the conversation's summaries
``bm25_K``     BM25 against session i's keywords; corpus = the conversation's keyword lists
=============  ==========================================================================

All questions are scored in one sparse product per granularity (conversations are
processed in chunks bounded by ``max_nnz`` document terms).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..granularity import CODES
from ..ops.bm25 import bm25_scores, bm25_weights

__all__ = ["LEXICAL_SIGNALS", "BM25Params", "lexical_signals"]

LEXICAL_SIGNALS = ("bm25_S", "bm25_Tmax", "bm25_Tmean", "bm25_U", "bm25_K")
_GRAN = {"bm25_S": "S", "bm25_Tmax": "T", "bm25_Tmean": "T", "bm25_U": "U", "bm25_K": "K"}


@dataclass
class BM25Params:
    """BM25 settings (defaults as ``bm25s``)."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"


def _layout(index, conv: Tensor):
    sizes = index.conv_offsets[1:] - index.conv_offsets[:-1]
    n = sizes[conv]
    return n, int(n.max()) if n.numel() else 0


def lexical_signals(index, questions: Optional[Tensor] = None,
                    names: Sequence[str] = LEXICAL_SIGNALS, params: Optional[BM25Params] = None,
                    device: Optional[str] = None, max_nnz: int = 1 << 24,
                    queries=None, query_conversation: Optional[Tensor] = None,
                    lexical=None) -> dict:
    """BM25 signals ``{name: [Q, N_max] float32}`` (0 where no term matches; padding
    past a conversation's end is 0 too: mask it with the session counts).

    Args:
        index: a MemoryIndex built with ``lexical=True``.
        questions: ``[Q]`` indices into ``index.questions`` (default all).
        names: signals to compute (subset of :data:`LEXICAL_SIGNALS`).
        params: :class:`BM25Params`.
        device: where to compute (default: CUDA if available).
        max_nnz: document terms per conversation chunk.
        queries: optional :class:`~memgas_gpu.lexical.terms.TermMatrix` replacing the
            stored question terms (row j for ``questions[j]``, or for query j of
            ``query_conversation``).
        query_conversation: ``[Q]`` conversation index of each row of ``queries``, for
            queries that are not questions of the index (``questions`` is then ignored).
        lexical: a :class:`~memgas_gpu.lexical.LexicalIndex` to use instead of
            ``index.lexical`` (same distinct sessions, e.g. another tokenizer).
    """
    lex = lexical if lexical is not None else getattr(index, "lexical", None)
    if lex is None:
        raise ValueError("this index has no lexical data: build it with lexical=True")
    bad = [n for n in names if n not in _GRAN]
    if bad:
        raise ValueError(f"unknown lexical signal(s) {bad}; choose from {LEXICAL_SIGNALS}")
    p = params or BM25Params()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if query_conversation is not None:
        if queries is None:
            raise ValueError("query_conversation needs queries= (their term counts)")
        conv = torch.as_tensor(query_conversation, dtype=torch.long).cpu()
        qi = None
    else:
        qi = (torch.arange(len(index.questions)) if questions is None
              else torch.as_tensor(questions, dtype=torch.long))
        conv = index.q_conv[qi]
    n, n_max = _layout(index, conv)
    Q = conv.numel()
    out = {name: torch.zeros(Q, n_max, dtype=torch.float32, device=dev) for name in names}
    grans = sorted({_GRAN[x] for x in names}, key=CODES.index)
    if Q == 0 or not grans:
        return out
    qmat = queries if queries is not None else lex.queries.rows(qi)
    V = len(lex.vocab)
    convs = torch.unique(conv)
    offs = index.conv_offsets
    # chunk conversations by their S-document size (a proxy for every granularity)
    s_nnz = lex.docs["S"].indptr[1:] - lex.docs["S"].indptr[:-1]
    cost = [int(s_nnz[index.row_slot[offs[c]:offs[c + 1]]].sum()) for c in convs.tolist()]
    start = 0
    while start < convs.numel():
        end, acc = start, 0
        while end < convs.numel() and (end == start or acc + cost[end] <= max_nnz):
            acc += cost[end]
            end += 1
        cs = convs[start:end]
        start = end
        rows = torch.cat([torch.arange(int(offs[c]), int(offs[c + 1])) for c in cs.tolist()])
        row_group = torch.repeat_interleave(torch.arange(cs.numel()), offs[cs + 1] - offs[cs])
        row_pos = rows - offs[cs][row_group]
        local = torch.full((int(conv.max()) + 1,), -1, dtype=torch.long)
        local[cs] = torch.arange(cs.numel())
        qsel = torch.nonzero(local[conv] >= 0).squeeze(1)
        qm = qmat.rows(qsel)
        q_group = local[conv[qsel]]
        slots = index.row_slot[rows]
        for g in grans:
            ptr = lex.doc_ptr[g]
            cnt = ptr[slots + 1] - ptr[slots]
            doc_row = torch.repeat_interleave(torch.arange(rows.numel()), cnt)
            first = torch.cat([torch.zeros(1, dtype=torch.long), cnt.cumsum(0)[:-1]])
            doc_ids = ptr[slots][doc_row] + torch.arange(doc_row.numel()) - first[doc_row]
            docs = lex.docs[g].rows(doc_ids).to(dev)
            W, col_key = bm25_weights(docs.indptr, docs.indices, docs.tf,
                                      row_group[doc_row].to(dev), V, k1=p.k1, b=p.b,
                                      method=p.method)
            S = bm25_scores(W, col_key, V, qm.indptr.to(dev), qm.indices.to(dev),
                            qm.tf.to(dev), q_group.to(dev))
            qq, dd = S.indices()
            val = S.values().float()
            tq = qsel.to(dev)[qq]
            pos = row_pos.to(dev)[doc_row.to(dev)[dd]]
            flat = tq * n_max + pos
            for name in names:
                if _GRAN[name] != g:
                    continue
                o = out[name].view(-1)
                if name == "bm25_Tmean":
                    o.index_add_(0, flat, val)
                    turns = torch.zeros(cs.numel(), n_max, device=dev)
                    turns[row_group.to(dev), row_pos.to(dev)] = cnt.to(dev, torch.float32)
                    qs = qsel.to(dev)
                    out[name][qs] = out[name][qs] / turns[q_group.to(dev)].clamp_min(1)
                elif g == "T":
                    o.scatter_reduce_(0, flat, val, "amax")
                else:
                    o.index_add_(0, flat, val)
    return out
