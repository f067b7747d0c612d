"""Native kernels (memgas_gpu._C) == the torch ops: GMM masks identical, PPR within
1e-12, graph edges identical; CUDA == CPU when a GPU is present (marker ``gpu``).

Skipped when the extension is not built, except in CI (``CI=true``), where the README's
install command must have built it (unless ``MEMGAS_BUILD_NATIVE=0``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memgas_gpu.bench.data import index_from_nodes

from memgas_gpu import _native, backend
from memgas_gpu.ops.gmm1d import first_centre_table
from memgas_gpu.ops import (association_edges, build_association_graph, gmm1d_accept,
                            memgas_session_scores,
                            personalized_pagerank, symmetric_csr)

from _synth import conversation, gmm_rows, torch_single_thread  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
BUILT = _native.C is not None
REQUIRED = os.environ.get("CI") == "true" and os.environ.get("MEMGAS_BUILD_NATIVE") != "0"
native = pytest.mark.skipif(not BUILT, reason="memgas_gpu._C is not built")
CUDA = BUILT and torch.cuda.is_available() and _native.native_available("cuda")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA kernels and a GPU")


def test_extension_built_where_required():
    if REQUIRED:
        assert BUILT, f"CI must build memgas_gpu._C: {_native._IMPORT_ERROR}"
    assert backend("cpu") in (("native-cpu", "torch") if not REQUIRED else ("native-cpu",))


def test_backend_resolution(monkeypatch):
    with pytest.raises(ValueError):
        _native.resolve("gmm1d", "cpu", "fast")
    assert _native.resolve("gmm1d", "cpu", "torch") == "torch"
    monkeypatch.setenv("MEMGAS_BACKEND", "torch")
    _native._resolve.cache_clear()
    try:
        assert _native.resolve("gmm1d", "cpu") == "torch"
        assert backend("cpu") == "torch"
    finally:
        monkeypatch.delenv("MEMGAS_BACKEND")
        _native._resolve.cache_clear()
    assert _native.resolve("gmm1d", "cpu") == ("native" if BUILT else "torch")


def test_missing_native_raises_with_build_hint(monkeypatch):
    monkeypatch.setattr(_native, "C", None)
    _native._resolve.cache_clear()
    try:
        with pytest.raises(ImportError, match="MEMGAS_BUILD_NATIVE=1 pip install -e"):
            gmm1d_accept(torch.rand(3, 5), backend="native")
        assert gmm1d_accept(torch.rand(3, 5)).shape == (3, 5)  # auto: torch fallback
    finally:
        _native._resolve.cache_clear()


# ---------------------------------------------------------------- the build ------------
# CMakeLists.txt compiles csrc/cpu/*_cpu.cpp and, with CUDA, csrc/cuda/*_cuda.cu by glob
# (docs/native.md, "Adding a kernel"); the extension records what it compiled.
def _convention(folder: str, suffix: str) -> list:
    return sorted(p.relative_to(ROOT).as_posix()
                  for p in (ROOT / "csrc" / folder).glob(f"*{suffix}"))


def test_kernel_sources_follow_the_naming_convention():
    """A .cpp / .cu file under csrc/cpu or csrc/cuda that the glob would not pick up."""
    for folder, ext, suffix in (("cpu", ".cpp", "_cpu.cpp"), ("cuda", ".cu", "_cuda.cu")):
        odd = [p.name for p in (ROOT / "csrc" / folder).glob(f"*{ext}")
               if not p.name.endswith(suffix)]
        assert not odd, f"csrc/{folder}: {odd} are not compiled; name them <op>{suffix}"
    assert "csrc/cpu/ppr_cpu.cpp" in _convention("cpu", "_cpu.cpp")


@native
def test_every_kernel_source_is_compiled():
    expected = _convention("cpu", "_cpu.cpp")
    if _native.C.has_cuda:
        expected += _convention("cuda", "_cuda.cu")
    compiled = getattr(_native.C, "kernel_sources", None)  # None: built before it existed
    assert compiled is not None and sorted(compiled) == sorted(expected), (
        "memgas_gpu._C was not built from these sources (a stale build? rebuild with "
        "MEMGAS_BUILD_NATIVE=1 pip install -e .)")


# ---------------------------------------------------------------- gmm1d ----------------
def _same_masks(x, valid=None, device="cpu"):
    a = gmm1d_accept(x, valid, backend="torch")
    b = gmm1d_accept(x.to(device), None if valid is None else valid.to(device),
                     backend="native").cpu()
    bad = (a != b).any(dim=1)
    assert not bool(bad.any()), f"{int(bad.sum())} of {len(x)} rows differ: {x[bad][:3]}"


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1])
def test_gmm1d_identical_masks_five_kinds(dtype, seed):
    rows = torch.from_numpy(gmm_rows(3000, seed=seed)).to(dtype)
    rows = rows[:, torch.randperm(30, generator=torch.Generator().manual_seed(seed))]
    _same_masks(rows)


@native
def test_gmm1d_ties_near_constant_and_degenerate_rows():
    g = torch.Generator().manual_seed(5)
    ties = torch.randint(0, 3, (500, 30), generator=g).float() / 3
    const = torch.full((3, 30), 0.25)
    near = 0.5 + 1e-5 * torch.randn(500, 30, generator=g)
    _same_masks(torch.cat([ties, const, near]))
    s = torch.tensor([[0.9, float("nan"), 0.1, 0.88, 0.12, 0.11],
                      [0.5] + [float("nan")] * 5,
                      [float("nan")] * 6,
                      [float("inf"), 0.2, 0.1, 0.9, 0.8, 0.85]])
    _same_masks(s)
    assert gmm1d_accept(s, backend="native")[1].tolist() == [True] + [False] * 5


@native
def test_gmm1d_short_rows_and_lengths():
    rows = torch.from_numpy(gmm_rows(500, seed=7))
    lengths = torch.randint(0, 31, (500,), generator=torch.Generator().manual_seed(0))
    valid = torch.arange(30)[None, :] < lengths[:, None]
    _same_masks(torch.where(valid, rows, torch.full_like(rows, 9.0)), valid)
    for m in (2, 3, 8, 9, 64, 128):
        _same_masks(torch.randn(200, m, generator=torch.Generator().manual_seed(m)))


@native
def test_gmm1d_real_like_rows():
    E, s, _ = conversation(120, d=96, seed=3)
    sims = E @ E.T
    cand = torch.arange(len(E))[None, :] < (s * 4)[:, None]
    vals = torch.topk(torch.where(cand, sims, torch.tensor(-float("inf"))), 30, dim=1).values
    ok = torch.isfinite(vals)
    _same_masks(vals[ok.sum(1) > 0], ok[ok.sum(1) > 0])


@native
def test_gmm1d_native_limits():
    x = torch.randn(4, 129)
    assert torch.equal(gmm1d_accept(x), gmm1d_accept(x, backend="torch"))  # auto: torch
    with pytest.raises(ValueError, match="m <= 128"):
        gmm1d_accept(x, backend="native")


# ---------------------------------------------------------------- ppr ------------------
def _random_graph(n, per_block, deg, seed, isolated=0.1):
    g = torch.Generator().manual_seed(seed)
    blocks = torch.arange(n) // per_block
    src = torch.randint(0, n, (deg * n,), generator=g)
    dst = blocks[src] * per_block + torch.randint(0, per_block, (deg * n,), generator=g)
    dst = dst.clamp_max(n - 1)
    keep = (src % per_block) >= int(per_block * isolated)
    blocks = blocks.clamp_max(int(blocks[-1]))
    indptr, indices = symmetric_csr(torch.stack([src[keep], dst[keep]]), n)
    return indptr, indices, blocks, g


@native
@pytest.mark.parametrize("m", [30, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_row_code_run_on_the_cpu_equals_torch(m, dtype):
    """The CUDA kernel's instances of the row code (M = 32 / 128, EM responsibilities
    recomputed instead of kept, no per-thread arrays), compiled for the CPU
    (gmm1d_cpu(cuda_layout=True)): the same masks as the CPU kernel and the torch op."""
    g = torch.Generator().manual_seed(m)
    rows = torch.from_numpy(gmm_rows(2000, m=m, seed=m + 7)).to(dtype)
    xs = rows.sort(dim=1, descending=True).values
    n = torch.where(torch.rand(len(xs), generator=g) < 0.3,
                    torch.randint(0, m + 1, (len(xs),), generator=g), torch.full((len(xs),), m))
    valid = torch.arange(m)[None, :] < n[:, None]
    xs = torch.where(valid, xs, torch.zeros_like(xs))
    table = torch.tensor(first_centre_table(m), dtype=torch.int64)
    params = (float(torch.finfo(dtype).eps), 1e-3, 1e-6, 100, 1e-4, 300)
    masks = []
    for cuda_layout in (True, False):
        out = torch.empty(len(xs), m, dtype=torch.uint8)
        _native.C.gmm1d_cpu(xs.data_ptr(), dtype == torch.float64, n.data_ptr(),
                            table.data_ptr(), out.data_ptr(), len(xs), m, params, 1,
                            cuda_layout=cuda_layout)
        masks.append(out.bool())
    ref = gmm1d_accept(xs, valid, backend="torch")  # rows sorted: positions unchanged
    assert torch.equal(masks[0], ref) and torch.equal(masks[1], ref)


@native
@pytest.mark.parametrize("Q", [1, 3, 16, 37])
@pytest.mark.parametrize("use_blocks", [False, True])
def test_ppr_matches_torch(Q, use_blocks):
    indptr, indices, blocks, g = _random_graph(600, 100, 4, seed=Q)
    reset = torch.rand(Q, 600, generator=g, dtype=torch.float64)
    reset[reset < 0.9] = 0
    reset[0, :250] = 0  # empty blocks in row 0
    if Q > 2:
        reset[2] = 0  # an all-zero row
        reset[1, 5] = float("nan")
        reset[1, 6] = -1.0
    blk = blocks if use_blocks else None
    for max_iter in (1, 2, 100):
        a = personalized_pagerank(indptr, indices, reset, blocks=blk, max_iter=max_iter,
                                  backend="torch")
        b = personalized_pagerank(indptr, indices, reset, blocks=blk, max_iter=max_iter,
                                  backend="native")
        assert (a - b).abs().max() <= 1e-12
    one = personalized_pagerank(indptr, indices, reset[0], blocks=blk, backend="native")
    assert one.shape == (600,) and torch.allclose(one, b[0], atol=1e-15, rtol=0)


@native
@pytest.mark.parametrize("Q", [1, 3])
def test_ppr_row_split_across_threads_is_bitwise_identical(Q):
    """Fewer tiles than threads: one row is cut into node ranges at block boundaries
    (LongMemEval's one question per conversation). Same bits as one thread, and as the
    torch op to 1e-12; blocks of one node, dangling nodes and empty resets included."""
    g = torch.Generator().manual_seed(Q)
    sizes = torch.randint(1, 40, (120,), generator=g)
    sizes[::7] = 1  # single-node blocks (ranges of one node)
    blocks = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    n = int(sizes.sum())
    start = torch.cumsum(sizes, 0) - sizes
    src = torch.randint(0, n, (3 * n,), generator=g)
    b = blocks[src]
    dst = start[b] + (torch.rand(3 * n, generator=g) * sizes[b]).long()
    keep = (src % 5) != 0  # some nodes keep no edges: dangling
    indptr, indices = symmetric_csr(torch.stack([src[keep], dst[keep]]), n)
    reset = torch.rand(Q, n, generator=g, dtype=torch.float64)
    reset[reset < 0.7] = 0
    reset[0, : n // 3] = 0  # blocks with an empty reset
    old = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(personalized_pagerank(indptr, indices, reset, blocks=blocks,
                                              backend="native"))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    ref = personalized_pagerank(indptr, indices, reset, blocks=blocks, backend="torch")
    assert (outs[0] - ref).abs().max() <= 1e-12
    # a block split into two runs cannot be cut by range: same results, unsplit
    perm_blocks = blocks.clone()
    perm_blocks[blocks == 2] = 0  # block 0 now has two runs, with block 1 between them
    a = personalized_pagerank(indptr, indices, reset, blocks=perm_blocks, backend="native")
    r = personalized_pagerank(indptr, indices, reset, blocks=perm_blocks, backend="torch")
    assert (a - r).abs().max() <= 1e-12


@native
def test_ppr_one_node_graphs():
    for ip, ix in ((torch.tensor([0, 0]), torch.tensor([], dtype=torch.long)),
                   (torch.tensor([0, 1]), torch.tensor([0]))):  # isolated; self-loop
        r = torch.tensor([[2.0], [0.5]], dtype=torch.float64)
        a = personalized_pagerank(ip, ix, r, backend="native")
        b = personalized_pagerank(ip, ix, r, backend="torch")
        assert torch.equal(a, b) and torch.equal(a, torch.ones(2, 1, dtype=torch.float64))


@native
@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_ppr_validates_graph(device):
    """Bad graphs raise before the kernel reads through them (the wrapper checks on the
    values as given; the kernels check again: the CPU one on the host, the CUDA one on
    the device)."""
    def run(ip, ix, reset=torch.ones(2), blocks=None, backend="native"):
        t = lambda x: None if x is None else torch.tensor(x).to(device)  # noqa: E731
        return personalized_pagerank(t(ip), t(ix), reset.to(device), blocks=t(blocks),
                                     backend=backend)

    for ip, ix, match in (([0, 1, 2], [1, 5], "column index 5 out of range"),
                          ([0, 1, 2], [1, -1], "column index -1 out of range"),
                          ([0, 1, 2], [1], "indices has 1 entries"),
                          ([1, 1, 2], [0, 1], "indptr\\[0\\] must be 0"),
                          ([0, 2, 1], [1], "indptr decreases")):
        for be in ("native", "torch"):
            with pytest.raises(ValueError, match=match):
                run(ip, ix, backend=be)
    with pytest.raises(ValueError, match="block id out of range"):
        run([0, 1, 2], [1, 0], blocks=[0, -1])
    assert torch.equal(run([0, 1, 2], [1, 0], blocks=[0, 0]).cpu(),
                       personalized_pagerank(torch.tensor([0, 1, 2]), torch.tensor([1, 0]),
                                             torch.ones(2), backend="torch"))
    empty = personalized_pagerank(torch.tensor([0]).to(device),
                                  torch.tensor([], dtype=torch.int64).to(device),
                                  torch.ones(3, 0).to(device), backend="native")
    assert empty.shape == (3, 0)


# ---------------------------------------------------------------- graph + read path ----
@native
@pytest.mark.parametrize("accept", ["gmm", "all"])
def test_graph_identical_edges(accept):
    E1, s1, _ = conversation(150, d=64, seed=1)
    E2, s2, _ = conversation(90, d=64, seed=2)
    E, s = torch.cat([E1, E2]), torch.cat([s1, s2 + 150])
    conv = torch.cat([torch.zeros(len(E1)), torch.ones(len(E2))]).long()
    for dt in (torch.float32, torch.float64):
        a = build_association_graph(E.to(dt), s, conversation_of_node=conv, accept=accept,
                                    backend="torch")
        b = build_association_graph(E.to(dt), s, conversation_of_node=conv, accept=accept,
                                    backend="native")
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    ea = association_edges(E, s, first_node=len(E) - 8, conversation_of_node=conv,
                           backend="torch")
    eb = association_edges(E, s, first_node=len(E) - 8, conversation_of_node=conv,
                           backend="native")
    assert set(map(tuple, ea.T.tolist())) == set(map(tuple, eb.T.tolist()))


@native
def test_read_path_matches_torch():
    E, s, gr = conversation(60, d=64, seed=4)
    indptr, indices = build_association_graph(E, s)
    q = E[::17] + 0.1
    a = memgas_session_scores(q, E, s, gr, indptr, indices, backend="torch")
    b = memgas_session_scores(q, E, s, gr, indptr, indices, backend="native")
    assert (a - b).abs().max() <= 1e-12
    qc = torch.zeros(len(q), dtype=torch.int64)
    from memgas_gpu.retrieve import PRESETS, MemoryIndex, QueryBatch
    from memgas_gpu.retrieve.engine import score

    idx = index_from_nodes(E, [60], (indptr, indices))
    pa, _ = score(idx.snapshot(), QueryBatch(q, qc), PRESETS["memgas"], "cpu", backend="torch")
    pb, _ = score(idx.snapshot(), QueryBatch(q, qc), PRESETS["memgas"], "cpu", backend="native")
    assert (pa - pb).abs().max() <= 1e-12


def test_gpu_check_dry_run():
    """benchmarks/gpu_check.py end to end on the CPU with tiny sizes."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"),
                          "--dry-run"], capture_output=True, text=True, timeout=300)
    if not BUILT:
        pytest.skip("the dry run compares the native CPU kernels with torch")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "| gmm1d masks identical" in out.stdout and "FAIL" not in out.stdout


