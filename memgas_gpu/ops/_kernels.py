"""Every native call of the ops, behind one wrapper per kernel.

As faiss's ``class_wrappers`` and pytorch_scatter do, the ops keep only their algorithm
and call one function here; what a raw-pointer kernel needs around it lives in this file:

* :func:`dispatch` picks the native kernel or the torch op (``backend``), runs the kernel
  under one error policy and falls back where that is safe;
* :func:`ppr`, :func:`gmm1d` and :func:`graph_topm` check device, dtype and ranges (on
  the values as given, before any narrowing), make every input contiguous in the
  kernel's dtype, keep those tensors alive until the call returns (a pointer into a
  freed temporary is memory the CUDA cache hands to the next allocation), allocate the
  outputs and scratch in torch's allocator, and call ``memgas_gpu._C``.

Error policy of :func:`dispatch` (``memgas_gpu._C`` raises its own classes, see
``csrc/common/errors.h``):

* ``ValueError`` (bad input): raised.
* Out of memory (``torch.OutOfMemoryError`` from the wrapper's buffers, or
  ``_C.CudaOutOfMemory``): torch's cached blocks are freed and the call is retried once;
  a second one is raised as ``torch.OutOfMemoryError``. The kernel stays enabled.
* A device fault while the kernel ran (``_C.CudaFault``: illegal address, launch
  failure): raised with a one-line hint, never a fallback (the CUDA context is unusable
  after one); an error that earlier CUDA work left (``_C.CudaPriorError``) is raised as
  not this kernel's.
* The kernel cannot run here (``_C.CudaUnavailable``: no kernel image for this GPU, a
  driver older than the runtime): with ``auto``, the kernel is disabled on that device
  (one warning) and the torch op runs; with ``native`` it is raised.
* Any other error (for example torch's own CUDA error while the wrapper prepares the
  call, left by earlier work): raised unchanged; the kernel stays enabled.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple, TypeVar

import torch
from torch import Tensor

from .. import _native
from .sparse import check_csr

__all__ = ["dispatch", "ppr", "gmm1d", "graph_topm", "GMM_MAX_M"]

T = TypeVar("T")
GMM_MAX_M = 128  # csrc/common/gmm1d_row.h: kGmmMaxM


def dispatch(op: str, device: torch.device, backend: str, native: Callable[[], T],
             fallback: Callable[[], T], *, covered: bool = True,
             uncovered: Optional[str] = None) -> T:
    """``native()`` when ``backend`` resolves to ``op``'s kernel on ``device``, else
    ``fallback()`` (the torch op), with the error policy of this module.

    Args:
        op: kernel name (``"ppr"``, ``"gmm1d"``, ``"graph"``).
        device: device of the op's tensors.
        backend: ``"auto"``, ``"native"`` or ``"torch"``.
        native: runs the kernel (through a wrapper of this module).
        fallback: runs the torch op.
        covered: whether the kernel covers these arguments.
        uncovered: why not, when ``covered`` is False: ``backend="native"`` (or
            ``MEMGAS_BACKEND=native``) then raises ValueError with it; None runs the
            torch op silently.
    """
    if not covered and uncovered is None:  # no kernel for these arguments: not an error
        return fallback()
    if _native.resolve(op, device, backend) != "native":
        return fallback()
    if not covered:
        if uncovered is not None and not _native.may_fall_back(backend):  # env too
            raise ValueError(f"the native {op} kernel {uncovered}")
        return fallback()
    try:
        return _with_retry(op, device, native)
    except _CannotRun as exc:
        if not _native.may_fall_back(backend):
            raise exc.__cause__ from None
        _native.disable(op, device, str(exc))
        return fallback()


class _CannotRun(Exception):
    """The kernel cannot run on this device (wraps the RuntimeError as ``__cause__``)."""


def _free_cached(device: torch.device) -> None:
    if torch.device(device).type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _with_retry(op: str, device: torch.device, native: Callable[[], T]) -> T:
    for attempt in (1, 2):
        try:
            return native()
        except ValueError:
            raise
        except (torch.OutOfMemoryError, MemoryError) as exc:  # _C.CudaOutOfMemory too
            if attempt == 1:
                _free_cached(device)
                continue
            raise torch.OutOfMemoryError(
                f"memgas_gpu: the native '{op}' kernel ran out of memory on {device} "
                f"again after freeing torch's cached blocks ({exc}); process fewer "
                "queries or rows per call") from exc
        except RuntimeError as exc:
            fault = getattr(_native.C, "CudaFault", None)
            prior = getattr(_native.C, "CudaPriorError", None)
            if fault is not None and isinstance(exc, fault):
                _native.disable(op, device, f"device fault: {exc}", warn=False)
                raise RuntimeError(
                    f"memgas_gpu: the native '{op}' kernel hit a device fault on "
                    f"{device} ({exc}); the CUDA context is unusable now, restart the "
                    "process; to find the cause rerun with CUDA_LAUNCH_BLOCKING=1 "
                    "(compute-sanitizer), or with MEMGAS_BACKEND=torch") from exc
            if prior is not None and isinstance(exc, prior):
                raise RuntimeError(
                    f"memgas_gpu: CUDA reported an error on {device} before the native "
                    f"'{op}' kernel ran, left by earlier work ({exc}); rerun with "
                    "CUDA_LAUNCH_BLOCKING=1 to find the operation that failed") from exc
            unavailable = getattr(_native.C, "CudaUnavailable", None)
            if unavailable is not None and isinstance(exc, unavailable):
                raise _CannotRun(f"{type(exc).__name__}: {exc}") from exc
            raise  # not the kernel's (e.g. torch's own CUDA error while preparing the call)
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ argument checks ----
def _on(device: torch.device, **tensors: Optional[Tensor]) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device}")


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` contiguous in ``dtype`` (the caller keeps the result alive for the call)."""
    return t.to(dtype).contiguous()


