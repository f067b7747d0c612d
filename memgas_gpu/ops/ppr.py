"""Batched personalized PageRank on an undirected association graph (MemGAS read path).

igraph ``Graph.personalized_pagerank(damping=d, directed=False, reset=r,
implementation="prpack")`` semantics, for many reset vectors at once::

    p = d * (A^T D^-1 p + (sum of p on dangling nodes) * r) + (1 - d) * r

with ``r`` the cleaned reset normalised to sum 1, ``A`` the symmetric adjacency and
``D`` the degrees. A walker on an isolated (dangling) node jumps back to ``r`` (checked
against igraph: max difference 6e-17; a uniform jump would differ by 1e-2). The
result sums to 1. MemGAS uses ``d = 0.1`` (probability of following an edge).

The graph is symmetric CSR (``indptr[n + 1]``, ``indices[nnz]``, int64). No edge values
are stored: the walk divides ``p`` by the degree before one sparse CSR product.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _kernels
from .sparse import check_csr, quiet_sparse_warnings

__all__ = ["personalized_pagerank", "csr_adjacency"]


def csr_adjacency(indptr: Tensor, indices: Tensor, dtype: torch.dtype = torch.float64,
                  device: Optional[torch.device] = None) -> Tensor:
    """Unweighted sparse CSR matrix ``A`` (ones) of a CSR graph, on ``device``.

    Args:
        indptr: ``[n + 1]`` int64 row pointers.
        indices: ``[nnz]`` int64 column indices.
        dtype: value dtype (default float64).
        device: target device (default: the device of ``indptr``).

    Returns:
        ``torch.sparse_csr_tensor`` of shape ``[n, n]``.
    """
    device = indptr.device if device is None else device
    indptr = indptr.to(device=device, dtype=torch.int64)
    indices = indices.to(device=device, dtype=torch.int64)
    n = indptr.numel() - 1
    values = torch.ones(indices.numel(), dtype=dtype, device=device)
    with quiet_sparse_warnings():
        return torch.sparse_csr_tensor(indptr, indices, values, size=(n, n),
                                       check_invariants=False)


def _block_sum(x: Tensor, blocks: Optional[Tensor], n_blocks: int) -> Tensor:
    """Sum of node-major ``x[n, Q]`` per block: ``[n_blocks, Q]`` (``[1, Q]`` without)."""
    if blocks is None:
        return x.sum(dim=0, keepdim=True)
    out = torch.zeros(n_blocks, x.shape[1], dtype=x.dtype, device=x.device)
    return out.index_add_(0, blocks, x)


def _per_node(v: Tensor, blocks: Optional[Tensor]) -> Tensor:
    """Broadcast a per-block ``[B, Q]`` quantity back to nodes ``[n, Q]``."""
    return v if blocks is None else v[blocks]


def personalized_pagerank(
    indptr: Tensor,
    indices: Tensor,
    reset: Tensor,
    damping: float = 0.1,
    tol: float = 1e-10,
    max_iter: int = 100,
    blocks: Optional[Tensor] = None,
    *,
    dtype: Optional[torch.dtype] = None,
    backend: str = "auto",
) -> Tensor:
    """Personalized PageRank for a batch of reset vectors (power iteration).

    Implements ``p = d (A^T D^{-1} p + m_dangling(p) r) + (1 - d) r`` (igraph prpack,
    undirected) for every row of ``reset``; iterations stop per row (per row and block
    when ``blocks`` is given) once the L1 change is below ``tol``, so a row's result
    does not depend on what else is in the batch.

    Args:
        indptr: ``[n + 1]`` integer CSR row pointers of a symmetric graph (no self-loops
            expected; a self-loop counts once in the degree, as in the CSR).
        indices: ``[nnz]`` int64 (or int32) CSR column indices.
        reset: ``[Q, n]`` (or ``[n]``) non-negative reset weights. NaN and negative
            entries are treated as 0; each row (or each block of a row) is normalised to
            sum 1. An all-zero row (block) returns an all-zero row (block) instead of
            raising.
        damping: probability ``d`` of following an edge (default 0.1, MemGAS).
        tol: L1 convergence threshold per row / block (default 1e-10).
        max_iter: maximum number of iterations (default 100).
        blocks: optional ``[n]`` int64 block (conversation) id per node, for a
            block-diagonal graph (no edges between blocks). Each row's reset is then
            normalised per block and dangling mass returns to the same block, so one
            row carries independent queries for many conversations; each non-empty
            block of the result sums to 1.
        dtype: compute/result dtype (default float64, or the reset dtype if float64).
        backend: ``"auto"`` (default: the native kernel for float64 when built for the
            device), ``"native"`` or ``"torch"`` (see :mod:`memgas_gpu._native`). The
            native kernel runs the same iterations (one fused pass each, per-row
            convergence) and agrees with the torch op to about 1e-15; it gathers
            through int32 columns when the graph has fewer than 2**31 nodes.

    Returns:
        ``[Q, n]`` PageRank scores (``[n]`` if ``reset`` was 1-D), on ``reset``'s device.

    Raises:
        ValueError: a malformed graph (``indptr[0] != 0``, decreasing ``indptr``,
            ``indptr[-1] != len(indices)``, a column outside ``[0, n)`` — checked on the
            values as given, by every path), negative block ids, bad shapes.
    """
    squeeze = reset.dim() == 1
    if squeeze:
        reset = reset[None, :]
    if reset.dim() != 2:
        raise ValueError(f"reset must be [Q, n] or [n], got shape {tuple(reset.shape)}")
    dev = reset.device
    dtype = torch.float64 if dtype is None else dtype
    n = indptr.numel() - 1
    if reset.shape[1] != n:
        raise ValueError(f"reset has {reset.shape[1]} columns but the graph has {n} nodes")
    # int32 columns stay int32 (the kernels read them as they are); nothing is narrowed
    # before the range check of the path that runs
    indptr = indptr.to(device=dev)
    indices = indices.to(device=dev)
    blocks, n_blocks = _block_ids(blocks, n, dev)
    r = _normalised_reset(reset, dtype, blocks, n_blocks)
    if r.shape[1] == 0 or n == 0:
        check_csr(indptr, indices, n)
        p = r
    else:
        args = (indptr, indices, r, blocks, n_blocks, damping, tol, max_iter)
        p = _kernels.dispatch("ppr", dev, backend,
                              native=lambda: _kernels.ppr(*args),
                              fallback=lambda: _power_iteration(*args),
                              covered=dtype == torch.float64,
                              uncovered="computes in float64")
    return p[:, 0] if squeeze else p.T.contiguous()


def _block_ids(blocks: Optional[Tensor], n: int, dev: torch.device
               ) -> Tuple[Optional[Tensor], int]:
    """``(blocks as int64 on dev, number of blocks)``; ids must be >= 0."""
    if blocks is None:
        return None, 1
    blocks = blocks.to(device=dev, dtype=torch.int64)
    if blocks.shape != (n,):
        raise ValueError(f"blocks must have shape ({n},), got {tuple(blocks.shape)}")
    if n == 0:
        return blocks, 1
    lo, hi = (int(v) for v in torch.stack(torch.aminmax(blocks)).tolist())
    if lo < 0:
        raise ValueError(f"blocks: block id out of range ({lo} < 0)")
    return blocks, hi + 1


def _normalised_reset(reset: Tensor, dtype: torch.dtype, blocks: Optional[Tensor],
                      n_blocks: int) -> Tensor:
    """Node-major ``[n, Q]`` reset: NaN and negatives to 0, each (block, row) summing to
    1 (all-zero ones stay zero). Node-major: the CSR product needs no transposes."""
    r = reset.to(dtype).T.contiguous()
    r = torch.where(torch.isnan(r) | (r < 0), torch.zeros_like(r), r)
    total = _block_sum(r, blocks, n_blocks)
    return r / _per_node(torch.where(total > 0, total, torch.ones_like(total)), blocks)


def _power_iteration(indptr: Tensor, indices: Tensor, r: Tensor, blocks: Optional[Tensor],
                     n_blocks: int, damping: float, tol: float, max_iter: int) -> Tensor:
    """The torch op: power iteration on the prepared reset ``r [n, Q]``; node-major result.

    Each (block, row) pair stops once its L1 change is below ``tol``: a converged pair
    keeps its value while the others go on.
    """
    n = r.shape[0]
    check_csr(indptr, indices, n)
    indptr = indptr.to(torch.int64)
    deg = (indptr[1:] - indptr[:-1]).to(r.dtype)
    inv_deg = torch.where(deg > 0, 1.0 / deg.clamp_min(1), torch.zeros_like(deg))[:, None]
    dang = torch.nonzero(deg == 0).flatten()
    dang_blocks = None if blocks is None else blocks[dang]
    A = csr_adjacency(indptr, indices, r.dtype, r.device)
    base = (1.0 - damping) * r
    dr = damping * r

    p = r.clone()
    active = torch.ones(n_blocks, r.shape[1], dtype=torch.bool, device=r.device)
    all_active = True
    for _ in range(max_iter):
        new = (A @ (p * inv_deg)).mul_(damping).add_(base)  # d A^T D^-1 p + (1-d) r
        if dang.numel():  # d * (mass on dangling nodes) * r, per block
            dmass = _block_sum(p[dang], dang_blocks, n_blocks)
            new.addcmul_(dr, _per_node(dmass, blocks))
        change = _block_sum((new - p).abs_(), blocks, n_blocks)
        p = new if all_active else torch.where(_per_node(active, blocks), new, p)
        active = active & ~(change < tol)
        all_active = bool(active.all())
        if not all_active and not bool(active.any()):
            break
    return p
