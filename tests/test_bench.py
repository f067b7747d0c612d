"""The benchmark suite runs and writes well-formed outputs (speed is never asserted)."""
from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from memgas_gpu.bench import (PeakMemory, Record, evaluate_goals, fit_slope, limit_seconds,
                              measure, percentile, ratios, scaling_rows, write_report)
from memgas_gpu.bench.limits import encode_cost, graph_cost, query_cost
from memgas_gpu.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
STATS_KEYS = {"min", "max", "mean", "stddev", "rounds", "median", "iqr", "q1", "q3",
              "iqr_outliers", "stddev_outliers", "outliers", "ld15iqr", "hd15iqr", "ops",
              "total", "iterations"}


def _rec(stage, impl, size, secs, work=100.0, unit="nodes", sweep="", **extra):
    return Record(stage, impl, size, list(secs), work, unit, sweep, "", None, None, extra)


def test_percentile_and_slope():
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([0, 10], 99) == pytest.approx(9.9)
    assert math.isnan(percentile([], 50))
    xs = [50, 500, 5000]
    assert fit_slope(xs, [1e-3 * x ** 2 for x in xs]) == pytest.approx(2.0)
    assert fit_slope(xs[-2:], [2.0 * x for x in xs[-2:]]) == pytest.approx(1.0)
    assert math.isnan(fit_slope([10], [1.0]))