# ------------------------------------------------------------------ PageRank ----------
def ppr(indptr: Tensor, indices: Tensor, r: Tensor, blocks: Optional[Tensor], n_blocks: int,
        damping: float, tol: float, max_iter: int, *, narrow: bool = True) -> Tensor:
    """Native power iteration (``ppr_cpu`` / ``ppr_cuda``) of
    :func:`~memgas_gpu.ops.personalized_pagerank` on its prepared reset.

    Args:
        indptr, indices: CSR graph (int32 or int64 columns), on ``r``'s device.
        r: ``[n, Q]`` float64 node-major reset, normalised per (block, column).
        blocks: optional ``[n]`` block id per node in ``[0, n_blocks)``.
        n_blocks: number of blocks (1 without ``blocks``).
        damping, tol, max_iter: see the op.
        narrow: gather through int32 columns when ``n < 2**31`` (half the index
            traffic); False keeps int64 (the self-check covers both).

    Returns:
        ``[n, Q]`` float64 PageRank, node-major.
    """
    n, Q = r.shape
    dev = r.device
    _on(dev, indptr=indptr, indices=indices, blocks=blocks)
    if r.dtype != torch.float64:
        raise ValueError("the native ppr kernel computes in float64")
    if indptr.numel() != n + 1:
        raise ValueError(f"indptr has {indptr.numel()} entries, expected {n + 1}")
    check_csr(indptr, indices, n)  # on the values as given: nothing narrowed yet
    if max_iter < 0:
        raise ValueError(f"max_iter must be >= 0, got {max_iter}")
    small = narrow and n < 2 ** 31
    # every tensor whose pointer goes to the kernel is bound to a name until it returns
    ip = _as(indptr, torch.int64)
    ix = _as(indices, torch.int32 if small else torch.int64)
    rr = _as(r, torch.float64)
    blk = None if blocks is None else _as(blocks, torch.int64)
    out = torch.empty_like(rr)
    args = (ip.data_ptr(), ix.data_ptr(), ix.dtype == torch.int64, n, rr.data_ptr(), Q,
            0 if blk is None else blk.data_ptr(), n_blocks, float(damping), float(tol),
            int(max_iter), out.data_ptr())
    if _native.on_cuda(rr):
        n_work, n_iwork = _native.C.ppr_cuda_workspace(n, Q, n_blocks)
        work = torch.empty(n_work, dtype=torch.float64, device=dev)
        iwork = torch.empty(n_iwork, dtype=torch.int32, device=dev)
        with _native.cuda_stream(dev) as stream:
            _native.C.ppr_cuda(*args, work.data_ptr(), work.numel(), iwork.data_ptr(),
                               iwork.numel(), stream)
    else:
        _native.C.ppr_cpu(*args, _native.n_threads())
    return out


