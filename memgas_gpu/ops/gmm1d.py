"""Batched 1-D two-component Gaussian mixture: the MemGAS edge-acceptance test.

MemGAS (write path, step 3) fits ``GaussianMixture(n_components=2, random_state=0)``
to the top-``m`` similarity scores of every new node and links the node to the
candidates of the component with the higher mean.  The reference fits one
scikit-learn model per node (~8 ms each); :func:`gmm1d_accept` runs the very same
algorithm for many rows at once as plain tensor code (CPU or CUDA), with per-row
convergence masks instead of a Python loop over rows.

The scikit-learn 1.x recipe reproduced here (checked against the installed source):

1. Points are the row's valid scores sorted **descending** (the reference takes
   candidates in ``np.argsort(sims)[::-1]`` order; only the order of *distinct* values
   matters below, so ties among equal scores are harmless).
2. ``KMeans(n_clusters=2, n_init=1, random_state=RandomState(0))`` on the centred data:
   k-means++ seeding consumes ``random_sample()`` = 0.5488135039273248 for the first
   centre (``choice(n, p=1/n)``, i.e. ``searchsorted(cumsum(p), u, side="right")``) and
   ``uniform(size=2)`` = (0.71518937, 0.60276338) for the ``2 + int(log 2) = 2`` local
   trials ``searchsorted(cumsum(d2), u * sum(d2))`` (clipped to ``n - 1``); the trial
   with the smaller potential ``sum(min(d2, dist^2))`` wins (first on ties).
3. Lloyd iterations: label = ``argmin_j (c_j^2 - 2 x c_j)`` (first on ties), centres =
   cluster means (an empty cluster sits on the largest one), stop when the labels
   repeat or when ``sum_j (c_j' - c_j)^2 <= 1e-4 * var(x)`` (max 300), then relabel.
4. EM (``tol=1e-3``, ``reg_covar=1e-6``, ``max_iter=100``): initial M-step from the hard
   labels with ``n_k = sum(resp) + 10 * eps`` and weights ``n_k / n``; then
   {E-step, M-step} until the mean log-likelihood changes by less than ``tol``; a final
   E-step; label = argmax of the weighted log-probability (first on ties).
5. Accept the points whose label equals ``argmax(means)`` (first on ties).

Precision (measured against scikit-learn 1.9 on float32 rows, see tests/test_gmm1d.py):
the reference passes float32 scores and scikit-learn keeps float32 throughout.

* k-means runs in the input dtype with scikit-learn's operation order (numpy's pairwise
  summation for the centring mean and the variance, sample-by-sample centre sums,
  ``c^2 - 2xc`` distances): on rows with tied values a point often sits exactly between
  two centres and only the same rounding gives the same label (float64 k-means matched
  90% of tied rows, this emulation 100%).
* EM runs in ``compute_dtype`` (float64 by default) with the input dtype's ``eps`` in
  ``n_k`` (``10 * eps`` is ~1.2e-6 for float32, which decides empty components). It
  matched as many rows as a float32 EM and is more accurate.

Remaining disagreements (about 1 row in 1,500 of random rows, none seen on
similarity-like rows): (a) EM runs whose mean log-likelihood change lands within float32
rounding of ``tol`` (e.g. 0.0009997 in float32 vs 0.001006 exactly), so one side does an
extra iteration; (b) degenerate rows whose spread is far below ``sqrt(reg_covar)`` (e.g.
1e-5 around 0.5): both fitted means coincide up to float32 rounding and scikit-learn's
``argmax(means_)`` is decided by the BLAS summation order (machine-dependent), so about
half of such rows differ.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

import torch
from torch import Tensor

from . import _kernels

__all__ = ["gmm1d_accept", "first_centre_table"]

# RandomState(0) draws consumed by KMeans' k-means++ seeding (see module docstring).
_U_FIRST = 0.5488135039273248
_U_TRIALS = (0.7151893663724195, 0.6027633760716439)
_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


@lru_cache(maxsize=64)
def first_centre_table(m: int) -> tuple:
    """Index of the first k-means++ centre for every row length ``n <= m``.

    ``numpy.random.RandomState.choice(n, p=w / w.sum())`` with float32 unit weights:
    ``p`` is cast to float64, ``cdf = cumsum(p) / cdf[-1]`` and the index is
    ``searchsorted(cdf, u, side="right")``.  Reproduced with Python floats (sequential
    sums, exactly as numpy's cumsum).
    """
    import struct

    out = [0] * (m + 1)
    for n in range(1, m + 1):
        p = struct.unpack("f", struct.pack("f", 1.0 / n))[0]  # float32(1/n)
        cdf, acc = [], 0.0
        for _ in range(n):
            acc += p
            cdf.append(acc)
        last = cdf[-1]
        cdf = [c / last for c in cdf]
        out[n] = min(sum(1 for c in cdf if c <= _U_FIRST), n - 1)
    return tuple(out)


def _centre_table(m: int, device: torch.device) -> Tensor:
    """:func:`first_centre_table` as an int64 tensor on ``device``."""
    return torch.tensor(first_centre_table(m), dtype=torch.int64, device=device)


def _np_sum(a: Tensor, n: Tensor) -> Tensor:
    """Row sums of ``a[:, :n]`` with numpy's float summation order (bit-exact).

    numpy reduces fewer than 8 elements sequentially; up to 128 elements with 8
    interleaved accumulators ``r_j = sum a[8i + j]`` over the first ``n - n % 8``
    elements, combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``, then
    the tail added one by one. Entries past ``n`` must be 0. Rows longer than 128 fall
    back to ``torch.sum`` (not bit-exact).
    """
    B, m = a.shape
    if m > 128:
        return a.sum(dim=1)
    n8 = torch.where(n >= 8, n - n % 8, torch.zeros_like(n))
    pos = torch.arange(m, device=a.device)
    r = torch.zeros(B, 8, dtype=a.dtype, device=a.device)
    for i in range(0, m, 8):
        blk = a[:, i:i + 8]
        k = blk.shape[1]
        take = (pos[i:i + k][None, :] < n8[:, None])
        r[:, :k] = torch.where(take, r[:, :k] + blk, r[:, :k])
    res = ((r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])) + ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))
    for i in range(m):
        take = (i >= n8) & (i < n)
        res = torch.where(take, res + a[:, i], res)
    return res


def _assign(x: Tensor, c0: Tensor, c1: Tensor) -> Tensor:
    """Lloyd E-step as scikit-learn computes it: ``c^2 - 2 x c`` (strict ``<``)."""
    d0 = c0 * c0 - 2.0 * (x * c0)
    d1 = c1 * c1 - 2.0 * (x * c1)
    return d1 < d0


def _kmeans_labels(x: Tensor, valid: Tensor, n: Tensor, max_iter: int, tol: float) -> Tensor:
    """scikit-learn ``KMeans(2, n_init=1, random_state=0).fit(x).labels_`` per row.

    Runs in ``x``'s dtype with scikit-learn's operation order (float32 for the
    reference), because k-means decisions on tied data (a point exactly between two
    centres) depend on the rounding of the centring and of the centre sums.

    Args:
        x: ``[B, m]`` points sorted descending; entries past ``n`` must be 0.
        valid: ``[B, m]`` bool, True on the first ``n`` entries of each row.
        n: ``[B]`` number of valid entries (>= 2).
        max_iter: Lloyd iterations (scikit-learn default 300).
        tol: relative tolerance (default 1e-4), scaled by the variance of x.

    Returns:
        ``[B, m]`` bool, True for cluster 1.
    """
    B, m = x.shape
    dt = x.dtype
    nf = n.to(dt)
    zero = torch.zeros((), dtype=dt, device=x.device)
    # tolerance = var(x) * tol, with numpy's float arithmetic
    mean = _np_sum(x, n) / nf
    dev = torch.where(valid, x - mean[:, None], zero)
    tol_abs = (_np_sum(dev * dev, n) / nf) * tol
    xc = dev  # KMeans centres the data (X -= X.mean(axis=0)); same numbers as above

    # --- k-means++ seeding (distances upcast to float64, as scikit-learn does) -------
    idx0 = _centre_table(m, x.device)[n]
    x64 = xc.double()
    c0 = x64.gather(1, idx0[:, None])
    d2 = torch.where(valid, ((x64 - c0) ** 2).to(dt), zero)
    pot = _np_sum(d2, n)[:, None].double()  # numpy's order, as scikit-learn's d2.sum()
    u = torch.tensor(_U_TRIALS, dtype=torch.float64, device=x.device)
    cand = torch.searchsorted(d2.double().cumsum(dim=1).to(dt).double().contiguous(),
                              (u[None, :] * pot).contiguous())
    cand = torch.minimum(cand, (n - 1)[:, None])  # [B, 2]
    xcand = x64.gather(1, cand)  # [B, 2]
    dcand = ((x64[:, None, :] - xcand[:, :, None]) ** 2).to(dt)
    pots = torch.where(valid[:, None, :], torch.minimum(d2[:, None, :], dcand), zero)
    pots = _np_sum(pots.reshape(2 * B, m), n.repeat_interleave(2)).view(B, 2)
    best = (pots[:, 1] < pots[:, 0]).long()
    c0 = xc.gather(1, idx0[:, None]).squeeze(1)
    c1 = xc.gather(1, cand.gather(1, best[:, None])).squeeze(1)

    # --- Lloyd -----------------------------------------------------------------------
    active = torch.ones(B, dtype=torch.bool, device=x.device)
    labels_old: Optional[Tensor] = None
    for it in range(max_iter):
        lab = _assign(xc, c0[:, None], c1[:, None]) & valid
        cnt1 = lab.sum(dim=1).to(dt)
        cnt0 = nf - cnt1
        # centre sums accumulate sample by sample (scikit-learn's chunk loop)
        s0 = torch.zeros(B, dtype=dt, device=x.device)
        s1 = torch.zeros(B, dtype=dt, device=x.device)
        for i in range(m):
            xi = xc[:, i]
            s1 = torch.where(lab[:, i], s1 + xi, s1)
            s0 = torch.where(valid[:, i] & ~lab[:, i], s0 + xi, s0)
        n0 = s0 * (1.0 / cnt0.clamp_min(1))
        n1 = s1 * (1.0 / cnt1.clamp_min(1))
        # an empty cluster is placed on the largest one (argmax: first on ties)
        n0 = torch.where(cnt0 > 0, n0, n1)
        n1 = torch.where(cnt1 > 0, n1, n0)
        sh0 = torch.sqrt((n0 - c0) * (n0 - c0))
        sh1 = torch.sqrt((n1 - c1) * (n1 - c1))
        shift = sh0 * sh0 + sh1 * sh1
        if labels_old is None:
            strict = torch.zeros_like(active)
        else:
            strict = (lab == labels_old).all(dim=1)
        c0 = torch.where(active, n0, c0)
        c1 = torch.where(active, n1, c1)
        done = strict | (shift <= tol_abs)
        labels_old = lab
        active = active & ~done
        if it % 4 == 3 and not bool(active.any()):
            break
    return _assign(xc, c0[:, None], c1[:, None]) & valid


def _m_step(x: Tensor, w: Tensor, r1: Tensor, eps: float, reg: float, n: Tensor,
            init: bool):
    r0 = (1.0 - r1) * w
    r1 = r1 * w
    nk0 = r0.sum(dim=1) + 10.0 * eps
    nk1 = r1.sum(dim=1) + 10.0 * eps
    mu0 = (r0 * x).sum(dim=1) / nk0
    mu1 = (r1 * x).sum(dim=1) / nk1
    v0 = (r0 * (x - mu0[:, None]) ** 2).sum(dim=1) / nk0 + reg
    v1 = (r1 * (x - mu1[:, None]) ** 2).sum(dim=1) / nk1 + reg
    denom = n.to(x.dtype) if init else nk0 + nk1
    return (nk0 / denom, nk1 / denom), (mu0, mu1), (v0, v1)


def _weighted_log_prob(x: Tensor, weights, means, variances):
    out = []
    for wk, mk, vk in zip(weights, means, variances):
        pc = 1.0 / torch.sqrt(vk)  # precision Cholesky factor (1-D)
        y = x * pc[:, None] - (mk * pc)[:, None]
        out.append(-0.5 * (_LOG_2PI + y * y) + torch.log(pc)[:, None] + torch.log(wk)[:, None])
    return out[0], out[1]


def _e_step(x: Tensor, w: Tensor, n: Tensor, params):
    a0, a1 = _weighted_log_prob(x, *params)
    mx = torch.maximum(a0, a1)
    mn = torch.minimum(a0, a1)
    # scikit-learn's _logsumexp for two columns
    lse = torch.where(mx == mn, mx + _LOG_2, mx + torch.log1p(torch.exp(mn - mx)))
    lower = (lse * w).sum(dim=1) / n.to(x.dtype)
    r1 = torch.exp(a1 - lse)
    return lower, r1, a0, a1


def gmm1d_accept(
    scores: Tensor,
    valid: Optional[Tensor] = None,
    *,
    tol: float = 1e-3,
    reg_covar: float = 1e-6,
    max_iter: int = 100,
    kmeans_tol: float = 1e-4,
    kmeans_max_iter: int = 300,
    compute_dtype: torch.dtype = torch.float64,
    backend: str = "auto",
) -> Tensor:
    """Accept mask of a 2-component 1-D Gaussian mixture, fitted row by row in one batch.

    For each row ``s`` it returns ``GaussianMixture(2, random_state=0).fit(s).predict(s)
    == argmax(means_)``: the MemGAS edge test "candidate j is linked when it belongs to
    the high-similarity component", ``z_j = argmax_k pi_k N(s_j | mu_k, sigma_k^2)``,
    accepted iff ``mu_{z_j} = max_k mu_k``.

    Args:
        scores: ``[B, m]`` similarity scores (any float dtype, any device). Order within a
            row does not matter (rows are sorted descending internally, as the reference).
        valid: optional ``[B, m]`` bool mask of real entries (rows shorter than ``m``).
            Non-finite scores (NaN, inf) are treated as invalid. Default: all valid.
        tol: EM convergence threshold on the mean log-likelihood (default 1e-3).
        reg_covar: added to each variance (default 1e-6).
        max_iter: EM iterations (default 100).
        kmeans_tol: k-means tolerance, relative to the variance of the row (default 1e-4).
        kmeans_max_iter: Lloyd iterations (default 300).
        compute_dtype: working precision (default float64; see the module docstring).
        backend: ``"auto"`` (default: the native kernel when built for the device, the
            row length is at most 128 and ``compute_dtype`` is float64), ``"native"``
            or ``"torch"`` (see :mod:`memgas_gpu._native`). Both give the same masks.

    Returns:
        ``[B, m]`` bool accept mask on the input positions. Invalid entries are False.
        Rows with fewer than 2 valid points (where scikit-learn would raise) accept all
        of their valid points.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be 2-D [B, m], got shape {tuple(scores.shape)}")
    B, m = scores.shape
    dev = scores.device
    if B == 0 or m == 0:
        return torch.zeros(B, m, dtype=torch.bool, device=dev)
    if m == 1:
        return torch.isfinite(scores) if valid is None else torch.isfinite(scores) & valid
    kd = scores.dtype if scores.dtype in (torch.float32, torch.float64) else torch.float32
    eps = torch.finfo(kd).eps
    ok = torch.isfinite(scores)
    if valid is not None:
        if valid.shape != scores.shape:
            raise ValueError(f"valid has shape {tuple(valid.shape)}, expected {(B, m)}")
        ok = ok & valid.to(device=dev, dtype=torch.bool)
    x = scores.to(kd)
    key = torch.where(ok, x, torch.full_like(x, -math.inf))
    xs, order = torch.sort(key, dim=1, descending=True, stable=True)
    n = ok.sum(dim=1)
    pos = torch.arange(m, device=dev)[None, :]
    valid_s = pos < n[:, None]
    xs = torch.where(valid_s, xs, torch.zeros_like(xs))
    params = (float(eps), float(tol), float(reg_covar), int(max_iter), float(kmeans_tol),
              int(kmeans_max_iter))
    acc_sorted = _kernels.dispatch(
        "gmm1d", dev, backend,
        native=lambda: _kernels.gmm1d(xs, n, _centre_table(m, dev), params),
        fallback=lambda: _fit_sorted(xs, n, params, compute_dtype),
        covered=m <= _kernels.GMM_MAX_M and compute_dtype == torch.float64,
        uncovered=f"needs m <= {_kernels.GMM_MAX_M} and compute_dtype=float64")
    out = torch.zeros(B, m, dtype=torch.bool, device=dev)
    out.scatter_(1, order, acc_sorted)
    return out


def _fit_sorted(xs: Tensor, n: Tensor, params, compute_dtype: torch.dtype) -> Tensor:
    """The torch op on rows sorted descending (zeros past ``n``): sorted accept mask."""
    eps, tol, reg_covar, max_iter, kmeans_tol, kmeans_max_iter = params
    B, m = xs.shape
    dev = xs.device
    pos = torch.arange(m, device=dev)[None, :]
    valid_s = pos < n[:, None]
    small = n < 2
    if bool(small.any()):  # give degenerate rows two dummy points; overridden below
        n = torch.where(small, torch.full_like(n, min(2, m)), n)
    valid_w = pos < n[:, None]

    lab = _kmeans_labels(xs, valid_w, n, kmeans_max_iter, kmeans_tol)

    xs = xs.to(compute_dtype)
    w_safe = valid_w.to(compute_dtype)
    n_safe = n
    params = _m_step(xs, w_safe, lab.to(compute_dtype), eps, reg_covar, n_safe, init=True)
    P = torch.stack([t for pair in params for t in pair])  # [6, B]: w0 w1 mu0 mu1 v0 v1
    lower = torch.full((B,), -math.inf, dtype=compute_dtype, device=dev)
    # EM on the rows still running: every few iterations the converged rows are
    # dropped from the working set (most rows converge in a handful of iterations)
    rows = torch.arange(B, device=dev)
    xa, wa, na, act = xs, w_safe, n_safe, torch.ones(B, dtype=torch.bool, device=dev)
    for it in range(max_iter):
        Pa = P[:, rows]
        pa = ((Pa[0], Pa[1]), (Pa[2], Pa[3]), (Pa[4], Pa[5]))
        new_lower, r1, _, _ = _e_step(xa, wa, na, pa)
        newP = torch.stack([t for pair in _m_step(xa, wa, r1, eps, reg_covar, na, init=False)
                            for t in pair])
        P[:, rows] = torch.where(act, newP, Pa)
        old_lower = lower[rows]
        lower[rows] = torch.where(act, new_lower, old_lower)
        act = act & ~((new_lower - old_lower).abs() < tol)
        if it % 4 == 3:
            if not bool(act.any()):
                break
            keep = torch.nonzero(act).flatten()
            rows, xa, wa, na, act = rows[keep], xa[keep], wa[keep], na[keep], act[keep]
    params = ((P[0], P[1]), (P[2], P[3]), (P[4], P[5]))
    _, _, a0, a1 = _e_step(xs, w_safe, n_safe, params)
    label1 = a1 > a0  # argmax, first on ties
    means = params[1]
    high1 = means[1] > means[0]  # argmax(means_), first on ties
    acc_sorted = (label1 == high1[:, None]) & valid_s
    return torch.where(small[:, None], valid_s, acc_sorted)
