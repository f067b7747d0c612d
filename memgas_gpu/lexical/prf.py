"""RM3 pseudo-relevance feedback for the lexical signals, as sparse products.

RM3 (Abdul-Jaleel et al., TREC 2004; Lavrenko & Croft's relevance model 1 interpolated
with the query): take the top ``m`` sessions of a first ranking as relevant, estimate

    P(t | R) = Σ_d P(d | q) · P(t | d),     P(t | d) = tf(t, d) / |d|,

keep its ``n`` most probable terms (renormalised), and mix with the query's own term
distribution: ``P'(t | q) = (1 - λ) qtf(t) / |q| + λ P(t | R)``.  The expanded query
is returned as a :class:`~memgas_gpu.lexical.TermMatrix` with real-valued "counts"
``|q| · P'(t | q)`` (the same total mass as the original), which every BM25 signal
accepts (``lexical_signals(..., queries=...)``: a query term's weight multiplies its
contribution).  For every question at once: ``P(t | R)`` is one sparse ``[Q, D] ×
[D, V]`` product and the top ``n`` terms per question are kept with one sort.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from .terms import TermMatrix

__all__ = ["rm3_expand", "feedback_weights"]


def _coo(m: TermMatrix, n_cols: int, values: Optional[Tensor] = None) -> Tensor:
    rows = torch.repeat_interleave(torch.arange(m.n_rows, device=m.indptr.device),
                                   m.indptr[1:] - m.indptr[:-1])
    v = m.tf if values is None else values
    return torch.sparse_coo_tensor(torch.stack([rows, m.indices]), v.double(),
                                   (m.n_rows, n_cols), check_invariants=False).coalesce()


def _row_normalise(m: TermMatrix) -> Tensor:
    rows = torch.repeat_interleave(torch.arange(m.n_rows, device=m.indptr.device),
                                   m.indptr[1:] - m.indptr[:-1])
    tot = torch.zeros(m.n_rows, dtype=torch.float64, device=m.tf.device).index_add_(
        0, rows, m.tf.double())
    return m.tf.double() / tot[rows].clamp_min(1e-300)


def feedback_weights(scores: Tensor, valid: Tensor, doc_of: Tensor, n_docs: int, m: int = 3,
                     temperature: Optional[float] = None) -> Tensor:
    """``P(d | q)`` over each question's top ``m`` sessions, as a sparse ``[Q, n_docs]``.

    Args:
        scores: ``[Q, N]`` first-pass scores.
        valid: ``[Q, N]`` bool.
        doc_of: ``[Q, N]`` int64 document id (a row of the feedback ``TermMatrix``) of
            each session position.
        n_docs: number of feedback documents.
        m: sessions taken as relevant.
        temperature: ``None``: uniform over the top ``m``; else ``softmax(score / T)``
            over them.
    """
    s = torch.where(valid, scores.double(), torch.full_like(scores, float("-inf"),
                                                            dtype=torch.float64))
    m = min(int(m), s.shape[1])
    top, pos = s.topk(m, dim=1)
    ok = torch.isfinite(top)
    if temperature is None:
        w = ok.double()
    else:
        w = torch.softmax(torch.where(ok, top / temperature, torch.full_like(top, -1e300)), 1)
        w = w * ok
    w = w / w.sum(1, keepdim=True).clamp_min(1e-300)
    q = torch.arange(s.shape[0], device=s.device)[:, None].expand_as(pos)
    return torch.sparse_coo_tensor(torch.stack([q[ok], doc_of.gather(1, pos)[ok]]), w[ok],
                                   (s.shape[0], n_docs), check_invariants=False).coalesce()


def rm3_expand(queries: TermMatrix, docs: TermMatrix, feedback: Tensor, n_terms: int = 10,
               lam: float = 0.5) -> TermMatrix:
    """Expanded queries (RM3).

    Args:
        queries: ``[Q, V]`` query term counts.
        docs: ``[D, V]`` feedback documents' term weights (counts for classic RM3; any
            non-negative weights, e.g. BM25 document weights, give ``P(t | d)`` ∝ them).
        feedback: sparse or dense ``[Q, D]`` ``P(d | q)`` (rows summing to 1; a zero row
            leaves the query unchanged), e.g. :func:`feedback_weights`.
        n_terms: feedback terms kept per query (the most probable under ``P(t | R)``).
        lam: weight of the feedback distribution (0 = the original query).

    Returns:
        A :class:`TermMatrix` ``[Q, V]`` with float "counts" ``|q| · P'(t | q)``.
    """
    dev = queries.indptr.device
    V = int(max(int(queries.indices.max()) if queries.indices.numel() else -1,
                int(docs.indices.max()) if docs.indices.numel() else -1)) + 1
    Q = queries.n_rows
    Pd = _coo(docs, V, _row_normalise(docs))
    fb = feedback.to_sparse() if not feedback.is_sparse else feedback
    fb = fb.double().coalesce()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support")
        R = torch.sparse.mm(fb, Pd).coalesce()  # [Q, V]
    r, t = R.indices()
    v = R.values()
    # top n_terms per row: sort by value (desc), then stably by row
    o = torch.argsort(v, descending=True, stable=True)
    o = o[torch.argsort(r[o], stable=True)]
    r, t, v = r[o], t[o], v[o]
    start = torch.zeros(Q + 1, dtype=torch.long, device=dev)
    start[1:] = torch.bincount(r, minlength=Q).cumsum(0)
    keep = (torch.arange(r.numel(), device=dev) - start[r]) < n_terms
    r, t, v = r[keep], t[keep], v[keep]
    tot = torch.zeros(Q, dtype=torch.float64, device=dev).index_add_(0, r, v)
    v = v / tot[r].clamp_min(1e-300)
    qlen = torch.zeros(Q, dtype=torch.float64, device=dev)
    qrows = torch.repeat_interleave(torch.arange(Q, device=dev), queries.indptr[1:]
                                    - queries.indptr[:-1])
    qlen.index_add_(0, qrows, queries.tf.double())
    has_fb = torch.zeros(Q, dtype=torch.bool, device=dev)
    has_fb[r] = True
    lam_q = torch.where(has_fb, torch.full_like(qlen, lam), torch.zeros_like(qlen))
    orig = queries.tf.double() * (1 - lam_q[qrows])  # |q| (1-λ) qtf/|q|
    exp = v * lam_q[r] * qlen[r]
    rows = torch.cat([qrows, r])
    cols = torch.cat([queries.indices, t])
    vals = torch.cat([orig, exp])
    M = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (Q, V),
                                check_invariants=False).coalesce()
    mr, mc = M.indices()
    mv = M.values()
    nz = mv > 0
    mr, mc, mv = mr[nz], mc[nz], mv[nz]
    ptr = torch.zeros(Q + 1, dtype=torch.long, device=dev)
    ptr[1:] = torch.bincount(mr, minlength=Q).cumsum(0)
    return TermMatrix(ptr, mc, mv.float())
