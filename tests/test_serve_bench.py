"""``memgas bench --stages serve`` at a tiny size: every point measured, batching on and
off, in process and over real HTTP, the two-tenant fairness scenario (fairness on, off,
and no flood) and the batch add, and every answer checked against a direct search (the
checker itself is checked: it must see a wrong answer)."""
from __future__ import annotations

import copy
import os

from memgas_gpu.bench.serve import same_answer, serve_point, serve_rows
from memgas_gpu.retrieve import SearchResult


def test_the_answer_check_sees_wrong_answers():
    want = SearchResult("c", ["s1", "s2"], [0.5, 0.25], [[], []])
    assert same_answer(want.to_dict(), want)
    near = copy.deepcopy(want.to_dict())
    near["scores"][1] += 1e-7
    assert same_answer(near, want)
    for change in (lambda d: d["session_ids"].reverse(), lambda d: d["session_ids"].pop(),
                   lambda d: d["scores"].__setitem__(0, 0.51),
                   lambda d: d["scores"].__setitem__(1, 0.2501)):
        d = copy.deepcopy(want.to_dict())
        change(d)
        assert not same_answer(d, want), d


def test_serve_stage_measures_every_point_and_every_answer_is_right(tmp_path):
    logged = []
    recs = serve_point(5, 8, 30, clients=(1, 3), requests=9, inprocess_threads=3,
                       distinct=8, tmp=str(tmp_path), flood=(2, 512), add_sessions=6,
                       add_rounds=2, log=logged.append)
    assert sorted(os.listdir(tmp_path)) == ["serve_bert", "serve_memory"]  # add: removed
    fair = {r.impl: r for r in recs if r.impl.startswith("fairness ")}
    add = {r.impl: r for r in recs if r.impl.startswith("add ")}
    recs = [r for r in recs if r.impl.startswith(("in-process ", "http "))]
    got = {(r.impl, r.size["clients"]) for r in recs}
    assert got == {("in-process batched", 3), ("in-process direct", 3),
                   ("http batched", 1), ("http batched", 3), ("http direct", 1),
                   ("http direct", 3)}
    # fairness: the small tenant's 9 answers right each time; while the flood keeps up to
    # 1,024 questions (16 batches) queued, it waits about 2 batches with fairness, many
    # more without
    assert set(fair) == {"fairness alone", "fairness on", "fairness off"}
    for r in fair.values():
        assert r.extra["requests"] == 9 and r.extra["mismatches"] == 0, r.impl
        assert r.extra["p99_ms"] >= r.extra["p50_ms"] > 0
    assert fair["fairness alone"].extra["flood_qps"] == 0
    assert fair["fairness on"].extra["flood_qps"] > 0
    assert fair["fairness off"].extra["flood_qps"] > 0
    on, off = fair["fairness on"].extra, fair["fairness off"].extra
    assert on["batches_waited_max"] <= 2 < off["batches_waited_max"]  # the in-flight + its own
    assert on["batches_waited_mean"] < off["batches_waited_mean"]
    assert on["p50_ms"] < off["p50_ms"]
    assert set(add) == {"add batched", "add single"}
    for r in add.values():
        assert r.work == 6 and r.unit == "sessions" and len(r.times) == 2
        assert r.extra["per_session_ms"] > 0
    for r in recs:
        assert r.stage == "serve" and r.work == 9 and r.extra["requests"] == 9
        assert r.extra["mismatches"] == 0, r.impl
        assert r.extra["qps"] > 0 and r.extra["p99_ms"] >= r.extra["p50_ms"] > 0
        if "direct" in r.impl:
            assert r.extra["mean_batch_size"] == 1.0
        else:
            assert 1.0 <= r.extra["mean_batch_size"] <= r.size["clients"]
    rows = serve_rows(recs + list(fair.values()) + list(add.values()))
    assert sum(row.startswith("| in-process") or row.startswith("| http") for row in rows) == 6
    assert all("| yes |" in row for row in rows if row.startswith(("| in-process", "| http")))
    assert any("stated at 64 clients" in row for row in rows)
    assert sum(row.startswith(("| no flood |", "| on |", "| off |")) for row in rows) == 3
    assert any("p99 with fairness" in row for row in rows)
    assert any("one add_sessions" in row for row in rows)
    assert len(logged) == 6 + 3 + 2
