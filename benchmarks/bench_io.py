"""Index save / load throughput: safetensors + manifest vs pickle (torch.save / torch.load).

    python -m pytest benchmarks/bench_io.py --benchmark-enable -q -s

A :class:`~memgas_gpu.retrieve.MemoryIndex` of random tensors shaped like
``MEMGAS_BENCH_HAYSTACKS`` (default 16) haystacks x 500 sessions, d = 384 (four
granularity embeddings + a hybrid embedding per session, a 20-neighbour graph per node;
~70 MB). Rates are GB/s of the bytes on disk. Loads follow saves, so they read from
the page cache: this measures (de)serialisation, not the disk.
"""
from __future__ import annotations

import os

import pytest

from memgas_gpu.bench import io_point
from memgas_gpu.bench.report import fmt_rate, fmt_seconds
from memgas_gpu.bench.stages_io import make_index
from memgas_gpu.retrieve import MemoryIndex

HAYSTACKS = int(os.environ.get("MEMGAS_BENCH_HAYSTACKS", "16"))
SESSIONS, DIM = 500, 384


@pytest.fixture(scope="module")
def index():
    return make_index(HAYSTACKS, SESSIONS, DIM)


def test_save(benchmark, index, tmp_path):
    benchmark.pedantic(index.save, args=(tmp_path / "idx",), rounds=3, iterations=1)


def test_load(benchmark, index, tmp_path):
    index.save(tmp_path / "idx")
    benchmark.pedantic(MemoryIndex.load, args=(tmp_path / "idx",), rounds=3, iterations=1)


def test_save_load_vs_pickle(tmp_path, capsys):
    recs = io_point(HAYSTACKS, SESSIONS, DIM, str(tmp_path), rounds=3)
    by = {(r.stage, r.impl): r for r in recs}
    with capsys.disabled():
        for stage in ("io_save", "io_load"):
            o, r = by[(stage, "ours")], by.get((stage, "reference"))
            print(f"\n[bench_io] {stage[3:]} {o.work / 1e6:.0f} MB: ours "
                  f"{fmt_seconds(o.seconds)} ({fmt_rate(o.rate, 'bytes')}), pickle "
                  f"{fmt_seconds(r.seconds)} ({fmt_rate(r.rate, 'bytes')}), ratio "
                  f"{r.seconds / o.seconds:.2f}x")
    assert by[("io_load", "ours")].work > 0