@native
def test_gpu_kernels_dry_run():
    """benchmarks/gpu_kernels.py (the kernel timings of gpu_suite.sh) on the CPU."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_kernels.py"),
                          "--dry-run"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == [
        "| gmm1d kernel, m=30", "| gmm1d kernel, m=100", "| ppr kernel, to convergence",
        "| ppr kernel, 100 iterations"]


@pytest.mark.gpu
@needs_cuda
# ---------------------------------------------------------------- CUDA vs CPU ----------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1])
def test_cuda_gmm1d_equals_cpu(dtype, seed):
    rows = torch.from_numpy(gmm_rows(5000, seed=seed)).to(dtype)
    a = gmm1d_accept(rows, backend="native")
    b = gmm1d_accept(rows.cuda(), backend="native").cpu()
    assert torch.equal(a, b)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("use_blocks", [False, True])
def test_cuda_ppr_equals_cpu(use_blocks):
    indptr, indices, blocks, g = _random_graph(3000, 300, 5, seed=9)
    reset = torch.rand(20, 3000, generator=g, dtype=torch.float64)
    reset[reset < 0.95] = 0
    reset[3] = 0
    blk = blocks if use_blocks else None
    a = personalized_pagerank(indptr, indices, reset, blocks=blk, backend="native")
    b = personalized_pagerank(indptr.cuda(), indices.cuda(), reset.cuda(),
                              blocks=None if blk is None else blk.cuda(), backend="native")
    assert (a - b.cpu()).abs().max() <= 1e-12


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_equals_cpu():
    """Same graph up to similarities that cuBLAS and the CPU BLAS round differently."""
    E, s, _ = conversation(120, d=64, seed=6)
    E = E.double()
    a = association_edges(E, s, backend="native")
    b = association_edges(E.cuda(), s.cuda(), backend="native").cpu()
    A, B = set(map(tuple, a.T.tolist())), set(map(tuple, b.T.tolist()))
    assert len(A ^ B) <= 0.001 * len(A | B)

