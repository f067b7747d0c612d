"""Self-checks of the native CUDA kernels, and :func:`backend`: what ``auto`` runs.

Before ``backend="auto"`` first runs a native CUDA kernel on a device (each device index
on its own), :mod:`memgas_gpu._native` runs that kernel's check here: the kernel and the
torch op on small fixed problems on the same device. A mismatch (or a kernel that cannot
launch) makes ``auto`` use the torch op for that kernel on that device, with one
warning. ``memgas_gpu.ops`` (which every native call goes through) and
``memgas_gpu.backend`` import this module, so the checks are registered before any op
runs and before any report, whatever is imported first.

* ``ppr``: a 96-node, 4-block graph with isolated nodes, 5 reset rows including an
  empty one; with and without blocks; to convergence and for exactly 7 and 8
  iterations (the odd count ends in the work buffer); int32 and int64 columns; max
  difference 1e-12.
* ``gmm1d``: 24 similarity-like rows of 30 points (the m <= 32 kernel) and of 40 (the
  other), float32 and float64, with a constant row, ties and short rows; the masks must
  agree except for at most one row per case differing in one point (the torch op's
  float64 sums on a GPU add in another order than the kernel, which can move a point
  that sits on the decision boundary).
"""
from __future__ import annotations

from typing import Dict, Optional, Union

import torch

from .. import _native
from . import _kernels
from .gmm1d import gmm1d_accept
from .ppr import personalized_pagerank

__all__ = ["backend", "ppr_self_check", "gmm1d_self_check"]

PPR_TOL = 1e-12


def _check_graph():
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
    reset = torch.rand(5, n, generator=g, dtype=torch.float64)
    reset[reset < 0.6] = 0
    reset[2] = 0  # an empty row
    return indptr, key % n, blocks, reset


def ppr_self_check(device: torch.device) -> Optional[str]:
    """The native PageRank against the torch op on ``device`` (None when they agree)."""
    indptr, indices, blocks, reset = (t.to(device) for t in _check_graph())
    bad = []
    for blk in (None, blocks):
        n_blocks = 1 if blk is None else int(blk.max()) + 1
        rt = reset.T.contiguous()
        total = (rt.sum(0, keepdim=True) if blk is None
                 else torch.zeros(n_blocks, rt.shape[1], dtype=rt.dtype,
                                  device=device).index_add_(0, blk, rt))
        total = torch.where(total > 0, total, torch.ones_like(total))
        r = rt / (total if blk is None else total[blk])
        for tol, max_iter in ((1e-10, 100), (0.0, 7), (0.0, 8)):
            ref = personalized_pagerank(indptr, indices, reset, tol=tol, max_iter=max_iter,
                                        blocks=blk, backend="torch")
            got32 = personalized_pagerank(indptr, indices, reset, tol=tol, max_iter=max_iter,
                                          blocks=blk, backend="native")
            got64 = _kernels.ppr(indptr, indices, r, blk, n_blocks, 0.1, tol, max_iter,
                                 narrow=False).T
            for name, got in (("int32", got32), ("int64", got64)):
                worst = float((got - ref).abs().max())
                if not worst <= PPR_TOL:
                    bad.append(f"{name} columns, {'blocks' if blk is not None else 'one block'},"
                               f" max_iter={max_iter}: max |native - torch| = {worst:.3g}")
    return _summary(bad)


def _summary(bad) -> Optional[str]:
    """The first mismatch, and how many more (one line)."""
    if not bad:
        return None
    return bad[0] + (f" (and {len(bad) - 1} more cases)" if len(bad) > 1 else "")


def gmm1d_self_check(device: torch.device) -> Optional[str]:
    """The native GMM against the torch op on ``device`` (None when they agree)."""
    g = torch.Generator().manual_seed(14)
    bad = []
    for m in (30, 40):
        hi = 0.6 + 0.1 * torch.rand(24, m // 3, generator=g)
        lo = 0.2 + 0.15 * torch.rand(24, m - m // 3, generator=g)
        rows = torch.cat([hi, lo], dim=1)
        rows = rows[:, torch.randperm(m, generator=g)]
        rows[0] = 0.5  # constant
        rows[1] = torch.randint(0, 3, (m,), generator=g).float() / 3  # ties
        valid = torch.arange(m)[None, :] < torch.randint(0, m + 1, (24, 1), generator=g)
        for dt in (torch.float32, torch.float64):
            x = rows.to(dtype=dt, device=device)
            v = valid.to(device)
            a = gmm1d_accept(x, v, backend="native")
            b = gmm1d_accept(x, v, backend="torch")
            per_row = (a != b).sum(dim=1)
            n_rows, most = int((per_row > 0).sum()), int(per_row.max())
            if n_rows > 1 or most > 1:
                bad.append(f"m={m} {dt}: {n_rows} rows differ (up to {most} points)")
    return _summary(bad)


_native.register_self_check("ppr", ppr_self_check)
_native.register_self_check("gmm1d", gmm1d_self_check)


def backend(device: Union[str, torch.device, None] = None, detail: bool = False
            ) -> Union[str, Dict[str, object]]:
    """What ``backend="auto"`` runs on ``device``, after the self-checks.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` (default:
            ``"cuda"`` when a GPU is available, else ``"cpu"``).
        detail: return a dict with every kernel's state instead of a string.

    Returns:
        ``"native-cpu"`` / ``"native-cuda"`` (every kernel native), ``"torch"`` (no
        extension, no kernels for the device, no CUDA device for ``"cuda"``,
        ``MEMGAS_BACKEND=torch``, or every kernel failed), or e.g. ``"native-cuda (torch for ppr)"``. On CUDA the pending
        self-checks run first. With ``detail``: ``{"backend": <that string>,
        "kernels": {op: "passed" | "failed: why" | "not checked"}}`` (CPU kernels are
        tested by the test suite, not checked at run time: "not checked").
    """
    kind = torch.device(device).type if device is not None else (
        "cuda" if torch.cuda.is_available() else "cpu")
    env = _native.env_backend()
    usable = (env != "torch" and _native.native_available(kind)
              and (kind != "cuda" or torch.cuda.is_available()))
    dev = device if device is not None else kind
    kernels = (_native.kernel_status(dev, run_checks=env == "auto") if usable
               else {op: "not checked" for op in _native.kernel_status(dev, False)})
    failed = [op for op, state in kernels.items() if state.startswith("failed")]
    if not usable or (kernels and len(failed) == len(kernels)):
        name = "torch"
    else:
        name = f"native-{kind}" + (f" (torch for {', '.join(failed)})" if failed else "")
    return {"backend": name, "kernels": kernels} if detail else name
