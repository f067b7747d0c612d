"""Native-call safety: strided inputs, the arguments the CUDA wrappers build, the CUDA
self-check with its fallback, and the error policy (out of memory, device faults,
errors left by earlier work), tested on the CPU with stand-in native modules (a
delegating one that reads the raw pointers back, a wrong one, a failing one).
"""
from __future__ import annotations

import contextlib
import ctypes
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from memgas_gpu import _native, backend
from memgas_gpu.ops import (association_edges, gmm1d_accept, personalized_pagerank,
                            symmetric_csr)

from _synth import conversation, gmm_rows, torch_single_thread  # noqa: F401

REAL_C = _native.C
# the ops with a CUDA kernel (csrc/cuda/<op>_cuda.cu): each needs a self-check
CUDA_OPS = sorted(p.name[:-len("_cuda.cu")] for p in
                  (Path(__file__).resolve().parents[1] / "csrc" / "cuda").glob("*_cuda.cu"))
native = pytest.mark.skipif(REAL_C is None, reason="memgas_gpu._C is not built")


def _graph(n=1000, per=100, deg=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks = torch.arange(n) // per
    src = torch.randint(0, n, (deg * n,), generator=g)
    dst = blocks[src] * per + torch.randint(0, per, (deg * n,), generator=g)
    dst = dst.clamp_max(n - 1)
    keep = src % 10 != 0  # some dangling nodes
    indptr, indices = symmetric_csr(torch.stack([src[keep], dst[keep]]), n)
    reset = torch.rand(3, n, generator=g, dtype=torch.float64)
    reset[reset < 0.8] = 0
    return indptr, indices, blocks, reset


def _strided(t: torch.Tensor) -> torch.Tensor:
    """Same values, every other element of a twice-as-large buffer (not contiguous)."""
    out = torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0]
    assert not out.is_contiguous() or t.numel() <= 1
    return out


# ------------------------------------------------------------ strided inputs ----------
@native
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_ppr_noncontiguous_graph_equals_contiguous(idx_dtype):
    indptr, indices, blocks, reset = _graph()
    indices = indices.to(idx_dtype)
    for blk in (None, blocks):
        ref = personalized_pagerank(indptr, indices, reset, blocks=blk, backend="native")
        got = personalized_pagerank(_strided(indptr), _strided(indices), _strided(reset),
                                    blocks=None if blk is None else _strided(blk),
                                    backend="native")
        assert torch.equal(ref, got)
        tor = personalized_pagerank(indptr, indices, reset, blocks=blk, backend="torch")
        assert (ref - tor).abs().max() <= 1e-12


