"""The CUDA PageRank's logic, checked without a GPU: ``tests/_ppr_cuda_emulation.py``
replays ``csrc/cuda/ppr_cuda.cu`` kernel by kernel (states kActive -> kLastCopy ->
kFrozen, the launch gate on the live count, host reads every 4 iterations, the final
copy, the lane sums) and must match the torch op to 1e-12 on graphs with blocks that
converge at different iterations, isolated nodes, empty rows, no edges, a high-degree
node, and iteration caps of 0 to 100, odd and even.
"""
from __future__ import annotations

import pytest
import torch

from memgas_gpu.ops import personalized_pagerank, symmetric_csr

from _ppr_cuda_emulation import ppr_cuda_emulated

TOL = 1e-12


def _normalised(reset: torch.Tensor, blocks, n_blocks: int) -> torch.Tensor:
    rt = reset.T.contiguous()
    if blocks is None:
        total = rt.sum(0, keepdim=True)
        return rt / torch.where(total > 0, total, torch.ones_like(total))
    total = torch.zeros(n_blocks, rt.shape[1], dtype=rt.dtype).index_add_(0, blocks, rt)
    return rt / torch.where(total > 0, total, torch.ones_like(total))[blocks]


def _graph(sizes, degrees, seed=0, isolated_every=9):
    """Blocks of the given sizes and mean degrees (denser blocks converge sooner)."""
    g = torch.Generator().manual_seed(seed)
    src, dst, blocks, start = [], [], [], 0
    for b, (size, deg) in enumerate(zip(sizes, degrees)):
        s = torch.randint(0, size, (deg * size,), generator=g)
        t = torch.randint(0, size, (deg * size,), generator=g)
        keep = (s % isolated_every != 1) & (t % isolated_every != 1)
        src.append(s[keep] + start)
        dst.append(t[keep] + start)
        blocks.append(torch.full((size,), b))
        start += size
    indptr, indices = symmetric_csr(torch.stack([torch.cat(src), torch.cat(dst)]), start)
    return indptr, indices, torch.cat(blocks)


def _resets(n, Q, seed):
    g = torch.Generator().manual_seed(seed)
    reset = torch.rand(Q, n, generator=g, dtype=torch.float64)
    reset[reset < 0.85] = 0
    if Q > 2:
        reset[1] = 0  # an empty row
    return reset


def _compare(indptr, indices, blocks, reset, tol, max_iter, stats=None):
    n_blocks = 1 if blocks is None else int(blocks.max()) + 1
    r = _normalised(reset, blocks, n_blocks)
    got = ppr_cuda_emulated(indptr, indices, r, blocks, n_blocks, 0.1, tol, max_iter, stats)
    ref = personalized_pagerank(indptr, indices, reset, tol=tol, max_iter=max_iter,
                                blocks=blocks, backend="torch").T
    assert not torch.isnan(got).any()
    worst = float((got - ref).abs().max())
    assert worst <= TOL, f"max |emulated CUDA - torch| = {worst:.3g}"


@pytest.mark.parametrize("tol, max_iter", [(1e-10, 100), (0.0, 0), (0.0, 1), (0.0, 7),
                                           (0.0, 8), (1e-10, 3), (1e-10, 5), (1e-6, 100)])
@pytest.mark.parametrize("use_blocks", [False, True])
@pytest.mark.parametrize("Q", [1, 3])
def test_emulated_cuda_ppr_equals_torch(tol, max_iter, use_blocks, Q):
    indptr, indices, blocks = _graph([40, 25, 60, 30], [1, 6, 3, 12], seed=Q)
    reset = _resets(indptr.numel() - 1, Q, seed=max_iter)
    _compare(indptr, indices, blocks if use_blocks else None, reset, tol, max_iter)


def test_emulated_cuda_ppr_edge_cases():
    # no edges at all (every node dangling), with and without blocks
    n = 20
    indptr, indices = torch.zeros(n + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    blocks = torch.arange(n) // 5
    for blk in (None, blocks):
        _compare(indptr, indices, blk, _resets(n, 3, 1), 1e-10, 100)
    # one high-degree node (a star of 300 leaves: every lane strides many edges)
    star = torch.stack([torch.zeros(300, dtype=torch.int64), torch.arange(1, 301)])
    indptr, indices = symmetric_csr(star, 301)
    _compare(indptr, indices, None, _resets(301, 2, 2), 1e-10, 100)
    _compare(indptr, indices, None, _resets(301, 2, 3), 0.0, 9)


def test_emulated_cuda_ppr_skips_converged_pairs():
    """Blocks of different density converge at different iterations: the frozen
    (block, column) pairs stop gathering, and the result still equals the torch op."""
    indptr, indices, blocks = _graph([50, 50, 50], [1, 4, 16], seed=3, isolated_every=50)
    reset = _resets(150, 2, 4)
    stats = {}
    _compare(indptr, indices, blocks, reset, 1e-10, 100, stats)
    assert stats["skipped"] > 0, stats
    assert stats["gathered"] < stats["iterations"] * 150 * 2