def test_measure_rounds_and_peak_memory():
    calls = []
    rec = measure(lambda: calls.append(1), stage="graph", impl="ours", size={"sessions": 5},
                  work=10, unit="nodes", rounds=3, warmup=2)
    assert len(calls) == 5 and len(rec.times) == 3 and rec.rate > 0
    with PeakMemory() as peak:
        a = np.ones(40 * 2 ** 20 // 8)
        a[::512] = 2.0
        del a
    assert peak.host is not None
    if not peak.host_absolute:  # Linux: the high-water mark above the starting RSS
        assert peak.host >= 30 * 2 ** 20


def test_costs_and_limits():
    """Hand-computed counts (the docstrings' formulas worked out on small numbers)."""
    # BERT-base: ~0.19 GFLOP per token in a 512-token window (DESIGN.md)
    per_token = encode_cost([512], 12, 768, 3072) / 512
    assert 0.17e9 < per_token < 0.21e9
    # 1 layer, h=2, i=3, one window of 2 tokens: 2 * 2 * (4*4 + 2*2*3) + 4*1*2*2*2 = 144
    assert encode_cost([2], 1, 2, 3) == 144.0
    # 7 sessions, skip 5: sessions 5 and 6 compare their 4 nodes with 4*5 and 4*6 earlier
    # nodes: 16 * (5 + 6) = 176 dot products of length 2 -> 704 FLOPs; bytes: 28 nodes
    # * 2 dims * 4 B + 2 * 28 nodes * m=1 candidates * (4 + 8) B = 224 + 672
    assert graph_cost(1, 7, 2, m=1) == (704.0, 896.0)
    flops, nbytes = graph_cost(500, 500, 768)
    assert flops == 1_532_805_120_000.0  # 2 * 768 * 16 * 124_740 * 500
    assert nbytes == 500 * 500 * 4 * (768 * 4 + 2 * 30 * 12)
    assert limit_seconds(989e12, 1.0) == pytest.approx(1.0)  # compute-bound
    assert limit_seconds(1.0, 9.6e12) == pytest.approx(2.0)  # bandwidth-bound
    # 2 queries, 3 sessions, d=4, one conversation (2 PPR rows), 5 iterations, 10 edges,
    # 12 nodes: similarities 2*2*4*3*4 = 192 FLOPs and 2*4*3*4*4 = 384 B; PPR 2*5*10*2 =
    # 200 FLOPs and 5 * (10*4 (int32 columns) + 12*8 (row pointers) + 3*12*8*2 (state of
    # 2 rows)) = 5 * 712 = 3560 B
    assert query_cost(2, 3, 4, nnz=10, n_nodes=12, n_conv=1, iters=5) == (392.0, 3944.0)
    # default iterations: ceil(log 1e-3 / log 0.2) = ceil(4.29) = 5
    assert query_cost(1, 1, 1, nnz=1, n_nodes=1, n_conv=1, damping=0.2, tol=1e-3) == (
        8.0 + 2 * 5, 16.0 + 5 * (1 * 4 + 1 * 8 + 3 * 1 * 8))


def test_bandwidth_limit_rows():
    from memgas_gpu.bench.bandwidth import bandwidth_rows, measure_bandwidth
    from memgas_gpu.bench.report import bandwidth_table

    bw = measure_bandwidth("cpu", nbytes=1 << 20, rounds=2)
    assert bw["copy"] > 0 and bw["triad"] > 0 and bw["buffer_bytes"] == 1 << 20
    bw = {"copy": 12e9, "triad": 10e9, "buffer_bytes": 1 << 28, "threads": 1}
    recs = [_rec("query", "ours", {"haystacks": 64, "sessions": 500}, [0.05], bytes=2e8,
                 headline=True),
            _rec("bm25", "ours", {"haystacks": 64, "sessions": 500}, [0.002], bytes=1e6),
            _rec("graph", "ours", {"haystacks": 64, "sessions": 500}, [1.0], bytes=1e9),
            _rec("query", "reference", {"haystacks": 64, "sessions": 500}, [1.0], bytes=2e8)]
    q, b = bandwidth_rows(recs, bw)
    assert (q["stage"], b["stage"]) == ("query", "bm25")
    assert q["limit_s"] == pytest.approx(0.02) and q["ratio"] == pytest.approx(2.5)
    assert b["limit_s"] == pytest.approx(1e-4) and b["ratio"] == pytest.approx(20.0)
    assert bandwidth_rows(recs, None) == []
    lines = bandwidth_table(recs, {"bandwidth": bw}, headline_only=True)
    assert "triad 10 GB/s" in lines[0] and lines[-1].endswith("| 2.5x |") and len(lines) == 5


def test_goals_and_ratios():
    recs = [_rec("graph", "ours", {"haystacks": 500, "sessions": 500}, [0.2], headline=True,
                 flops=1.5e12, bytes=3e9),
            _rec("graph", "reference", {"haystacks": 500, "sessions": 500}, [100.0]),
            _rec("encode", "ours", {"texts": 10}, [1.0], work=3e6, unit="tokens",
                 model="12x768", flops=0.19e9 * 3e6, bytes=0.0)]
    goals = {g["goal"]: g for g in evaluate_goals(recs)}
    assert goals["graph"]["met"] is True and goals["graph"]["limit"] == pytest.approx(
        limit_seconds(1.5e12, 3e9))
    assert goals["encode"]["met"] is True and goals["encode"]["measured"] == pytest.approx(3e6)
    assert goals["query"]["measured"] is None  # not measured: reported, not an error
    (o, r, x), = ratios(recs)
    assert x == pytest.approx(500.0)


def _check_outputs(out: Path, n_plots_min: int = 1):
    report = (out / "report.md").read_text()
    for section in ("## Ours vs reference", "## Throughput, latency and memory",
                    "## Scaling", "## H200 goals"):
        assert section in report
    doc = json.loads((out / "results.json").read_text())
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= set(doc)
    assert doc["benchmarks"]
    for b in doc["benchmarks"]:
        assert {"group", "name", "fullname", "params", "param", "extra_info", "options",
                "stats"} <= set(b)
        assert STATS_KEYS <= set(b["stats"]) and b["stats"]["rounds"] >= 1
        assert b["stats"]["min"] <= b["stats"]["median"] <= b["stats"]["max"]
    if importlib.util.find_spec("matplotlib"):
        pngs = sorted(out.glob("*.png"))
        assert len(pngs) >= n_plots_min
        assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    return report, doc


def test_report_from_records(tmp_path):
    recs = []
    for n, t_ours, t_ref in ((50, 0.01, 1.0), (500, 0.1, 10.0), (5000, 5.0, 100.0)):
        recs.append(_rec("graph", "ours", {"haystacks": 1, "sessions": n}, [t_ours, t_ours * 1.1],
                         sweep="sessions"))
        recs.append(_rec("graph", "reference", {"haystacks": 1, "sessions": n}, [t_ref],
                         sweep="sessions"))
    rows = scaling_rows(recs)
    assert {(r["stage"], r["impl"]) for r in rows} == {("graph", "ours"), ("graph", "reference")}
    ours = next(r for r in rows if r["impl"] == "ours")
    assert ours["expected"] == 2.0 and ours["sizes"] == [50, 500, 5000]
    paths = write_report(tmp_path, recs, {"scale": "test", "machine_info": {"device": "cpu"}},
                         log=lambda m: None)
    report, doc = _check_outputs(tmp_path)
    assert "| graph build | sessions | ours |" in report
    assert len(doc["benchmarks"]) == 6
    if shutil.which("pytest-benchmark"):  # the format pytest-benchmark itself reads
        run = subprocess.run(["pytest-benchmark", "compare", str(paths["json"])],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert "graph[ours-haystacks1-sessions50-sessions]" in run.stdout


@pytest.fixture(scope="module")
def gpu_suite_dry_run(tmp_path_factory):
    """``benchmarks/gpu_suite.py --dry-run``: every stage at the tiny scale, on the CPU."""
    pytest.importorskip("sklearn")
    pytest.importorskip("igraph")
    out = tmp_path_factory.mktemp("gpu_suite")
    spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "benchmarks" / "gpu_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return out, mod.main(["--dry-run", "--out", str(out)])


def test_gpu_suite_dry_run_writes_report(gpu_suite_dry_run, capsys):
    out, rc = gpu_suite_dry_run
    assert rc == 0
    report, doc = _check_outputs(out, n_plots_min=2)
    stages = {b["group"] for b in doc["benchmarks"]}
    assert {"graph", "query", "encode", "io_save", "io_load", "index"} <= stages
    impls = {(b["group"], b["extra_info"]["impl"]) for b in doc["benchmarks"]}
    assert ("graph", "reference") in impls and ("query", "reference") in impls
    assert any("latency_p99_s" in b["extra_info"] for b in doc["benchmarks"])
    assert any(b["extra_info"].get("speedup_vs_reference") for b in doc["benchmarks"])
    assert "slope (all)" in report
    assert "## Memory-bandwidth limit (this machine)" in report and "measured / limit" in report
    idx = next(b["extra_info"] for b in doc["benchmarks"] if b["group"] == "index"
               and b["extra_info"]["impl"] == "ours")
    assert 0 < idx["distinct_sessions"] <= idx["session_slots"]
    assert idx["tokens_encoded"] > idx["texts_encoded"] > 0  # every text has > 1 token
    assert f"{idx['distinct_sessions']} distinct sessions in" in report
    row = json.loads((out / "cugraph.json").read_text())  # cuGraph absent: the row says so
    assert row["ours_s"] > 0 and row["line"].startswith("cuGraph personalized PageRank")
    if importlib.util.find_spec("cugraph") is None and importlib.util.find_spec(
            "pylibcugraph") is None:
        assert "not importable" in row["cugraph"]


def test_gpu_suite_without_cuda_exits_2(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = importlib.util.spec_from_file_location("gpu_suite2", ROOT / "benchmarks" / "gpu_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", "unused"]) == 2
    assert "CUDA is not available" in capsys.readouterr().out


def test_cli_bench_subset(tmp_path):
    r = CliRunner().invoke(cli, ["bench", "--scale", "tiny", "--device", "cpu", "--stages",
                                 "graph,io", "--no-reference", "--quiet", "--out",
                                 str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "graph" in (tmp_path / "report.md").read_text()
    doc = json.loads((tmp_path / "results.json").read_text())
    assert {b["group"] for b in doc["benchmarks"]} == {"graph", "io_save", "io_load"}
    bad = CliRunner().invoke(cli, ["bench", "--stages", "graph,nope", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "nope" in bad.output


def test_cli_bench_durable_stage_reports_what_a_checkpoint_writes(tmp_path):
    """The durable stage at the tiny scale: every row, and a checkpoint after one add
    that writes a fraction of the folder (the first one after opening a saved folder
    reported apart)."""
    r = CliRunner().invoke(cli, ["bench", "--scale", "tiny", "--device", "cpu", "--stages",
                                 "durable", "--quiet", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    report = (tmp_path / "report.md").read_text()
    for op in ("add_session in RAM, 1 writer", "add_session durable, 8 writers",
               "fsync alone", "checkpoint after one add", "recovery"):
        assert f"| {op} |" in report, op
    ckpt = [line for line in report.splitlines() if line.startswith("| checkpoint after")]
    assert ckpt and all("the first after opening a saved folder" in line for line in ckpt)
    for line in ckpt:
        written = int(line.split(" bytes written")[0].split("| ")[-1])
        folder = int(line.split("folder ")[1].split(")")[0])
        assert 0 < written < folder, line


def test_wal_bench_runs_and_counts_one_fsync_per_lone_append(tmp_path):
    """benchmarks/wal_bench.py (its numbers are in docs/index-format.md) runs as the docs
    say; one thread appending alone pays one fsync per record, eight share them."""
    import os
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "wal_bench.py"),
                          "--appends", "16", "--bytes", "64", "--dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
            for r in run.stdout.splitlines() if r.startswith("| ") and "---" not in r}
    assert rows["append, 1 thread"][3] == "1.000 (16 for 16)"
    shared = rows["append, 8 threads"][3]
    assert shared.endswith("for 16)") and float(shared.split()[0]) <= 1.0
    assert {"write + fsync alone", "SQLite WAL, synchronous=FULL, 1 thread",
            "SQLite WAL, synchronous=FULL, 8 threads"} <= set(rows)
    assert not list(tmp_path.iterdir())  # its temporary folder is gone
