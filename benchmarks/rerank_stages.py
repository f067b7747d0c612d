"""Re-ranking stages tried on top of ``memgas_hybrid`` and kept out of the package:
set selection (xQuAD, MMR), per-term BM25 scores (xQuAD's aspects) and RM3 query
expansion. None beat the engine's ranking by leave-one-conversation-out on LoCoMo dev
(docs/multi-evidence.md); ``multi_evidence.py`` reproduces those tables with them.

**Set selection.** ``recall_all@k`` counts a question only when every evidence session
is in the top k, but a fusion that scores each session on its own fills the top k with
near-duplicates of the single best match.  :func:`xquad` and :func:`mmr` re-rank the
first ``k`` places greedily, for every question at once (a loop over the ``k`` places,
never over questions):

* :func:`xquad` (Santos et al., WWW 2010, with query terms as the aspects): place ``i``
  goes to the session maximising ``rel(n) + β Σ_t w_t · cov(n, t) · Π_{s chosen}
  (1 - cov(s, t))``: a session is rewarded for the question terms that the sessions
  already chosen do *not* cover yet.
* :func:`mmr` (Carbonell & Goldstein, SIGIR 1998): ``rel(n) - β max_{s chosen}
  sim(n, s)``: a session is penalised for resembling one already chosen.

Both take a relevance ``[Q, N]`` (the fused scores, higher is better), a ``valid``
mask (padding past a conversation's end is never chosen) and return *scores*
``[Q, N]`` whose descending order is the new ranking: the ``k`` chosen sessions get
``top + k - i`` (``top`` = the question's best valid relevance), the others keep their
relevance, so places ``k+1, ...`` keep the original order.

**Per-term scores.** BM25 sums one contribution per query term, ``qtf(t) · idf(t) ·
tfc(t, D)``; :func:`query_term_scores` keeps them apart, ``[Q, L, N_max]`` for the ``L``
distinct terms of each question and the sessions of its conversation, from one sparse
product (the same (conversation, term) column trick as :mod:`memgas_gpu.ops.bm25`).
:func:`term_coverage` turns them into the coverage input of :func:`xquad`.

**RM3** (Abdul-Jaleel et al., TREC 2004; Lavrenko & Croft's relevance model 1
interpolated with the query): take the top ``m`` sessions of a first ranking as
relevant, estimate

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

from memgas_gpu.lexical import BM25Params, TermMatrix
from memgas_gpu.ops.bm25 import bm25_weights

__all__ = ["xquad", "mmr", "order_scores", "query_term_scores", "term_coverage",
           "feedback_weights", "rm3_expand"]


# ---------------------------------------------------------------- set selection
def order_scores(rel: Tensor, valid: Tensor, chosen: Tensor) -> Tensor:
    """Scores whose descending order puts ``chosen`` ``[Q, k]`` (session positions, ``-1``
    = none) first, in that order, then the remaining sessions by ``rel``.

    Args:
        rel: ``[Q, N]`` relevance.
        valid: ``[Q, N]`` bool.
        chosen: ``[Q, k]`` int64 positions, best first; ``-1`` entries are skipped.

    Returns:
        ``[Q, N]`` scores (``-inf`` where not valid).
    """
    rel = torch.where(valid, rel, torch.full_like(rel, float("-inf")))
    k = chosen.shape[1]
    top = rel.amax(1, keepdim=True).clamp_min(torch.finfo(rel.dtype).min / 4)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    bonus = top + torch.arange(k, 0, -1, device=rel.device, dtype=rel.dtype)[None]  # [Q, k]
    ok = chosen >= 0
    out = rel.clone()
    q = torch.arange(rel.shape[0], device=rel.device)[:, None].expand_as(chosen)
    out[q[ok], chosen[ok]] = bonus[ok]
    return out


def _greedy(rel: Tensor, valid: Tensor, k: int, step) -> Tensor:
    """``[Q, k]`` positions chosen greedily: ``step(chosen_mask, last)`` returns the
    ``[Q, N]`` gain of each session given the choices so far (``last``: ``[Q]`` position
    chosen at the previous place, ``-1`` before the first)."""
    Q, N = rel.shape
    k = min(int(k), N)
    taken = ~valid.clone()
    chosen = torch.full((Q, k), -1, dtype=torch.long, device=rel.device)
    last = torch.full((Q,), -1, dtype=torch.long, device=rel.device)
    n_valid = valid.sum(1)
    for i in range(k):
        gain = step(taken, last)
        gain = torch.where(taken, torch.full_like(gain, float("-inf")), gain)
        pick = gain.argmax(1)
        live = n_valid > i
        pick = torch.where(live, pick, torch.full_like(pick, -1))
        chosen[:, i] = pick
        rows = torch.nonzero(live).squeeze(1)
        taken[rows, pick[rows]] = True
        last = pick
    return chosen


def xquad(rel: Tensor, valid: Tensor, cover: Tensor, weight: Tensor, k: int = 10,
          beta: float = 1.0) -> Tensor:
    """Greedy coverage of question terms (xQuAD with terms as aspects).

    Args:
        rel: ``[Q, N]`` relevance (e.g. the fused scores).
        valid: ``[Q, N]`` bool.
        cover: ``[Q, N, L]`` in [0, 1]: how well session ``n`` covers the question's
            term ``l`` (e.g. :func:`term_coverage`).
        weight: ``[Q, L]`` non-negative term weights (0 for padding terms); normalised
            here to sum 1 per question (a question without terms is left unchanged).
        k: places re-ranked.
        beta: weight of the coverage reward, in units of ``rel``.

    Returns:
        ``[Q, N]`` scores (see :func:`order_scores`).
    """
    cover = cover.to(rel.dtype).clamp(0, 1)
    w = weight.to(rel.dtype).clamp_min(0)
    w = w / w.sum(1, keepdim=True).clamp_min(torch.finfo(rel.dtype).tiny)
    residual = torch.ones_like(w)  # [Q, L]: Π over chosen sessions of (1 - cov)
    rows = torch.arange(rel.shape[0], device=rel.device)

    def step(taken, last):
        nonlocal residual
        has = last >= 0
        if bool(has.any()):
            c_last = cover[rows, last.clamp_min(0)]  # [Q, L]
            residual = torch.where(has[:, None], residual * (1 - c_last), residual)
        return rel + beta * torch.einsum("qnl,ql->qn", cover, w * residual)

    return order_scores(rel, valid, _greedy(rel, valid, k, step))


def mmr(rel: Tensor, valid: Tensor, sim: Tensor, k: int = 10, beta: float = 1.0) -> Tensor:
    """Maximal marginal relevance.

    Args:
        rel: ``[Q, N]`` relevance.
        valid: ``[Q, N]`` bool.
        sim: ``[Q, N, N]`` similarity between the question's sessions (e.g. cosine of
            session embeddings), or ``[N, N]`` shared by every question.
        k: places re-ranked.
        beta: weight of the redundancy penalty, in units of ``rel``.

    Returns:
        ``[Q, N]`` scores (see :func:`order_scores`).
    """
    Q, N = rel.shape
    sim = sim.to(rel.dtype)
    if sim.dim() == 2:
        sim = sim[None].expand(Q, N, N)
    red = torch.full_like(rel, float("-inf"))  # max similarity to a chosen session
    rows = torch.arange(Q, device=rel.device)

    def step(taken, last):
        nonlocal red
        has = last >= 0
        if bool(has.any()):
            s_last = sim[rows, :, last.clamp_min(0)]  # [Q, N]
            red = torch.where(has[:, None], torch.maximum(red, s_last), red)
        return rel - beta * torch.where(torch.isfinite(red), red, torch.zeros_like(red))

    return order_scores(rel, valid, _greedy(rel, valid, k, step))


# ---------------------------------------------------------------- per-term BM25 scores
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
    view = index.snapshot()
    lex = view.lexical
    if lex is None:
        raise ValueError("this index has no lexical data: build it with lexical=True")
    if granularity not in lex.docs:
        raise ValueError(f"granularity must be one of {tuple(lex.docs)}, got {granularity!r}")
    p = params or BM25Params()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    qi = torch.as_tensor(questions, dtype=torch.long)
    conv = index.q_conv[qi]
    offs = view.conv_offsets
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
    slots = view.row_slot[rows]
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
    """Coverage input of :func:`xquad` from per-term scores.

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


# ---------------------------------------------------------------- RM3
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
