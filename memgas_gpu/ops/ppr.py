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

import warnings
from typing import Optional

import torch
from torch import Tensor

from .. import _native

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
    with warnings.catch_warnings():  # "sparse CSR support is in beta" is not news here
        warnings.simplefilter("ignore", UserWarning)
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
        indptr: ``[n + 1]`` int64 CSR row pointers of a symmetric graph (no self-loops
            expected; a self-loop counts once in the degree, as in the CSR).
        indices: ``[nnz]`` int64 CSR column indices.
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
            convergence) and agrees with the torch op to about 1e-15. ``indices`` may
            be int32 there (half the memory traffic).

    Returns:
        ``[Q, n]`` PageRank scores (``[n]`` if ``reset`` was 1-D), on ``reset``'s device.
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
    indptr = indptr.to(device=dev, dtype=torch.int64)
    native = _native.resolve("ppr", dev, backend) == "native"
    if native and dtype != torch.float64:
        if backend == "native":
            raise ValueError("the native PPR kernel computes in float64")
        native = False
    # the native kernels gather through int32 column indices when they fit (half the
    # index traffic); the torch op needs int64
    small = native and n < 2 ** 31
    indices = indices.to(device=dev, dtype=torch.int32 if small else torch.int64)

    # node-major layout [n, Q]: the CSR product needs no transposes
    r = reset.to(dtype).T.contiguous()
    r = torch.where(torch.isnan(r) | (r < 0), torch.zeros_like(r), r)
    n_blocks = 1
    if blocks is not None:
        blocks = blocks.to(device=dev, dtype=torch.int64)
        if blocks.shape != (n,):
            raise ValueError(f"blocks must have shape ({n},), got {tuple(blocks.shape)}")
        if n > 0:
            lo, hi = (int(v) for v in torch.stack(torch.aminmax(blocks)).tolist())
            if lo < 0:
                raise ValueError(f"blocks: block id out of range ({lo} < 0)")
            n_blocks = hi + 1
    total = _block_sum(r, blocks, n_blocks)
    r = r / _per_node(torch.where(total > 0, total, torch.ones_like(total)), blocks)
    if r.shape[1] == 0 or n == 0:
        out = r.T.contiguous()
        return out[0] if squeeze else out

    if native:
        try:
            out = _ppr_native(indptr, indices, r, blocks, n_blocks, damping, tol, max_iter)
            return out[:, 0] if squeeze else out.T.contiguous()
        except RuntimeError as exc:  # cannot launch (no kernel image, old driver, ...)
            if backend != "auto":
                raise
            _native.native_failed("ppr", dev, exc)
            indices = indices.to(torch.int64)

    deg = (indptr[1:] - indptr[:-1]).to(dtype)
    inv_deg = torch.where(deg > 0, 1.0 / deg.clamp_min(1), torch.zeros_like(deg))[:, None]
    dang = torch.nonzero(deg == 0).flatten()
    dang_blocks = None if blocks is None else blocks[dang]
    A = csr_adjacency(indptr, indices, dtype, dev)
    base = (1.0 - damping) * r
    dr = damping * r

    p = r.clone()
    active = torch.ones_like(total, dtype=torch.bool)  # [B, Q]
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
    out = p.T.contiguous()
    return out[0] if squeeze else out


def _ppr_native(indptr: Tensor, indices: Tensor, r: Tensor, blocks: Optional[Tensor],
                n_blocks: int, damping: float, tol: float, max_iter: int) -> Tensor:
    """Native power iteration on the prepared node-major reset ``r [n, Q]``."""
    n, Q = r.shape
    # Every tensor whose pointer goes to the kernel is bound to a name until the call
    # returns: ``t.contiguous().data_ptr()`` of a non-contiguous ``t`` would hand over
    # the memory of a temporary that is freed (and on CUDA reused) before the kernel runs.
    r = r.contiguous()
    indptr = indptr.contiguous()
    indices = indices.contiguous()
    blk = blocks.contiguous() if blocks is not None else None
    out = torch.empty_like(r)
    if int(indptr[-1]) != indices.numel():
        raise ValueError(f"indptr[-1] = {int(indptr[-1])} but indices has "
                         f"{indices.numel()} entries")
    args = (indptr.data_ptr(), indices.data_ptr(), indices.dtype == torch.int64, n,
            r.data_ptr(), Q, 0 if blk is None else blk.data_ptr(), n_blocks,
            float(damping), float(tol), int(max_iter), out.data_ptr())
    if _native.on_cuda(r):
        # scratch in torch's allocator; the kernel checks the graph on the device first
        n_work, n_iwork = _native.C.ppr_cuda_workspace(n, Q, n_blocks)
        work = torch.empty(n_work, dtype=torch.float64, device=r.device)
        iwork = torch.empty(n_iwork, dtype=torch.int32, device=r.device)
        with _native.cuda_stream(r.device) as stream:
            _native.C.ppr_cuda(*args, work.data_ptr(), work.numel(), iwork.data_ptr(),
                               iwork.numel(), stream)
    else:
        _native.C.ppr_cpu(*args, _native.n_threads())
    return out


def _self_check(device: torch.device) -> Optional[str]:
    """The native kernel against the torch op on a small fixed graph (see _native)."""
    g = torch.Generator().manual_seed(14)
    n, per = 96, 24  # four blocks; nodes 0, 24, 48, 72 and every 7th node are isolated
    blocks = torch.arange(n) // per
    src = torch.randint(0, n, (4 * n,), generator=g)
    dst = blocks[src] * per + torch.randint(0, per, (4 * n,), generator=g)
    keep = (src % per != 0) & (dst % per != 0) & (src % 7 != 3) & (dst % 7 != 3)
    src, dst = src[keep], dst[keep]
    key = torch.unique(torch.cat([src * n + dst, dst * n + src]))
    key = key[key // n != key % n]
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    indptr[1:] = torch.bincount(key // n, minlength=n).cumsum(0)
    indices = key % n
    reset = torch.rand(5, n, generator=g, dtype=torch.float64)
    reset[reset < 0.6] = 0
    reset[2] = 0  # an empty row
    worst = 0.0
    for blk in (None, blocks):
        args = [t.to(device) for t in (indptr, indices, reset)]
        bk = None if blk is None else blk.to(device)
        a = personalized_pagerank(*args, blocks=bk, backend="native")
        b = personalized_pagerank(*args, blocks=bk, backend="torch")
        worst = max(worst, float((a - b).abs().max()))
    return None if worst <= 1e-12 else f"max |native - torch| = {worst:.3g} > 1e-12"


_native.register_self_check("ppr", _self_check)

