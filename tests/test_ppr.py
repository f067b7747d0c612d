"""personalized_pagerank: hand-checked cases, blocks mode, parity with igraph prpack."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from memgas_gpu.ops import personalized_pagerank, symmetric_csr

from _synth import torch_single_thread  # noqa: F401

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _random_graph(n: int, n_edges: int, n_isolated: int, seed: int):
    rng = np.random.default_rng(seed)
    e = rng.integers(0, n, (n_edges, 2))
    iso = rng.choice(n, n_isolated, replace=False)
    e = e[(e[:, 0] != e[:, 1]) & ~np.isin(e, iso).any(axis=1)]
    e = np.unique(np.sort(e, axis=1), axis=0)
    indptr, indices = symmetric_csr(torch.from_numpy(e.T.copy()), n)
    return e, indptr, indices, iso


def _resets(n: int, q: int, iso, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    R = rng.random((q, n))
    R[R < 0.9] = 0
    R[0, :5] = np.nan
    R[1, 5:10] = -1.0
    R[2, iso[:3]] = 2.0  # mass on isolated nodes
    R[3] = 0.0
    R[3, 7] = 1.0  # a single seed
    return R


@pytest.mark.parametrize("damping", [0.1, 0.5, 0.85])
def test_parity_igraph_prpack(damping):
    igraph = pytest.importorskip("igraph")
    from memgas_gpu.reference import reference_ppr

    worst = 0.0
    for seed, (n, ne, niso) in enumerate([(200, 400, 20), (500, 600, 80), (50, 300, 5)]):
        e, indptr, indices, iso = _random_graph(n, ne, niso, seed)
        g = igraph.Graph(n=n, edges=e.tolist(), directed=False)
        R = _resets(n, 12, iso, seed)
        ours = personalized_pagerank(indptr, indices, torch.from_numpy(R), damping=damping,
                                     tol=1e-13, max_iter=1000).numpy()
        ref = np.stack([reference_ppr(g, r, damping) for r in R])
        worst = max(worst, float(np.abs(ours - ref).max()))
    print(f"\nPPR vs igraph prpack (d={damping}): max abs diff {worst:.2e}")
    assert worst <= 1e-10


def test_two_nodes_by_hand():
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    d = 0.1
    p = personalized_pagerank(indptr, indices, torch.tensor([1.0, 0.0]), damping=d, tol=1e-15)
    torch.testing.assert_close(p, torch.tensor([1 / (1 + d), d / (1 + d)], dtype=torch.float64))


def test_no_edges_returns_reset_and_zero_rows():
    n = 6
    indptr, indices = torch.zeros(n + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    r = torch.tensor([[0.0, 2.0, 0.0, 2.0, float("nan"), -1.0], [0.0] * n])
    p = personalized_pagerank(indptr, indices, r)
    torch.testing.assert_close(p[0], torch.tensor([0, 0.5, 0, 0.5, 0, 0], dtype=torch.float64))
    assert torch.equal(p[1], torch.zeros(n, dtype=torch.float64))


@pytest.mark.parametrize("device", DEVICES)
def test_sums_to_one_and_batch_independence(device):
    e, indptr, indices, iso = _random_graph(300, 700, 30, 1)
    R = torch.from_numpy(_resets(300, 10, iso, 1)).to(device)
    p = personalized_pagerank(indptr.to(device), indices.to(device), R)
    assert p.device.type == device and p.dtype == torch.float64
    torch.testing.assert_close(p.sum(1), torch.ones(10, dtype=torch.float64, device=device))
    assert (p >= 0).all()
    for i in (0, 3, 9):
        torch.testing.assert_close(personalized_pagerank(indptr, indices, R[i].cpu()),
                                   p[i].cpu(), rtol=0, atol=1e-15)


def test_blocks_equal_separate_runs():
    parts = [_random_graph(n, 2 * n, n // 8, s) for s, n in enumerate([40, 70, 25, 60])]
    offs = np.cumsum([0] + [40, 70, 25, 60])
    edges = np.concatenate([p[0] + o for p, o in zip(parts, offs)])
    n = int(offs[-1])
    indptr, indices = symmetric_csr(torch.from_numpy(edges.T.copy()), n)
    blocks = torch.cat([torch.full((b - a,), i) for i, (a, b) in enumerate(zip(offs, offs[1:]))])
    rng = np.random.default_rng(5)
    R = rng.random((3, n))
    R[R < 0.7] = 0
    R[1, offs[2]:offs[3]] = 0  # an all-zero block stays zero
    p = personalized_pagerank(indptr, indices, torch.from_numpy(R), blocks=blocks).numpy()
    for i, (part, a, b) in enumerate(zip(parts, offs, offs[1:])):
        sep = personalized_pagerank(part[1], part[2], torch.from_numpy(R[:, a:b])).numpy()
        np.testing.assert_allclose(p[:, a:b], sep, rtol=0, atol=1e-14)
    assert np.all(p[1, offs[2]:offs[3]] == 0)
    sums = np.add.reduceat(p, offs[:-1], axis=1)
    np.testing.assert_allclose(sums[sums > 0], 1.0, atol=1e-12)


def test_bad_shapes():
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    with pytest.raises(ValueError):
        personalized_pagerank(indptr, indices, torch.ones(2, 3))
    with pytest.raises(ValueError):
        personalized_pagerank(indptr, indices, torch.ones(2, 2), blocks=torch.zeros(3))
    assert personalized_pagerank(indptr, indices, torch.ones(0, 2)).shape == (0, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    e, indptr, indices, iso = _random_graph(2000, 8000, 100, 3)
    R = torch.from_numpy(_resets(2000, 64, iso, 3))
    torch.testing.assert_close(personalized_pagerank(indptr.cuda(), indices.cuda(), R.cuda()).cpu(),
                               personalized_pagerank(indptr, indices, R), rtol=0, atol=1e-14)


@pytest.mark.parametrize("device", DEVICES)
def test_column_index_past_int32_refused_by_every_path(device):
    """A column 2**32 + 5 in a 1,000-node int64 graph would wrap to 5 if narrowed to
    int32 before the check: every path refuses it, naming the value."""
    from memgas_gpu import _native

    n = 1000
    ring = torch.arange(n)
    indptr, indices = symmetric_csr(torch.stack([ring, (ring + 1) % n]), n)
    bad = indices.clone()
    bad[7] = 2 ** 32 + 5
    reset = torch.zeros(2, n, dtype=torch.float64)
    reset[:, 3] = 1.0
    backends = ["torch"] + (["native"] if _native.native_available(device) else [])
    for backend in backends + ["auto"]:
        with pytest.raises(ValueError, match=r"column index 4294967301 out of range \[0, 1000\)"):
            personalized_pagerank(indptr.to(device), bad.to(device), reset.to(device),
                                  backend=backend)
        with pytest.raises(ValueError, match=r"column index -3 out of range"):
            neg = indices.clone()
            neg[0] = -3
            personalized_pagerank(indptr.to(device), neg.to(device), reset.to(device),
                                  backend=backend)
    if _native.C is not None and device == "cpu":  # the CPU kernel's own check (int64 read)
        out = torch.empty(n, 2, dtype=torch.float64)
        r = reset.T.contiguous()
        with pytest.raises(ValueError, match="column index out of range"):
            _native.C.ppr_cpu(indptr.data_ptr(), bad.data_ptr(), True, n, r.data_ptr(), 2, 0, 1,
                              0.1, 1e-10, 10, out.data_ptr(), 1)


def test_quiet_sparse_warnings_silences_only_the_sparse_notices():
    """torch's own notices (warned once per process, so replayed here by text) are
    silenced inside the helper; any other warning still shows."""
    import warnings

    from memgas_gpu.ops import quiet_sparse_warnings

    notices = ["Sparse CSR tensor support is in beta state. If you miss a functionality "
               "in the sparse tensor support, please submit a feature request",
               "Sparse BSR tensor support is in beta state.",
               "Sparse invariant checks are implicitly disabled. Memory errors (e.g. "
               "SEGFAULT) will occur when operating on a sparse tensor which violates "
               "the invariants"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_sparse_warnings():
            for text in notices + ["another notice"]:
                warnings.warn(text, UserWarning)
            A = torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([1, 0]),
                                        torch.ones(2), size=(2, 2))
        warnings.warn(notices[0], UserWarning)  # outside: shown
    assert [str(w.message) for w in seen] == ["another notice", notices[0]]
    assert torch.equal(A.to_dense(), torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
