"""Query path: torch ops, native kernels and igraph prpack one query at a time.

    python -m pytest benchmarks/bench_ppr.py --benchmark-enable -q -s
    MEMGAS_BENCH_THREADS=2 python -m pytest benchmarks/bench_ppr.py -q -s   # the goal

Synthetic conversation: 500 sessions x 4 granularities = 2,000 nodes, d = 384, with
its association graph built by ``build_association_graph``; 200 queries near random
nodes. Three comparisons, each printed as one summary line (the first and last with
torch, native and reference times per query and the ratios):

* PPR only: ``personalized_pagerank`` on a ``[200, 2000]`` reset batch (``backend=
  "torch"`` and ``"native"``, ``csrc/cpu/ppr_cpu.cpp``) vs igraph
  ``personalized_pagerank(implementation="prpack")`` per query (the reference).
* One row over 64 conversations (LongMemEval's shape): the native kernel at 1 thread vs
  every thread, same run, equal bits.
* Full read path: ``memgas_session_scores`` (router, seeds, PPR, session sums) for all
  200 queries vs ``memgas_gpu.reference.reference_session_scores`` per query. The
  issue's goal: native >= 20x faster per query than igraph-per-query (< 0.23 ms).

Threads: ``MEMGAS_BENCH_THREADS`` threads for torch and the native kernels (default 1;
see bench_graph). Best-of-N timings.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _synth import conversation  # noqa: E402

from memgas_gpu import _native  # noqa: E402
from memgas_gpu.ops import (build_association_graph, memgas_session_scores,  # noqa: E402
                            personalized_pagerank, seed_scores)

N_SESSIONS = 500
DIM = 384
N_QUERIES = 200
NATIVE = _native.native_available("cpu")


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


def _best(fn, repeat=5):
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _line(what, t_torch, t_nat, t_ref, extra=""):
    ms = lambda t: f"{t / N_QUERIES * 1e3:.3f} ms/query"  # noqa: E731
    return (f"\n[bench_ppr] {what}, {N_QUERIES} queries, {torch.get_num_threads()} threads: "
            f"torch {ms(t_torch)}, native {ms(t_nat)}, reference {ms(t_ref)}; "
            f"reference/torch {t_ref / t_torch:.1f}x, reference/native {t_ref / t_nat:.1f}x, "
            f"torch/native {t_torch / t_nat:.1f}x{extra}")


def test_ppr_batched_vs_igraph(benchmark, setup, capsys):
    from memgas_gpu.reference import reference_ppr

    E, s, g, indptr, indices, graph, Q = setup
    reset = seed_scores(Q @ E.T, 15).double()
    run = lambda be: personalized_pagerank(indptr, indices, reset, backend=be)  # noqa: E731
    ours = _best(lambda: run("torch"))
    nat = _best(lambda: run("native")) if NATIVE else float("nan")
    benchmark.pedantic(run, args=("auto",), rounds=5, iterations=1)
    R = reset.numpy()
    t0 = time.perf_counter()
    ref = np.stack([reference_ppr(graph, r) for r in R])
    t_ref = time.perf_counter() - t0
    diff = np.abs(run("torch").numpy() - ref).max()
    diff_nat = np.abs(run("native").numpy() - ref).max() if NATIVE else float("nan")
    with capsys.disabled():
        print(_line(f"PPR x {len(E)} nodes", ours, nat, t_ref,
                    f"; max diff to igraph: torch {diff:.1e}, native {diff_nat:.1e}"))
    assert diff < 1e-9 and (not NATIVE or diff_nat < 1e-9)


def test_session_scores_vs_reference(benchmark, setup, capsys):
    from memgas_gpu.reference import reference_session_scores

    E, s, g, indptr, indices, graph, Q = setup
    run = lambda be: memgas_session_scores(Q, E, s, g, indptr, indices, backend=be)  # noqa: E731
    ours = _best(lambda: run("torch"))
    nat = _best(lambda: run("native")) if NATIVE else float("nan")
    benchmark.pedantic(run, args=("auto",), rounds=5, iterations=1)
    t0 = time.perf_counter()
    ref = reference_session_scores(Q, E, s, g, graph, N_SESSIONS)
    t_ref = time.perf_counter() - t0
    top = np.mean([set(np.argsort(-a)[:10]) == set(np.argsort(-b)[:10])
                   for a, b in zip(run("auto").numpy(), ref)])
    with capsys.disabled():
        print(_line(f"read path x {N_SESSIONS} sessions", ours, nat, t_ref,
                    f"; same top-10 as the reference {top:.1%}"))
    assert top >= 0.99


@pytest.mark.skipif(not NATIVE, reason="native kernels not built")
def test_one_row_over_many_conversations_uses_every_thread(capsys):
    """LongMemEval's shape: one question per haystack, so one PPR row spans every
    conversation's block. The CPU kernel cuts that row into node ranges at block
    boundaries; this times 1 thread against all of ``torch.get_num_threads()`` (at
    least 2) in the same run, on 64 haystacks x 500 sessions, and checks equal bits."""
    from memgas_gpu.bench.data import make_haystacks

    h = make_haystacks(64, N_SESSIONS, dim=DIM)
    indptr, indices = build_association_graph(h.node_emb, h.session_of_node,
                                              conversation_of_node=h.conv_of_node)
    gen = torch.Generator().manual_seed(0)
    reset = torch.zeros(1, h.n_nodes, dtype=torch.float64)
    reset[0, torch.randint(0, h.n_nodes, (64 * 15,), generator=gen)] = torch.rand(
        64 * 15, generator=gen, dtype=torch.float64)
    run = lambda: personalized_pagerank(indptr, indices, reset, blocks=h.conv_of_node,  # noqa: E731
                                        backend="native")
    many = max(2, torch.get_num_threads())
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        t1, out1 = _best(run), run()
        torch.set_num_threads(many)
        tn, outn = _best(run), run()
    finally:
        torch.set_num_threads(old)
    with capsys.disabled():
        print(f"\n[bench_ppr] one row over 64 conversations ({h.n_nodes} nodes, "
              f"{int(indices.numel()) // 2} edges): 1 thread {t1 * 1e3:.1f} ms, {many} threads "
              f"{tn * 1e3:.1f} ms; speed-up {t1 / tn:.2f}x")
    assert torch.equal(out1, outn)
