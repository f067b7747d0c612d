"""BM25F-style term counts: a document made of weighted parts (Robertson, Zaragoza &
Taylor, CIKM 2004), batched over every document.

The speaker cue (:mod:`memgas_gpu.retrieve.cues`) uses it so that the messages of the
speaker a question names weigh ``1 + γ`` in the turn (or session) they belong to; the
weighted counts then go through BM25 (:mod:`memgas_gpu.ops.bm25`) as usual.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["field_weighted_counts"]


def field_weighted_counts(doc: Tensor, term: Tensor, tf: Tensor, field_weight: Tensor,
                          n_docs: int) -> tuple[Tensor, Tensor, Tensor]:
    """BM25F-style term counts: ``tf'(d, t) = Σ_parts w(part) · tf(part, t)``.

    A document (a turn, a session) is made of parts (its messages), each with a weight
    (e.g. ``1 + γ`` for the messages of the speaker the question names); the weighted
    counts then go through BM25's saturation and length normalisation as usual
    (Robertson, Zaragoza & Taylor, CIKM 2004).

    Args:
        doc: ``[nnz]`` int64 document of each (part, term) entry.
        term: ``[nnz]`` int64 term id.
        tf: ``[nnz]`` count of the term in the part.
        field_weight: ``[nnz]`` weight of the entry's part.
        n_docs: number of documents.

    Returns:
        ``(indptr [n_docs+1], indices, tf)``: CSR weighted counts, terms ascending per row.
    """
    n_terms = int(term.max()) + 1 if term.numel() else 1
    key, inv = torch.unique(doc * n_terms + term, return_inverse=True)
    val = torch.zeros(key.numel(), dtype=torch.float32, device=tf.device)
    val.index_add_(0, inv, (tf * field_weight).float())
    d = key // n_terms
    ptr = torch.zeros(n_docs + 1, dtype=torch.long, device=tf.device)
    ptr[1:] = torch.bincount(d, minlength=n_docs).cumsum(0)
    return ptr, key % n_terms, val
