"""Choose the top k sessions as a *set*: coverage-aware and diversity-aware re-ranking.

``recall_all@k`` counts a question only when every evidence session is in the top k,
but a fusion that scores each session on its own fills the top k with near-duplicates
of the single best match.  The functions here re-rank the first ``k`` places greedily,
for every question at once (a loop over the ``k`` places, never over questions):

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
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["xquad", "mmr", "order_scores"]


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
            term ``l`` (e.g. :func:`memgas_gpu.lexical.query_term_coverage`).
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