# ------------------------------------------------------------------ GMM ---------------
def gmm1d(xs: Tensor, n: Tensor, table: Tensor, params: Tuple[float, float, float, int,
                                                             float, int]) -> Tensor:
    """Native batched GMM (``gmm1d_cpu`` / ``gmm1d_cuda``) of
    :func:`~memgas_gpu.ops.gmm1d_accept` on rows sorted descending.

    Args:
        xs: ``[B, m]`` float32 or float64 rows sorted descending, zeros past ``n``.
        n: ``[B]`` valid count per row, in ``[0, m]``.
        table: ``[m + 1]`` int64 first k-means++ centre per row length.
        params: ``(eps, tol, reg_covar, max_iter, kmeans_tol, kmeans_max_iter)``.

    Returns:
        ``[B, m]`` bool accept mask in sorted order.
    """
    B, m = xs.shape
    dev = xs.device
    _on(dev, n=n, table=table)
    if xs.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"the native gmm1d kernel takes float32 or float64, got {xs.dtype}")
    if not 1 <= m <= GMM_MAX_M:
        raise ValueError(f"the native gmm1d kernel needs 1 <= m <= {GMM_MAX_M}, got {m}")
    if n.shape != (B,) or table.numel() != m + 1:
        raise ValueError(f"n must be [{B}] and table [{m + 1}]")
    if B and not bool(((n >= 0) & (n <= m)).all()):
        raise ValueError(f"gmm1d: valid counts must lie in [0, {m}]")
    x = xs.contiguous()
    nn = _as(n, torch.int64)
    tb = _as(table, torch.int64)
    out = torch.empty(B, m, dtype=torch.uint8, device=dev)
    args = (x.data_ptr(), x.dtype == torch.float64, nn.data_ptr(), tb.data_ptr(),
            out.data_ptr(), B, m, tuple(params))
    if _native.on_cuda(x):
        err = torch.zeros(1, dtype=torch.int32, device=dev)  # the kernel's row check
        with _native.cuda_stream(dev) as stream:
            _native.C.gmm1d_cuda(*args, err.data_ptr(), stream)
    else:
        _native.C.gmm1d_cpu(*args, _native.n_threads())
    return out.bool()


# ------------------------------------------------------------------ graph (CPU) -------
def graph_topm(sims: Tensor, ncand: Tensor, m: int, gmm: bool, table: Tensor,
               params: Tuple[float, float, float, int, float, int]) -> Tuple[Tensor, Tensor]:
    """Native fused top-``m`` + GMM per row (``graph_topm_cpu``) of
    :func:`~memgas_gpu.ops.association_edges`, CPU only.

    Args:
        sims: ``[R, W]`` float32/float64 similarities; row r's candidates are its
            first ``ncand[r]`` columns.
        ncand: ``[R]`` candidate counts in ``[0, W]``.
        m: candidates kept per row (``1 <= m <= 128``).
        gmm: GMM acceptance (else every finite candidate is accepted).
        table, params: see :func:`gmm1d`.

    Returns:
        ``(idx [R, m] int64, accept [R, m] bool)``: selected columns by decreasing
        similarity (-1 past the selection) and their accept mask.
    """
    R, W = sims.shape
    if sims.device.type != "cpu":
        raise ValueError("the native graph kernel runs on the CPU")
    if sims.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"sims must be float32 or float64, got {sims.dtype}")
    if not 1 <= m <= GMM_MAX_M:
        raise ValueError(f"the native graph kernel needs 1 <= m <= {GMM_MAX_M}, got {m}")
    if ncand.shape != (R,) or (R and not bool(((ncand >= 0) & (ncand <= W)).all())):
        raise ValueError(f"ncand must be [{R}] with values in [0, {W}]")
    s = sims.contiguous()
    nc = _as(ncand, torch.int64)
    tb = _as(table, torch.int64)
    idx = torch.empty(R, m, dtype=torch.int64)
    acc = torch.empty(R, m, dtype=torch.uint8)
    _native.C.graph_topm_cpu(s.data_ptr(), s.dtype == torch.float64, R, W, nc.data_ptr(), m,
                             gmm, tb.data_ptr(), tuple(params), idx.data_ptr(),
                             acc.data_ptr(), _native.n_threads())
    return idx, acc.bool()
