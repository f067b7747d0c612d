"""A line-by-line emulation of ``csrc/cuda/ppr_cuda.cu`` (its kernels and host loop) in
torch on the CPU, so that the CUDA PageRank's logic can be checked where no GPU is.

Each function below is one kernel of the file, vectorised over its threads; the host
loop is ``ppr_cuda``'s. What it reproduces exactly: the buffers each launch reads and
writes (the work buffers start as NaN, so reading one before it is written shows), the
per-(block, column) states kActive -> kLastCopy -> kFrozen, the live counters and the
launch gate, the host's reads every ``KCHECK`` iterations, the final copy rule, and
each node's neighbour sum (``LANES`` lanes striding over the CSR row, then the
``__shfl_down_sync`` tree). The warp-reduced ``atomicAdd`` sums are plain sums here
(their order varies on the GPU anyway).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

LANES = 8   # kLanes
KCHECK = 4  # kCheck
FROZEN, LAST_COPY, ACTIVE = 0, 1, 2


def _lane_sums(indptr: Tensor, indices: Tensor, y: Tensor) -> Tensor:
    """Lane 0's sum after the shuffle tree: lane l sums y[indices[e]] for
    e = indptr[i] + l, + LANES, ...; then ``acc += shfl_down(acc, off)`` for
    off = LANES / 2, ..., 1 (a lane whose source is outside the group adds its own)."""
    n, Q = indptr.numel() - 1, y.shape[1]
    deg = indptr[1:] - indptr[:-1]
    row = torch.repeat_interleave(torch.arange(n), deg)
    lane = torch.arange(indices.numel()) - indptr[row]
    part = torch.zeros(n * LANES, Q, dtype=y.dtype)
    part.index_add_(0, row * LANES + lane % LANES, y[indices.long()])
    a = part.view(n, LANES, Q)
    off = LANES // 2
    while off:
        nxt = a + a  # lanes past the group's end read their own value
        nxt[:, :LANES - off] = a[:, :LANES - off] + a[:, off:]
        a, off = nxt, off // 2
    return a[:, 0]


def ppr_cuda_emulated(indptr: Tensor, indices: Tensor, r: Tensor, blocks: Optional[Tensor],
                      n_blocks: int, d: float, tol: float, max_iter: int,
                      stats: Optional[dict] = None) -> Tensor:
    """``ppr_cuda`` on the prepared node-major reset ``r [n, Q]``; returns ``out``."""
    n, Q = r.shape
    blk = torch.zeros(n, dtype=torch.int64) if blocks is None else blocks
    nan = torch.full((n, Q), float("nan"), dtype=torch.float64)
    deg = indptr[1:] - indptr[:-1]
    dangling = deg == 0
    # memsets: change and both dangling masses 0, both counters 0
    change = torch.zeros(n_blocks, Q, dtype=torch.float64)
    dm = [torch.zeros(n_blocks, Q, dtype=torch.float64) for _ in range(2)]
    count = [0, 0]
    # init_kernel: p = r, y = r / deg, 1/deg, dangling mass of r
    inv_deg = torch.where(deg > 0, 1.0 / deg.clamp_min(1).double(), torch.zeros(n).double())
    pbuf = [r.clone(), nan.clone()]
    ybuf = [r * inv_deg[:, None], nan.clone()]
    dm[0].index_add_(0, blk[dangling], r[dangling])
    state = torch.full((n_blocks, Q), ACTIVE)  # state_init_kernel
    count[1] = n_blocks * Q                    # live_init_kernel
    gathered = skipped = 0
    it, live = 0, n_blocks * Q
    while it < max_iter:
        c = it % 2
        # step_kernel: gated on the live count of the previous update
        if count[1 - c] != 0:
            st = state[blk]  # [n, Q]: the state of each item's (block, column)
            act, last = st == ACTIVE, st == LAST_COPY
            acc = _lane_sums(indptr, indices, ybuf[c])  # only used where act
            gathered += int(act.sum())
            skipped += int((~act).sum())
            v = (acc * d + (1.0 - d) * r) + (d * r) * dm[c][blk]
            diff = torch.where(act, (v - pbuf[c]).abs(), torch.zeros_like(v))
            pn, yn = pbuf[1 - c], ybuf[1 - c]
            pn[act] = v[act]
            yn[act] = (v * inv_deg[:, None])[act]
            pn[last] = pbuf[c][last]
            yn[last] = ybuf[c][last]
            change.index_add_(0, blk, diff)  # warp_add(change, key, diff)
            keep = torch.where(act & dangling[:, None], v, torch.zeros_like(v))
            dm[1 - c].index_add_(0, blk, keep)  # warp_add(dmass_next, ...)
        # update_kernel
        count[1 - c] = 0
        state = torch.where(state == ACTIVE,
                            torch.where(change < tol, LAST_COPY, ACTIVE), FROZEN)
        change.zero_()
        dm[c].zero_()
        count[c] += int((state != FROZEN).sum())
        # host: read the live count every KCHECK iterations and at the last one
        if it % KCHECK == KCHECK - 1 or it == max_iter - 1:
            live = count[c]
            if live == 0:
                it += 1
                break
        it += 1
    out = pbuf[0]
    if live != 0 and it % 2 == 1:
        out = pbuf[1].clone()
    if stats is not None:
        stats.update(iterations=it, gathered=gathered, skipped=skipped)
    return out
