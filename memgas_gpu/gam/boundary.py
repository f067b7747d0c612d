"""When the buffer is consolidated: semantic boundaries and the fixed segmentations.

Every strategy is one sequential rule, applied the same way offline (here, for all
conversations at once) and online (:class:`~memgas_gpu.gam.writer.GamWriter`): event
``i`` starts a new topic when

* it is *forced*: the first event of a session (a session end is the natural pause
  where the paper checks for a boundary), or a grid point of ``turnsN``; or
* it is a *semantic candidate* (``divergence[i] > theta``) and the buffer holds at least
  ``min_events`` events; or
* adding it would take the buffer over ``max_tokens`` (2,048 for GAM, ``N`` for
  ``tokensN``), and the buffer is not empty.

The semantic divergence of event ``i`` is ``1 - cos(x_i, sum of the embeddings of the
window events before it in its session)``: the new utterance against the recent
context of the buffer (:func:`divergence`). It does not depend on earlier decisions,
so it is one tensor pass; only the scan over segment starts (:func:`scan_starts`) is
sequential, and it loops once per *topic*, not per event.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .params import parse_segmentation

__all__ = ["window_context", "divergence", "scan_starts", "segment", "add_boundary_noise"]


def window_context(emb: Tensor, prev: Tensor, ok: Tensor) -> Tensor:
    """Sum of the window events before each event: ``emb[prev[:, l]]`` where ``ok``,
    accumulated lag by lag (the online writer calls this very function with one row, so
    both paths add in the same order and get the same bits)."""
    acc = torch.zeros(prev.shape[0], emb.shape[1], dtype=emb.dtype)
    for lag in range(prev.shape[1]):
        acc += emb[prev[:, lag]] * ok[:, lag:lag + 1].to(emb.dtype)
    return acc


def divergence(x: Tensor, ctx: Tensor) -> Tensor:
    """``1 - cos(x, ctx)`` row by row; 0 where the context is empty."""
    n = ctx.norm(dim=1)
    cos = (x * ctx).sum(1) / n.clamp_min(1e-12)
    return torch.where(n > 0, 1.0 - cos, torch.zeros_like(cos))


def _divergence_all(emb: Tensor, session_start: Tensor, window: int) -> Tensor:
    E = emb.shape[0]
    idx = torch.arange(E)
    start = torch.cummax(torch.where(session_start, idx, torch.zeros_like(idx)), 0).values
    prev = idx[:, None] - torch.arange(1, window + 1)[None, :]
    ok = prev >= start[:, None]
    return divergence(emb, window_context(emb, prev.clamp_min(0), ok))


def scan_starts(forced: np.ndarray, cand: np.ndarray, tokens: np.ndarray, *,
                min_events: int = 1, max_tokens: float = math.inf) -> np.ndarray:
    """Topic starts under the rule of the module doc (one iteration per topic).

    Args:
        forced: ``[E]`` bool, event 0 must be True.
        cand: ``[E]`` bool semantic candidates.
        tokens: ``[E]`` int token counts.
        min_events: a candidate splits only a buffer of at least this many events.
        max_tokens: buffer cap.

    Returns:
        ``[E]`` bool topic starts.
    """
    E = forced.shape[0]
    out = np.zeros(E, dtype=bool)
    if E == 0:
        return out
    idx = np.arange(E)
    # next forced / candidate position at or after i (E when none)
    nf = np.minimum.accumulate(np.where(forced, idx, E)[::-1])[::-1]
    nc = np.minimum.accumulate(np.where(cand, idx, E)[::-1])[::-1]
    nf = np.append(nf, E)
    nc = np.append(nc, E)
    cs = np.concatenate([[0], np.cumsum(tokens, dtype=np.float64)])
    a = 0
    while a < E:
        out[a] = True
        nxt = nf[a + 1]
        if a + min_events < E:
            nxt = min(nxt, nc[max(a + min_events, a + 1)])
        if math.isfinite(max_tokens):
            # first i > a with cs[i+1] - cs[a] > max_tokens
            i = int(np.searchsorted(cs, cs[a] + max_tokens, side="right")) - 1
            nxt = min(nxt, max(i, a + 1))
        a = int(nxt)
    return out


def segment(emb: Tensor, tokens: Tensor, session_start: Tensor, strategy: str = "semantic",
            *, window: int = 3, theta: float = 0.75, min_events: int = 3,
            max_tokens: int = 2048) -> Tensor:
    """Topic starts ``[E]`` (bool) of the events of many conversations (laid out one after
    another; ``session_start`` is also True at every conversation's first event).

    Args:
        emb: ``[E, d]`` normalised event embeddings (used by ``semantic`` only).
        tokens: ``[E]`` token counts.
        session_start: ``[E]`` bool.
        strategy: one of :data:`~memgas_gpu.gam.params.SEGMENTATIONS`
            (``tokens<N>``/``turns<N>`` for any N).
        window, theta, min_events, max_tokens: the semantic rule (module doc).
    """
    kind, n = parse_segmentation(strategy)
    forced = session_start.numpy().copy()
    E = forced.shape[0]
    cand = np.zeros(E, dtype=bool)
    cap = math.inf
    me = 1
    if kind == "event":
        forced[:] = True
    elif kind == "turns":
        idx = np.arange(E)
        start = np.maximum.accumulate(np.where(forced, idx, 0))
        forced |= (idx - start) % n == 0
    elif kind == "tokens":
        cap = n
    elif kind == "semantic":
        cand = (_divergence_all(emb, session_start, window) > theta).numpy()
        cap, me = max_tokens, min_events
    return torch.from_numpy(scan_starts(forced, cand, tokens.numpy(), min_events=me,
                                        max_tokens=cap))


def add_boundary_noise(starts: Tensor, session_start: Tensor, p: float,
                       seed: int = 0) -> Tensor:
    """Move a share ``p`` of the topic boundaries that are not session starts to a
    random other position of the same session (the number of topics is kept; a moved
    boundary never lands on an existing one). ``p = 0`` returns ``starts``."""
    if p <= 0:
        return starts
    rng = np.random.default_rng(seed)
    out = starts.numpy().copy()
    ss = session_start.numpy()
    sess = np.cumsum(ss) - 1
    movable = np.flatnonzero(out & ~ss)
    pick = movable[rng.random(movable.shape[0]) < p]
    for b in pick:  # one iteration per moved boundary
        free = np.flatnonzero((sess == sess[b]) & ~out & ~ss)
        if free.size == 0:
            continue
        out[b] = False
        out[free[rng.integers(free.size)]] = True
    return torch.from_numpy(out)
