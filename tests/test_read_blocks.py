"""The read-path blocks of benchmarks/read_blocks.py (bench_read_blocks.py times them)
against the straightforward computation: per-query products, the router on a gathered
[Q, G, N] copy + seed_scores, and memgas_session_scores run conversation by
conversation."""
from __future__ import annotations

import pytest
import torch

from memgas_gpu.ops import (build_association_graph, entropy_router, memgas_session_scores,
                            seed_scores)

from _benchmarks import load_benchmark
from _synth import conversation, torch_single_thread  # noqa: F401

_blocks = load_benchmark("read_blocks")
packed_similarities = _blocks.packed_similarities
regular_packed_scores = _blocks.regular_packed_scores
regular_router_seeds = _blocks.regular_router_seeds

G = 4


def _packed(sizes, d=32, seed=0, dtype=torch.float32):
    """Conversations of ``sizes`` sessions (regular: 4 nodes per session), packed."""
    embs, sess, convs = [], [], []
    for c, N in enumerate(sizes):
        E, s, _ = conversation(N, d=d, seed=seed + c)
        embs.append(E.to(dtype))
        sess.append(s + (sess[-1].max() + 1 if sess else 0))
        convs.append(torch.full((len(E),), c))
    E, s, conv = torch.cat(embs), torch.cat(sess), torch.cat(convs)
    count = torch.tensor([G * N for N in sizes])
    start = torch.cumsum(count, 0) - count
    return E, s, conv, start, count


def _queries(E, conv, q_conv, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for c in q_conv.tolist():
        nodes = torch.nonzero(conv == c).flatten()
        pick = nodes[torch.randint(0, len(nodes), (1,), generator=g)]
        out.append(E[pick[0]] + 0.1 * torch.randn(E.shape[1], generator=g).to(E.dtype))
    return torch.stack(out)


def test_packed_similarities_equal_per_query_products():
    E, _, conv, start, count = _packed([5, 9, 3], dtype=torch.float64)
    qc = torch.tensor([1, 0, 2, 1, 1])
    q = _queries(E, conv, qc)
    got = packed_similarities(q, qc, E, start, count)
    assert got.shape == (5, 36) and got.dtype == torch.float64
    for i, c in enumerate(qc.tolist()):
        a, n = int(start[c]), int(count[c])
        want = E[a:a + n] @ q[i]
        torch.testing.assert_close(got[i, :n], want, rtol=0, atol=1e-12)
        assert not got[i, n:].any()
    f32 = packed_similarities(q.float(), qc, E.float(), start, count)
    torch.testing.assert_close(f32.double(), got, rtol=0, atol=1e-5)
    half = packed_similarities(q.float(), qc, E.half(), start, count, half_storage=True)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half.double(), got, rtol=0, atol=3e-3)
    empty = packed_similarities(q[:0], qc[:0], E, start, count)
    assert empty.shape == (0, 0)


def test_router_seeds_equal_the_gathered_computation():
    E, _, conv, start, count = _packed([6, 20, 11])
    qc = torch.tensor([0, 1, 2, 1])
    q = _queries(E, conv, qc)
    sims = packed_similarities(q, qc, E, start, count)
    sims[0, 3] = float("nan")
    n_sess = count[qc] // G
    Q, n_max = sims.shape
    N = n_max // G
    ok = torch.arange(N)[None, :] < n_sess[:, None]
    for use_router in (True, False):
        for alpha in (1, 15, 200):
            w, seeds = regular_router_seeds(sims, n_sess, G, alpha=alpha, use_router=use_router)
            # the straightforward way: [Q, G, N] copy, per-node gathered weights
            per_gran = torch.stack([sims[:, g::G] for g in range(G)], dim=1)
            want_w = (entropy_router(per_gran, 0.2, "inverse", ok[:, None, :]) if use_router
                      else torch.full((Q, G), 1.0 / G))
            gran = torch.arange(n_max) % G
            valid = ok.repeat_interleave(G, dim=1)
            want = seed_scores(want_w[:, gran] * sims, alpha, valid).double()
            assert torch.equal(w, want_w) and torch.equal(seeds, want)
            assert int((seeds[1] > 0).sum()) <= max(alpha, 1) + 2  # ties only


def _per_conversation(q, qc, E, conv, indptr, indices, **kw):
    """memgas_session_scores on each query's own conversation (sub-graph), padded."""
    N_max = int(torch.bincount(conv).max()) // G
    out = torch.zeros(len(q), N_max, dtype=torch.float64)
    for i, c in enumerate(qc.tolist()):
        nodes = torch.nonzero(conv == c).flatten()
        a, b = int(nodes[0]), int(nodes[-1]) + 1
        p0, p1 = int(indptr[a]), int(indptr[b])
        sub = (indptr[a:b + 1] - p0, indices[p0:p1] - a)
        n = b - a
        got = memgas_session_scores(q[i], E[a:b], torch.arange(n) // G, torch.arange(n) % G,
                                    *sub, n_sessions=n // G, n_gran=G, **kw)
        out[i, :n // G] = got
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_regular_packed_scores_equal_per_conversation_scores(dtype):
    sizes = [12, 30, 7, 30]
    E, s, conv, start, count = _packed(sizes, dtype=dtype)
    indptr, indices = build_association_graph(E, s, conversation_of_node=conv)
    qc = torch.tensor([3, 0, 1, 1, 2, 3, 1])  # several queries per conversation
    q = _queries(E, conv, qc)
    for kw in ({}, {"use_ppr": False}, {"use_router": False}, {"alpha": 3}):
        a = _per_conversation(q, qc, E, conv, indptr, indices, **kw)
        b, vb = regular_packed_scores(q, qc, E, start, count, indptr, indices, conv, **kw)
        assert torch.equal(vb, torch.arange(30)[None, :] < (count[qc] // G)[:, None])
        tol = 1e-12 if dtype == torch.float64 else 1e-7
        torch.testing.assert_close(b, a, rtol=0, atol=tol)
        ra = torch.argsort(a.masked_fill(~vb, -1), dim=1, descending=True, stable=True)
        rb = torch.argsort(b.masked_fill(~vb, -1), dim=1, descending=True, stable=True)
        assert torch.equal(ra, rb)


def test_half_storage_is_not_rank_preserving():
    """float16 node storage (opt-in) moves similarities by ~1e-3: enough to swap the
    alpha-th seed or near-tied sessions. Measured here: the top session never changes,
    the top-10 order of some queries does (docs/performance.md)."""
    sizes = [40, 40, 40]
    E, s, conv, start, count = _packed(sizes, d=64, seed=5)
    indptr, indices = build_association_graph(E, s, conversation_of_node=conv)
    qc = torch.arange(3).repeat(4)
    q = _queries(E, conv, qc, seed=9)
    a, _ = regular_packed_scores(q, qc, E, start, count, indptr, indices, conv)
    b, _ = regular_packed_scores(q, qc, E.half(), start, count, indptr, indices, conv,
                                 half_storage=True)
    assert torch.equal(a.argmax(1), b.argmax(1))
    same = (torch.argsort(a, 1, descending=True)[:, :10]
            == torch.argsort(b, 1, descending=True)[:, :10]).all(1)
    print(f"float16 storage: top-10 unchanged for {int(same.sum())} of {len(same)} queries")
    assert int(same.sum()) >= len(same) // 2
