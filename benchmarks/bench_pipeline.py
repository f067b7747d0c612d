"""Read path, BM25, encoding and the end-to-end index: ours vs the reference way, one run.

    python -m pytest benchmarks/bench_pipeline.py --benchmark-enable -q -s

LongMemEval-shaped inputs (random embeddings, ``memgas_gpu.bench.data``): ``HAYSTACKS``
haystacks of 500 sessions (4 granularity nodes each, d = 384), one question per
haystack. Each test times ours with pytest-benchmark and prints one line with the
reference way (same inputs, same process) and the ratio:

* routing + PPR + ranking: all questions in one packed call vs
  ``reference_session_scores`` (numpy router, igraph prpack PPR) one question at a time;
  plus single-question latency p50/p99;
* BM25: ``memgas_gpu.lexical.bm25_scores`` for all questions vs ``bm25s`` per question
  (skipped when ``memgas_gpu.lexical`` or ``bm25s`` is missing);
* encoding: sorted token-budget batches vs fixed-64 unsorted, bundled MiniLM;
* end-to-end: load + index + retrieve a synthetic LongMemEval file (random tiny BERT)
  vs a Python loop per question (scikit-learn GMM per node, igraph PPR).

Environment: ``MEMGAS_BENCH_THREADS`` (torch threads, default 1), ``MEMGAS_BENCH_HAYSTACKS``
(default 16), ``MEMGAS_BENCH_DEVICE`` (default cpu).
"""
from __future__ import annotations

import os
import tempfile

import pytest

from memgas_gpu.bench import (bm25_point, encode_point, graph_point, index_point,
                              make_encoder, query_point)
from memgas_gpu.bench.data import make_haystacks, make_queries, make_terms, synthetic_texts
from memgas_gpu.bench.report import fmt_rate, fmt_seconds
from memgas_gpu.bench.stages import bm25_runner, query_runner

HAYSTACKS = int(os.environ.get("MEMGAS_BENCH_HAYSTACKS", "16"))
SESSIONS = 500
DIM = 384
DEVICE = os.environ.get("MEMGAS_BENCH_DEVICE", "cpu")


@pytest.fixture(scope="module")
def haystacks():
    h = make_haystacks(HAYSTACKS, SESSIONS, DIM, device=DEVICE)
    _, graph = graph_point(h, rounds=1, warmup=0, reference=False)
    q, qc = make_queries(h, per_conv=1)
    return h, graph, q, qc


def _line(tag, ours, ref, extra=""):
    ratio = ref.seconds / ours.seconds if ref is not None else float("nan")
    ref_txt = f"reference {fmt_seconds(ref.seconds)} ({ref.note})" if ref else "no reference"
    print(f"\n[{tag}] {ours.size}: ours {fmt_seconds(ours.seconds)} "
          f"({fmt_rate(ours.rate, ours.unit)}), {ref_txt}, speed-up {ratio:.3g}x{extra}")


def test_query_path(benchmark, haystacks, capsys):
    pytest.importorskip("igraph")
    h, graph, q, qc = haystacks
    ours, *ref = query_point(h, graph, q, qc, rounds=5, latency_calls=100, ref_queries=HAYSTACKS)
    benchmark.pedantic(query_runner(h, graph, q, qc), rounds=5, iterations=1)
    benchmark.extra_info.update(queries=int(q.shape[0]), **{k: v for k, v in ours.extra.items()
                                                           if k.startswith("latency")})
    with capsys.disabled():
        _line("query", ours, ref[0] if ref else None,
              f"; 1-question latency p50 {fmt_seconds(ours.extra['latency_p50_s'])}, "
              f"p99 {fmt_seconds(ours.extra['latency_p99_s'])}")


def test_bm25(benchmark, capsys):
    pytest.importorskip("memgas_gpu.lexical", reason="memgas_gpu.lexical is not available")
    terms = make_terms(HAYSTACKS, SESSIONS)
    recs = bm25_point(terms, SESSIONS, device=DEVICE, rounds=5, ref_queries=HAYSTACKS)
    if not recs:
        pytest.skip("BM25 ops are not available")
    benchmark.pedantic(bm25_runner(terms, DEVICE), rounds=5, iterations=1)
    with capsys.disabled():
        _line("bm25", recs[0], recs[1] if len(recs) > 1 else None)


def test_encode(benchmark, capsys):
    enc = make_encoder("minilm", DEVICE, "")
    texts = synthetic_texts(160)
    ours, *ref = encode_point(enc, texts, rounds=1)
    benchmark.pedantic(lambda: enc.encode(texts, progress=False), rounds=1, iterations=1)
    with capsys.disabled():
        _line("encode", ours, ref[0] if ref else None,
              f"; padding efficiency {ours.extra['padding_efficiency']:.1%}")


def test_end_to_end_index(benchmark, capsys):
    pytest.importorskip("sklearn")
    pytest.importorskip("igraph")
    from memgas_gpu.synth import write_synthetic

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.json")
        write_synthetic(path, questions=8, sessions=50, turns=6, words=40, progress=False)
        enc = make_encoder("tiny", DEVICE, tmp)
        ours, *ref = index_point(path, enc, device=DEVICE, ref_questions=8)
        benchmark.pedantic(lambda: index_point(path, enc, device=DEVICE, reference=False),
                           rounds=1, iterations=1)
    with capsys.disabled():
        _line("index", ours, ref[0] if ref else None,
              "; " + ", ".join(f"{k[:-2]} {fmt_seconds(v)}"
                               for k, v in ours.extra["breakdown_s"].items()))
