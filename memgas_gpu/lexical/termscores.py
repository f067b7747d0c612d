"""Per-term BM25 contributions: which session matches which question term.

BM25 sums one contribution per query term, ``qtf(t) · idf(t) · tfc(t, D)``;
:func:`query_term_scores` keeps them apart, ``[Q, L, N_max]`` for the ``L`` distinct
terms of each question and the sessions of its conversation, from one sparse product
(the same (conversation, term) column trick as :mod:`memgas_gpu.ops.bm25`).
:func:`term_coverage` turns them into the coverage input of
:func:`memgas_gpu.ops.coverage.xquad`.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from ..ops.bm25 import bm25_weights
from .signals import BM25Params

__all__ = ["query_term_scores", "term_coverage"]


def query_term_scores(index, questions: Tensor, granularity: str = "S",
                      params: Optional[BM25Params] = None,
                      device: Optional[str] = None) -> tuple[Tensor, Tensor]:
    """BM25 contribution of each question term to each session of its conversation.

    Args:
        index: a :class:`~memgas_gpu.retrieve.MemoryIndex` built with ``lexical=True``.
        questions: ``[Q]`` indices into ``index.questions``.
        granularity: ``"S"`` (session text; corpus = the conversation's sessions),
            ``"T"`` (turns; a session's value is its best turn's), ``"U"`` or ``"K"``.
        params: :class:`BM25Params`.
        device: where to compute (default: CUDA if available).

    Returns:
        ``(scores, mask)``: ``scores`` ``[Q, L, N_max]`` float32, the term's
        ``qtf · idf · tfc`` in that session (0 when absent or past the conversation's
        end), ``mask`` ``[Q, L]`` bool, True for a real term (``L`` = most distinct
        terms of a question).
    """
    lex = getattr(index, "lexical", None)
    if lex is None:
        raise ValueError("this index has no lexical data: build it with lexical=True")
    if granularity not in lex.docs:
        raise ValueError(f"granularity must be one of {tuple(lex.docs)}, got {granularity!r}")
    p = params or BM25Params()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    qi = torch.as_tensor(questions, dtype=torch.long)
    conv = index.q_conv[qi]
    offs = index.conv_offsets
    n_max = int((offs[conv + 1] - offs[conv]).max()) if qi.numel() else 0
    qm = lex.queries.rows(qi)
    q_len = qm.indptr[1:] - qm.indptr[:-1]
    L = int(q_len.max()) if qi.numel() else 0
    scores = torch.zeros(qi.numel(), L, n_max, dtype=torch.float32, device=dev)
    mask = torch.arange(L)[None] < q_len[:, None]
    if qi.numel() == 0 or L == 0:
        return scores, mask.to(dev)
    convs, q_group = torch.unique(conv, return_inverse=True)
    rows = torch.cat([torch.arange(int(offs[c]), int(offs[c + 1])) for c in convs.tolist()])
    row_group = torch.repeat_interleave(torch.arange(convs.numel()), offs[convs + 1] - offs[convs])
    row_pos = rows - offs[convs][row_group]
    slots = index.row_slot[rows]
    ptr = lex.doc_ptr[granularity]
    cnt = ptr[slots + 1] - ptr[slots]
    doc_row = torch.repeat_interleave(torch.arange(rows.numel()), cnt)
    first = torch.cat([torch.zeros(1, dtype=torch.long), cnt.cumsum(0)[:-1]])
    docs = lex.docs[granularity].rows(ptr[slots][doc_row] + torch.arange(doc_row.numel())
                                      - first[doc_row]).to(dev)
    V = len(lex.vocab)
    W, col_key = bm25_weights(docs.indptr, docs.indices, docs.tf, row_group[doc_row].to(dev), V,
                              k1=p.k1, b=p.b, method=p.method)
    # one column per (question, term slot): select the matching weight column
    qrow = torch.repeat_interleave(torch.arange(qi.numel()), q_len)
    slot = torch.arange(qrow.numel()) - qm.indptr[:-1][qrow]
    key = (q_group[qrow] * V + qm.indices).to(dev)
    pos = torch.searchsorted(col_key, key).clamp_max(max(col_key.numel() - 1, 0))
    hit = col_key[pos] == key if col_key.numel() else torch.zeros_like(key, dtype=torch.bool)
    qcol = (qrow * L + slot).to(dev)
    sel = torch.sparse_coo_tensor(torch.stack([pos[hit], qcol[hit]]),
                                  qm.tf.to(dev, W.dtype)[hit], (W.shape[1], qi.numel() * L),
                                  check_invariants=False).coalesce()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support")
        R = torch.sparse.mm(W, sel).coalesce()  # [n_docs, Q*L]
    d, qc = R.indices()
    flat = (qc * n_max + row_pos.to(dev)[doc_row.to(dev)[d]])
    out = scores.view(-1)
    out.scatter_reduce_(0, flat, R.values().float(), "amax")  # S/U/K: one doc per session
    return scores, mask.to(dev)


def term_coverage(scores: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Coverage input of :func:`~memgas_gpu.ops.coverage.xquad` from per-term scores.

    Args:
        scores: ``[Q, L, N]`` non-negative per-term scores (:func:`query_term_scores`).
        mask: ``[Q, L]`` real terms.

    Returns:
        ``(cover, weight)``: ``cover`` ``[Q, N, L]`` = score / the term's best score
        over the sessions (1 for the session that matches it best, 0 where absent),
        ``weight`` ``[Q, L]`` = that best score (a rare term matched well weighs more;
        0 for a term no session has, or a padding term).
    """
    best = scores.amax(2) * mask  # [Q, L]
    cover = scores / best.clamp_min(torch.finfo(scores.dtype).tiny)[..., None]
    cover = torch.where(best[..., None] > 0, cover, torch.zeros_like(cover))
    return cover.transpose(1, 2).contiguous(), best
