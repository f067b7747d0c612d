"""Query path: batched PPR / session scoring vs igraph prpack one query at a time.

    python -m pytest benchmarks/bench_ppr.py --benchmark-enable -q

Synthetic conversation: 500 sessions x 4 granularities = 2,000 nodes, d = 384, with
its association graph built by ``build_association_graph``; 200 queries near random
nodes. Two comparisons, each printed as one summary line with both times and the ratio:

* PPR only: ``personalized_pagerank`` on a ``[200, 2000]`` reset batch vs igraph
  ``personalized_pagerank(implementation="prpack")`` per query (the reference).
* Full read path: ``memgas_session_scores`` (router, seeds, PPR, session sums) for all
  200 queries vs ``memgas_gpu.reference.reference_session_scores`` per query.

Threads: ``MEMGAS_BENCH_THREADS`` torch intra-op threads (default 1; see bench_graph).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _synth import conversation  # noqa: E402

from memgas_gpu.ops import (build_association_graph, memgas_session_scores,  # noqa: E402
                            personalized_pagerank, seed_scores)

N_SESSIONS = 500
DIM = 384
N_QUERIES = 200


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("MEMGAS_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def setup():
    igraph = pytest.importorskip("igraph")
    E, s, g = conversation(N_SESSIONS, d=DIM, seed=0)
    indptr, indices = build_association_graph(E, s)
    rows = torch.repeat_interleave(torch.arange(len(E)), indptr[1:] - indptr[:-1])
    keep = rows < indices
    graph = igraph.Graph(n=len(E), edges=torch.stack([rows[keep], indices[keep]]).T.tolist(),
                         directed=False)
    gen = torch.Generator().manual_seed(1)
    Q = E[torch.randint(0, len(E), (N_QUERIES,), generator=gen)]
    Q = Q + 0.1 * torch.randn(Q.shape, generator=gen)
    Q = Q / Q.norm(dim=1, keepdim=True)
    return E, s, g, indptr, indices, graph, Q


def _best(fn, repeat=3):
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def test_ppr_batched_vs_igraph(benchmark, setup, capsys):
    from memgas_gpu.reference import reference_ppr

    E, s, g, indptr, indices, graph, Q = setup
    reset = seed_scores(Q @ E.T, 15).double()
    ours = _best(lambda: personalized_pagerank(indptr, indices, reset))
    benchmark.pedantic(personalized_pagerank, args=(indptr, indices, reset), rounds=5,
                       iterations=1)
    R = reset.numpy()
    t0 = time.perf_counter()
    ref = np.stack([reference_ppr(graph, r) for r in R])
    t_ref = time.perf_counter() - t0
    diff = np.abs(personalized_pagerank(indptr, indices, reset).numpy() - ref).max()
    with capsys.disabled():
        print(f"\n[bench_ppr] PPR, {N_QUERIES} queries x {len(E)} nodes: ours {ours * 1e3:.1f} ms "
              f"({ours / N_QUERIES * 1e3:.3f} ms/query), igraph {t_ref * 1e3:.1f} ms "
              f"({t_ref / N_QUERIES * 1e3:.3f} ms/query), speed-up {t_ref / ours:.1f}x, "
              f"max diff {diff:.1e}")
    assert diff < 1e-9


def test_session_scores_vs_reference(benchmark, setup, capsys):
    from memgas_gpu.reference import reference_session_scores

    E, s, g, indptr, indices, graph, Q = setup
    run = lambda: memgas_session_scores(Q, E, s, g, indptr, indices)  # noqa: E731
    ours = _best(run)
    benchmark.pedantic(run, rounds=5, iterations=1)
    t0 = time.perf_counter()
    ref = reference_session_scores(Q, E, s, g, graph, N_SESSIONS)
    t_ref = time.perf_counter() - t0
    top = np.mean([set(np.argsort(-a)[:10]) == set(np.argsort(-b)[:10])
                   for a, b in zip(run().numpy(), ref)])
    with capsys.disabled():
        print(f"\n[bench_ppr] read path, {N_QUERIES} queries x {N_SESSIONS} sessions: ours "
              f"{ours * 1e3:.1f} ms ({ours / N_QUERIES * 1e3:.3f} ms/query), reference "
              f"{t_ref * 1e3:.0f} ms ({t_ref / N_QUERIES * 1e3:.2f} ms/query), speed-up "
              f"{t_ref / ours:.1f}x, same top-10 {top:.1%}")
    assert top >= 0.99
