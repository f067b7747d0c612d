"""``memgas bench --stages serve`` at a tiny size: every point measured, batching on and
off, in process and over real HTTP, and every answer checked against a direct search
(the checker itself is checked: it must see a wrong answer)."""
from __future__ import annotations

import copy

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
                       distinct=8, tmp=str(tmp_path), log=logged.append)
    got = {(r.impl, r.size["clients"]) for r in recs}
    assert got == {("in-process batched", 3), ("in-process direct", 3),
                   ("http batched", 1), ("http batched", 3), ("http direct", 1),
                   ("http direct", 3)}
    for r in recs:
        assert r.stage == "serve" and r.work == 9 and r.extra["requests"] == 9
        assert r.extra["mismatches"] == 0, r.impl
        assert r.extra["qps"] > 0 and r.extra["p99_ms"] >= r.extra["p50_ms"] > 0
        if "direct" in r.impl:
            assert r.extra["mean_batch_size"] == 1.0
        else:
            assert 1.0 <= r.extra["mean_batch_size"] <= r.size["clients"]
    rows = serve_rows(recs)
    assert sum(row.startswith("| in-process") or row.startswith("| http") for row in rows) == 6
    assert all("| yes |" in row for row in rows if row.startswith(("| in-process", "| http")))
    assert any("stated at 64 clients" in row for row in rows)
    assert len(logged) == 6
