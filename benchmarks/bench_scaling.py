"""Scaling sweeps: graph build and read path vs sessions per haystack and vs haystacks.

    python -m pytest benchmarks/bench_scaling.py --benchmark-enable -q -s
    MEMGAS_BENCH_SCALE=m python -m pytest benchmarks/bench_scaling.py ...   # full sweep

Sizes come from ``memgas_gpu.bench.SCALES`` (``MEMGAS_BENCH_SCALE``, default ``s``: sessions
50 -> 2,000 of one haystack, haystacks 1 -> 64 of 500 sessions; ``m``: sessions 50 -> 500 ->
5,000 and haystacks 1 -> 500, for a GPU). Each point times ours with pytest-benchmark
and the reference way (per-node scikit-learn GMM on a node subsample, extrapolated; igraph
PPR per question) in the same run; the last test prints the fitted log-log slopes next to
the expected exponents (``memgas_gpu.bench.scaling.EXPECTED``) and peak memory.
"""
from __future__ import annotations

import os

import pytest

from memgas_gpu.bench import SCALES, graph_point, query_point, scaling_rows
from memgas_gpu.bench.data import make_haystacks, make_queries
from memgas_gpu.bench.report import fmt_bytes, fmt_seconds
from memgas_gpu.bench.stages import graph_runner

CFG = SCALES[os.environ.get("MEMGAS_BENCH_SCALE", "s")]
DEVICE = os.environ.get("MEMGAS_BENCH_DEVICE", "cpu")
RECORDS: list = []
REF_CACHE: dict = {}  # per-haystack reference graph seconds, shared by both sweeps
POINTS = ([("sessions", 1, n, CFG.sweep_queries) for n in CFG.sessions]
          + [("haystacks", c, CFG.haystack_sessions, 1) for c in CFG.haystacks])


@pytest.mark.parametrize("axis,haystacks,sessions,per", POINTS,
                         ids=[f"{a}-{c}x{n}" for a, c, n, _ in POINTS])
def test_sweep_point(benchmark, axis, haystacks, sessions, per):
    pytest.importorskip("sklearn")
    pytest.importorskip("igraph")
    h = make_haystacks(haystacks, sessions, CFG.dim, device=DEVICE)
    recs, graph = graph_point(h, rounds=2, ref_nodes=CFG.ref_nodes, sweep=axis,
                              ref_cache=REF_CACHE)
    q, qc = make_queries(h, per_conv=per)
    recs += query_point(h, graph, q, qc, rounds=3, latency_calls=0,
                        ref_queries=CFG.ref_queries, sweep=axis)
    RECORDS.extend(recs)
    benchmark.extra_info.update({f"{r.stage}_{r.impl}_s": r.seconds for r in recs})
    benchmark.pedantic(graph_runner(h), rounds=1, iterations=1)


def test_slopes(capsys):
    rows = scaling_rows(RECORDS)
    if not rows:
        pytest.skip("no sweep points ran")
    with capsys.disabled():
        print("\n[bench_scaling] stage     axis       impl       slope(all) slope(top2) "
              "expected  times; peak host memory at the largest size")
        for s in rows:
            print(f"[bench_scaling] {s['stage']:9s} {s['axis']:10s} {s['impl']:10s} "
                  f"{s['slope']:10.2f} {s['slope_top']:11.2f} {s['expected']:8g}  "
                  f"{', '.join(fmt_seconds(y) for y in s['seconds'])}; "
                  f"{fmt_bytes(s['host_peak_bytes'][-1])}")