@native
@pytest.mark.slow
def test_ppr_noncontiguous_large_graph_in_subprocess():
    """n = 5M: freed temporaries of this size go back to the OS (SIGSEGV before the fix)."""
    code = textwrap.dedent("""
        import torch
        from memgas_gpu.ops import personalized_pagerank
        n = 5_000_000
        ip = torch.arange(n + 1) * 2
        nxt = (torch.arange(n) + 1) % n
        prv = (torch.arange(n) - 1) % n
        ix = torch.stack([torch.minimum(nxt, prv), torch.maximum(nxt, prv)], 1).flatten()
        r = torch.zeros(n, dtype=torch.float64); r[::1000] = 1
        for dt in (torch.int64, torch.int32):
            a = personalized_pagerank(ip, ix.to(dt), r, max_iter=3, backend="native")
            ip_nc = torch.stack([ip, ip], 1)[:, 0]
            ix_nc = torch.stack([ix.to(dt), ix.to(dt)], 1)[:, 0]
            b = personalized_pagerank(ip_nc, ix_nc, r, max_iter=3, backend="native")
            assert torch.equal(a, b), dt
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]


@native
def test_gmm1d_and_graph_noncontiguous_equal_contiguous():
    rows = torch.from_numpy(gmm_rows(400, seed=3))
    valid = torch.rand(rows.shape, generator=torch.Generator().manual_seed(1)) < 0.9
    for dt in (torch.float32, torch.float64):
        x = rows.to(dt)
        ref = gmm1d_accept(x, valid, backend="native")
        assert torch.equal(ref, gmm1d_accept(_strided(x), _strided(valid), backend="native"))
        assert torch.equal(ref, gmm1d_accept(x.T.contiguous().T, valid, backend="native"))
    E, s, _ = conversation(80, d=32, seed=2)
    ref = association_edges(E, s, backend="native")
    got = association_edges(E.T.contiguous().T, _strided(s), backend="native")
    assert torch.equal(ref, got)


# ------------------------------------------------------------ stand-in modules --------
def _read(ptr: int, ctype, count: int) -> list:
    return list((ctype * count).from_address(ptr))


class _StandIn:
    """A native module whose CUDA entry points run the real CPU kernels on the same
    pointers (so the CUDA wrappers' arguments can be checked on the CPU)."""

    has_cuda = True

    def __init__(self, corrupt_ppr=False, raise_ppr=None, times=None):
        self.calls = []
        self.corrupt_ppr = corrupt_ppr  # True, or a predicate of the call's arguments
        self.raise_ppr = raise_ppr
        self.times = times  # raise only on the first `times` calls (None: always)
        self.ppr_calls = 0

    def __getattr__(self, name):
        return getattr(REAL_C, name)

    def ppr_cpu(self, *args):
        self.ppr_calls += 1
        if self.raise_ppr is not None and (self.times is None or self.ppr_calls <= self.times):
            raise self.raise_ppr
        REAL_C.ppr_cpu(*args)
        corrupt = self.corrupt_ppr(*args) if callable(self.corrupt_ppr) else self.corrupt_ppr
        if corrupt:  # a wrong kernel: every score off by 1e-6
            n, Q, out = args[3], args[5], args[11]
            buf = (ctypes.c_double * (n * Q)).from_address(out)
            for k in range(n * Q):
                buf[k] += 1e-6

    def ppr_cuda(self, *args):
        # read the inputs while the call runs: the wrapper's buffers must be alive now
        ip, ix, idx64, n, r, Q, blk = args[:7]
        indptr = _read(ip, ctypes.c_int64, n + 1)
        seen = {"indptr": indptr, "r": _read(r, ctypes.c_double, n * Q),
                "indices": _read(ix, ctypes.c_int64 if idx64 else ctypes.c_int32, indptr[-1]),
                "blocks": _read(blk, ctypes.c_int64, n) if blk else None}
        self.calls.append(("ppr_cuda", args, seen))
        self.ppr_cpu(*args[:12], 1)

    def gmm1d_cpu(self, *args, **kwargs):
        REAL_C.gmm1d_cpu(*args, **kwargs)
        B, m, out = args[5], args[6], args[4]
        buf = (ctypes.c_uint8 * (B * m)).from_address(out)
        for row, point in self.flip_gmm:  # a kernel that decides these points otherwise
            buf[row * m + point] ^= 1

    flip_gmm = ()

    def gmm1d_cuda(self, *args):
        xs, is_double, n, table, out, B, m = args[:7]
        seen = {"x": _read(xs, ctypes.c_double if is_double else ctypes.c_float, B * m),
                "n": _read(n, ctypes.c_int64, B), "err": _read(args[8], ctypes.c_int32, 1)}
        self.calls.append(("gmm1d_cuda", args, seen))
        REAL_C.gmm1d_cpu(*args[:8], 1)


@pytest.fixture
def stand_in(monkeypatch):
    """Install a stand-in native module; fresh backend caches and self-check state."""
    guards = []

    @contextlib.contextmanager
    def fake_stream(device):
        guards.append(torch.device(device))
        yield 12345

    def install(fake, cuda_path=False, check_cpu=False):
        monkeypatch.setattr(_native, "C", fake)
        monkeypatch.setattr(_native, "_STATUS", {})
        if check_cpu:
            monkeypatch.setattr(_native, "_CHECK_KINDS", {"cpu", "cuda"})
        if cuda_path:
            monkeypatch.setattr(_native, "on_cuda", lambda t: True)
            monkeypatch.setattr(_native, "cuda_stream", fake_stream)
        _native._resolve.cache_clear()
        return guards

    yield install
    _native._resolve.cache_clear()


@native
def test_cuda_ppr_wrapper_arguments(stand_in):
    fake = _StandIn()
    guards = stand_in(fake, cuda_path=True)
    indptr, indices, blocks, reset = _graph(n=300, per=50)
    got = personalized_pagerank(_strided(indptr), _strided(indices), reset, blocks=blocks,
                                backend="native")
    (name, args, seen), = fake.calls
    (ip, ix, idx64, n, r, Q, blk, nb, d, tol, it, out, work, wlen, iwork, ilen, stream) = args
    assert (n, Q, nb, idx64) == (300, 3, 6, False)  # int32 columns for a small graph
    assert seen["indptr"] == indptr.tolist()  # alive during the call, contiguous int64
    assert seen["indices"] == indices.tolist() and seen["blocks"] == blocks.tolist()
    total = torch.zeros(nb, Q, dtype=torch.float64).index_add_(0, blocks, reset.T)
    rn = reset.T / total[blocks]
    torch.testing.assert_close(torch.tensor(seen["r"], dtype=torch.float64).view(n, Q), rn,
                               rtol=1e-15, atol=0)
    # workspace of the kernel's layout: p, y[2] of [n, Q], 1/deg [n], 3 x [nb, Q];
    # flags [nb, Q] + two counters + the graph-check error flag
    assert wlen == 3 * n * Q + n + 3 * nb * Q and ilen == nb * Q + 3
    assert stream == 12345 and guards == [reset.device]
    ref = personalized_pagerank(indptr, indices, reset, blocks=blocks, backend="torch")
    assert (got - ref).abs().max() <= 1e-12


@native
def test_cuda_gmm1d_wrapper_arguments(stand_in):
    fake = _StandIn()
    guards = stand_in(fake, cuda_path=True)
    x = torch.from_numpy(gmm_rows(50, seed=4)).double()
    got = gmm1d_accept(_strided(x), backend="native")
    (name, args, seen), = fake.calls
    xs, is_double, n, table, out, B, m, params, err, stream = args
    assert (is_double, B, m, stream) == (True, 50, 30, 12345) and guards == [x.device]
    assert seen["n"] == [30] * 50 and seen["err"] == [0]  # zeroed error flag
    rows = torch.tensor(seen["x"], dtype=torch.float64).view(B, m)  # contiguous float64
    assert torch.equal(rows, x.sort(dim=1, descending=True).values)
    assert torch.equal(got, gmm1d_accept(x, backend="torch"))


@native
def test_self_check_wrong_kernel_falls_back_once(stand_in):
    stand_in(_StandIn(corrupt_ppr=True), check_cpu=True)
    indptr, indices, blocks, reset = _graph(n=200, per=50)
    ref = personalized_pagerank(indptr, indices, reset, blocks=blocks, backend="torch")
    with pytest.warns(RuntimeWarning, match="kernel 'ppr' failed"):
        got = personalized_pagerank(indptr, indices, reset, blocks=blocks)
    assert torch.equal(got, ref)  # the torch op from then on
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert torch.equal(personalized_pagerank(indptr, indices, reset, blocks=blocks), ref)
    info = backend("cpu", detail=True)
    assert info["kernels"]["ppr"].startswith("failed: self-check: int32 columns")
    assert "max |native - torch| = 1e-06" in info["kernels"]["ppr"]
    assert info["backend"] == "native-cpu (torch for ppr)"
    assert info["kernels"]["gmm1d"] == "passed"  # the real kernel behind the stand-in
    # an explicit backend="native" is not redirected
    wrong = personalized_pagerank(indptr, indices, reset, blocks=blocks, backend="native")
    assert not torch.equal(wrong, ref)


@native
def test_kernel_that_cannot_launch_falls_back(stand_in):
    fake = _StandIn(raise_ppr=REAL_C.CudaUnavailable(
        "ppr_cuda: step launch: cudaErrorNoKernelImageForDevice (no kernel image is "
        "available for execution on the device)"))
    stand_in(fake, check_cpu=True)
    indptr, indices, blocks, reset = _graph(n=200, per=50)
    with pytest.warns(RuntimeWarning, match="no kernel image"):
        got = personalized_pagerank(indptr, indices, reset)
    assert torch.equal(got, personalized_pagerank(indptr, indices, reset, backend="torch"))
    with pytest.raises(RuntimeError, match="no kernel image"):
        personalized_pagerank(indptr, indices, reset, backend="native")


@native
def test_other_errors_are_not_the_kernels(stand_in):
    """torch's own CUDA error while the wrapper prepares the call (an earlier fault
    surfacing in a torch op) is raised unchanged: no fallback, the kernel stays on."""
    err = RuntimeError("CUDA error: an illegal memory access was encountered")
    stand_in(_StandIn(raise_ppr=err))
    indptr, indices, blocks, reset = _graph(n=200, per=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="^CUDA error: an illegal memory access"):
            personalized_pagerank(indptr, indices, reset)
    assert _native.kernel_status("cpu", run_checks=False)["ppr"] == "not checked"


@native
def test_failure_after_a_passed_check_falls_back(stand_in):
    fake = _StandIn()
    stand_in(fake, check_cpu=True)
    indptr, indices, blocks, reset = _graph(n=200, per=50)
    personalized_pagerank(indptr, indices, reset)  # self-check passes
    assert backend("cpu", detail=True)["kernels"]["ppr"] == "passed"
    fake.raise_ppr = REAL_C.CudaUnavailable("ppr_cuda: entry: cudaErrorInsufficientDriver "
                                            "(CUDA driver version is insufficient)")
    with pytest.warns(RuntimeWarning, match="insufficient"):
        got = personalized_pagerank(indptr, indices, reset)
    assert torch.equal(got, personalized_pagerank(indptr, indices, reset, backend="torch"))
    assert backend("cpu", detail=True)["kernels"]["ppr"].startswith("failed")


# ------------------------------------------------------------ error policy ------------
@native
@pytest.mark.parametrize("oom", [torch.OutOfMemoryError("CUDA out of memory. Tried to "
                                                        "allocate 2.00 GiB"),
                                 "CudaOutOfMemory"])
def test_out_of_memory_is_not_a_kernel_failure(stand_in, monkeypatch, oom):
    """One out-of-memory: cached blocks freed, one retry, the kernel's result; two: raised
    as torch.OutOfMemoryError. Either way the kernel stays enabled for the next call."""
    from memgas_gpu.ops import _kernels

    if isinstance(oom, str):
        oom = getattr(REAL_C, oom)("ppr_cuda: memset: cudaErrorMemoryAllocation")
    freed = []
    monkeypatch.setattr(_kernels, "_free_cached", lambda device: freed.append(device))
    indptr, indices, blocks, reset = _graph(n=200, per=50)
    ref = personalized_pagerank(indptr, indices, reset, blocks=blocks, backend="native")
    fake = _StandIn(raise_ppr=oom, times=1)
    stand_in(fake)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "kernel failed" warning
        got = personalized_pagerank(indptr, indices, reset, blocks=blocks)
    assert torch.equal(got, ref) and fake.ppr_calls == 2 and len(freed) == 1
    fake.ppr_calls, fake.times = 0, 2
    with pytest.raises(torch.OutOfMemoryError, match="ran out of memory .* again"):
        personalized_pagerank(indptr, indices, reset, blocks=blocks)
    assert fake.ppr_calls == 2 and len(freed) == 2
    assert _native.kernel_status("cpu", run_checks=False)["ppr"] == "not checked"
    fake.times = 0  # no more failures: the next call runs the kernel again
    assert torch.equal(personalized_pagerank(indptr, indices, reset, blocks=blocks), ref)
    assert fake.ppr_calls == 3


@native
@pytest.mark.parametrize("cls, message, match, state", [
    ("CudaFault", "ppr_cuda: sync: cudaErrorIllegalAddress (an illegal memory access was "
     "encountered)", "device fault .*illegal memory access.* restart the process.*"
     "CUDA_LAUNCH_BLOCKING=1", "failed: device fault"),
    ("CudaPriorError", "ppr_cuda: error left by earlier CUDA work: cudaErrorIllegalAddress",
     "before the native 'ppr' kernel ran, left by earlier work", "not checked"),
], ids=["fault", "earlier-work"])
def test_cuda_faults_are_raised_with_a_hint_not_a_fallback(stand_in, cls, message, match,
                                                           state):
    """A fault in the kernel: raised with the hint (the context is lost; no torch result);
    an error left by earlier work: raised as not the kernel's, which stays enabled."""
    stand_in(_StandIn(raise_ppr=getattr(REAL_C, cls)(message)))
    indptr, indices, blocks, reset = _graph(n=200, per=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "using the torch op from now on"
        with pytest.raises(RuntimeError, match=match):
            personalized_pagerank(indptr, indices, reset)
    assert _native.kernel_status("cpu", run_checks=False)["ppr"].startswith(state)


# ------------------------------------------------------------ self-check coverage ------
@native
@pytest.mark.parametrize("wrong_when, named", [
    (lambda *a: a[2], "int64 columns"),           # only the int64-index instantiation
    (lambda *a: a[10] % 2 == 1, "max_iter=7"),    # only odd iteration counts
    (lambda *a: a[6] != 0, "blocks, max_iter"),   # only with blocks
], ids=["int64-only", "odd-only", "blocks-only"])
def test_self_check_covers_index_width_odd_counts_and_blocks(stand_in, wrong_when, named):
    stand_in(_StandIn(corrupt_ppr=wrong_when), check_cpu=True)
    with pytest.warns(RuntimeWarning, match="kernel 'ppr' failed"):
        info = backend("cpu", detail=True)
    assert info["kernels"]["ppr"].startswith("failed: self-check") and named in \
        info["kernels"]["ppr"], info
    assert info["backend"] == "native-cpu (torch for ppr)"


def test_self_check_state_is_per_device_index(monkeypatch):
    monkeypatch.setattr(_native, "_STATUS", {})
    assert _native.device_key("cuda:1") == "cuda:1" and _native.device_key("cpu") == "cpu"
    with pytest.warns(RuntimeWarning, match="cuda:1 kernel 'ppr' failed"):
        _native.disable("ppr", "cuda:1", "self-check: max |native - torch| = 1")
    assert _native.kernel_status("cuda:1", run_checks=False)["ppr"].startswith("failed")
    assert _native.kernel_status("cuda:0", run_checks=False)["ppr"] == "not checked"


def test_self_checks_registered_whatever_is_imported_first():
    """backend(detail=True) must not depend on what was imported before it: the package
    alone, its low-level native module, or the ops; and every CUDA kernel
    (csrc/cuda/<op>_cuda.cu) has a self-check."""
    for first in ("import memgas_gpu", "import memgas_gpu._native", "import memgas_gpu.ops"):
        code = (f"{first}\nfrom memgas_gpu import backend\n"
                "print(sorted(backend('cpu', detail=True)['kernels']))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split("\n")[0] == str(CUDA_OPS), (first, out.stdout)


@native
@pytest.mark.parametrize("flips, passes", [([(5, 3)], True),
                                           ([(5, 3), (6, 3)], False),
                                           ([(5, 3), (5, 4)], False)],
                         ids=["one-point", "two-rows", "two-points"])
def test_gmm1d_self_check_tolerates_one_boundary_point_only(stand_in, flips, passes):
    """A point on the decision boundary may go either way when torch sums in another
    order: one differing point passes; a second row or point is a wrong kernel."""
    fake = _StandIn()
    fake.flip_gmm = tuple(flips)
    stand_in(fake, check_cpu=True)
    if passes:
        assert backend("cpu", detail=True)["kernels"]["gmm1d"] == "passed"
    else:
        with pytest.warns(RuntimeWarning, match="kernel 'gmm1d' failed"):
            state = backend("cpu", detail=True)["kernels"]["gmm1d"]
        assert state.startswith("failed: self-check: m=30")


# ------------------------------------------------------------ MEMGAS_BACKEND ----------
# docs/native.md: MEMGAS_BACKEND=torch (or native) replaces "auto"; backend="native" and
# MEMGAS_BACKEND=native never fall back; an unknown value is an error naming the variable.
class _NoKernels:
    """An extension whose every kernel fails the test when it is called."""

    has_cuda = False

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def kernel(*args, **kwargs):
            self.calls.append(name)
            raise AssertionError(f"native kernel {name} called")
        return kernel


class _Counting:
    """The real extension, counting the calls of each kernel."""

    def __init__(self):
        self.calls = {}

    def __getattr__(self, name):
        real = getattr(REAL_C, name)
        if not name.endswith(("_cpu", "_cuda")):
            return real

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return real(*args, **kwargs)
        return counted


def _ops_inputs():
    indptr, indices, _, reset = _graph(n=200, per=50)
    E, s, _ = conversation(24, d=16, seed=4)
    return torch.from_numpy(gmm_rows(40, seed=2)), (indptr, indices, reset), (E, s)


def _run_ops(backend=None):
    """gmm1d, ppr and graph ops with the default backend ("auto"), or ``backend``."""
    kw = {} if backend is None else {"backend": backend}
    x, (indptr, indices, reset), (E, s) = _ops_inputs()
    return (gmm1d_accept(x, **kw), personalized_pagerank(indptr, indices, reset, **kw),
            association_edges(E, s, m=8, skip_sessions=1, **kw))


def test_memgas_backend_native_without_the_extension_raises(stand_in, monkeypatch):
    """No extension (or none for the device): each op raises ImportError with the build
    command instead of running its torch op; without the variable they fall back."""
    monkeypatch.setenv("MEMGAS_BACKEND", "native")
    stand_in(None)
    x, (indptr, indices, reset), (E, s) = _ops_inputs()
    for call in (lambda: gmm1d_accept(x),
                 lambda: personalized_pagerank(indptr, indices, reset),
                 lambda: association_edges(E, s, m=8, skip_sessions=1)):
        with pytest.raises(ImportError, match="MEMGAS_BUILD_NATIVE=1 pip install -e"):
            call()
    # an extension without CUDA kernels, asked for a CUDA device
    stand_in(_NoKernels())
    with pytest.raises(ImportError, match="built without CUDA kernels"):
        _native.resolve("ppr", "cuda")
    monkeypatch.delenv("MEMGAS_BACKEND")
    stand_in(None)
    torch_ops = _run_ops("torch")
    for got, want in zip(_run_ops(), torch_ops):
        assert torch.equal(got, want)


def test_memgas_backend_torch_never_calls_a_kernel(stand_in, monkeypatch):
    """MEMGAS_BACKEND=torch rules the extension out: an extension whose kernels fail when
    called is never reached, and the ops give the torch op's results."""
    want = _run_ops("torch")
    fake = _NoKernels()
    stand_in(fake)
    with pytest.raises(AssertionError, match="native kernel gmm1d_cpu called"):
        _run_ops()  # the stand-in is what "auto" would run
    fake.calls.clear()
    monkeypatch.setenv("MEMGAS_BACKEND", "torch")
    stand_in(fake)
    for got, ref in zip(_run_ops(), want):
        assert torch.equal(got, ref)
    assert fake.calls == []
    assert backend("cpu") == "torch"


@pytest.mark.parametrize("value", ["fast", "cuda", "nativ"])
def test_an_unknown_memgas_backend_is_an_error_naming_it(stand_in, monkeypatch, value):
    monkeypatch.setenv("MEMGAS_BACKEND", value)
    stand_in(_NoKernels())
    with pytest.raises(ValueError, match=f"MEMGAS_BACKEND .*{value!r}"):
        gmm1d_accept(torch.rand(3, 6))


@native
def test_memgas_backend_native_runs_the_kernels(stand_in, monkeypatch):
    """With the extension built, MEMGAS_BACKEND=native runs each op's kernel (counted),
    whose results are the torch op's."""
    want = _run_ops("torch")
    monkeypatch.setenv("MEMGAS_BACKEND", "native")
    fake = _Counting()
    stand_in(fake)
    masks, p, edges = _run_ops()
    assert torch.equal(masks, want[0])
    assert (p - want[1]).abs().max() <= 1e-12
    assert set(map(tuple, edges.T.tolist())) == set(map(tuple, want[2].T.tolist()))
    assert fake.calls.get("gmm1d_cpu", 0) >= 1 and fake.calls.get("ppr_cpu", 0) == 1
    assert fake.calls.get("graph_topm_cpu", 0) >= 1


@native
def test_memgas_backend_native_never_falls_back(stand_in, monkeypatch):
    """Where "auto" would quietly run the torch op, MEMGAS_BACKEND=native does not: a
    kernel that cannot launch raises (no warning), a kernel the self-check would reject
    or one recorded as failed still runs, arguments the kernel does not cover raise."""
    indptr, indices, _, reset = _graph(n=200, per=50)
    ref = personalized_pagerank(indptr, indices, reset, backend="torch")
    monkeypatch.setenv("MEMGAS_BACKEND", "native")
    stand_in(_StandIn(raise_ppr=REAL_C.CudaUnavailable(
        "ppr_cuda: step launch: cudaErrorNoKernelImageForDevice")), check_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="NoKernelImage"):
            personalized_pagerank(indptr, indices, reset)
    # a wrong kernel: the self-check would send "auto" to the torch op, native runs it
    wrong = _StandIn(corrupt_ppr=True)
    stand_in(wrong, check_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = personalized_pagerank(indptr, indices, reset)
    assert wrong.ppr_calls == 1 and 0 < float((got - ref).abs().max()) < 2e-6
    # a kernel recorded as failed on this device: "auto" runs torch, native the kernel
    fake = _StandIn()
    stand_in(fake, check_cpu=True)
    _native.disable("ppr", "cpu", "recorded by the test", warn=False)
    personalized_pagerank(indptr, indices, reset)
    assert fake.ppr_calls == 1
    monkeypatch.delenv("MEMGAS_BACKEND")
    stand_in(fake, check_cpu=True)
    _native.disable("ppr", "cpu", "recorded by the test", warn=False)
    assert torch.equal(personalized_pagerank(indptr, indices, reset), ref)
    assert fake.ppr_calls == 1
    # arguments the kernels do not cover: "auto" runs torch, native raises
    x = torch.randn(4, 129)
    assert torch.equal(gmm1d_accept(x), gmm1d_accept(x, backend="torch"))
    monkeypatch.setenv("MEMGAS_BACKEND", "native")
    stand_in(_StandIn())
    with pytest.raises(ValueError, match="m <= 128"):
        gmm1d_accept(x)
    with pytest.raises(ValueError, match="computes in float64"):
        personalized_pagerank(indptr, indices, reset, dtype=torch.float32)
