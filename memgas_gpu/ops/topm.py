"""Top-``m`` candidate search within row ranges (write path: linking a new node to the
most similar earlier ones).

Query ``i`` is compared with the keys of its own range ``keys[start[i]:stop[i]]`` (for a
new node: the earlier nodes of its conversation) by dot product, and the ``m`` best are
kept, best first; ties go to the lower row, so the result is deterministic.  Rows are
processed in chunks of at most ``max_elements`` products (never a full ``[R, n]``
similarity matrix), for every query at once.

Two ways to compute the similarities (the same values up to float rounding):

* ``exact=True``: each similarity is an elementwise product summed over ``d``, over the
  gathered candidates of each row: a row's values do not depend on the other rows of
  its chunk, so one row searched alone (an online write) gets the same bits as in a
  batched build.
* ``exact=False``: one matrix product per chunk over the union of its rows' ranges
  (fastest when the rows of a chunk share their range start, as the nodes of one
  conversation do); its rounding depends on the chunk's shape.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
from torch import Tensor

__all__ = ["range_top_m"]


def range_top_m(query: Tensor, keys: Tensor, start: Tensor, stop: Tensor, m: int, *,
                exact: bool = True, max_elements: int = 1 << 22
                ) -> Tuple[Tensor, Tensor, Tensor]:
    """The ``m`` keys of each query's range with the largest dot product.

    Args:
        query: ``[R, d]`` query vectors.
        keys: ``[n, d]`` key vectors (same dtype and device as ``query``).
        start, stop: ``[R]`` int64, query ``i`` searches rows ``start[i]:stop[i]`` of
            ``keys`` (an empty range finds nothing).
        m: candidates kept per query (``>= 0``).
        exact: batch-invariant similarities (see the module doc).
        max_elements: products per chunk (``R_chunk * width * d`` when exact,
            ``R_chunk * width`` otherwise).

    Returns:
        ``(sims [R, m], index [R, m], valid [R, m])``: similarities best first, the key
        row of each, and which slots hold a candidate; empty slots (fewer than ``m``
        candidates, or a NaN similarity) have similarity ``-inf`` and index 0.
    """
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if query.dim() != 2 or keys.dim() != 2 or query.shape[1] != keys.shape[1]:
        raise ValueError(f"query [R, d] and keys [n, d] must share d; got "
                         f"{tuple(query.shape)} and {tuple(keys.shape)}")
    R, d = query.shape
    dev = keys.device
    sims = torch.full((R, m), -math.inf, dtype=keys.dtype, device=dev)
    index = torch.zeros(R, m, dtype=torch.long, device=dev)
    start = start.to(device=dev, dtype=torch.long)
    width = (stop.to(device=dev, dtype=torch.long) - start).clamp_min(0)
    W = int(width.max()) if R else 0
    if R == 0 or m == 0 or W == 0:
        return sims, index, torch.zeros(R, m, dtype=torch.bool, device=dev)
    step = max(1, max_elements // max(1, W * d if exact else W))
    for s in range(0, R, step):  # chunks of rows, not a loop per row
        f, n, q = start[s:s + step], width[s:s + step], query[s:s + step]
        w = int(n.max())
        if w == 0:
            continue
        if exact:
            col = torch.arange(w, device=dev)
            ok = col[None, :] < n[:, None]
            cand = torch.where(ok, f[:, None] + col[None, :], torch.zeros_like(f)[:, None])
            sim = (q[:, None, :] * keys[cand]).sum(-1)
        else:
            live = n > 0
            lo, hi = int(f[live].min()), int((f + n)[live].max())
            cand = torch.arange(lo, hi, device=dev)[None, :].expand(q.shape[0], -1)
            ok = (cand >= f[:, None]) & (cand < (f + n)[:, None])
            sim = q @ keys[lo:hi].T
        sim = sim.masked_fill(~ok | torch.isnan(sim), -math.inf)
        k = min(m, sim.shape[1])
        order = torch.sort(sim, dim=1, descending=True, stable=True).indices[:, :k]
        sims[s:s + step, :k] = torch.gather(sim, 1, order)
        index[s:s + step, :k] = torch.gather(cand, 1, order)
    valid = sims > -math.inf
    index = torch.where(valid, index, torch.zeros_like(index))
    return sims, index, valid
