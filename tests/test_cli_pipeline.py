"""`memgas index` and `memgas eval` end to end on a real LoCoMo conversation."""
from __future__ import annotations

import json

from click.testing import CliRunner

from memgas_gpu.cli.main import cli


def test_index_then_eval(tmp_path, locomo_flat_dir):
    runner = CliRunner()
    out = tmp_path / "idx"
    r = runner.invoke(cli, ["index", str(locomo_flat_dir / "30.json"), "--out", str(out),
                            "--summaries", "source", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    pointer = json.loads((out / "manifest.json").read_text())  # format 4: one commit
    assert pointer["version"] == 4 and (out / "data" / f"{pointer['root'][0]:08d}.pack").exists()
    assert [p.name for p in (out / "wal").glob("*.log")]  # and an empty log
    assert "1 conversations, 19 sessions, 105 questions" in r.output
    res = tmp_path / "results.jsonl"
    r = runner.invoke(cli, ["eval", str(out), "--method", "memgas", "--method", "session",
                            "--out", str(res), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "== memgas (105 questions)" in r.output and "recall_all@5" in r.output
    assert "single-hop" in r.output  # per question type rows
    lines = (tmp_path / "results.memgas.jsonl").read_text().splitlines()
    assert len(lines) == 105
    rec = json.loads(lines[0])
    for key in ("question_id", "question_type", "question", "answer", "question_date",
                "answer_session_ids", "retrieval_results"):
        assert key in rec
    rr = rec["retrieval_results"]
    assert len(rr["ranked_items"]) == 19 and set(rr["ranked_items"][0]) == {"corpus_id",
                                                                           "timestamp"}
    assert set(rr["metrics"]["session"]) == {f"{m}@{k}" for k in (1, 3, 5, 10, 30, 50)
                                             for m in ("recall_any", "recall_all",
                                                       "ndcg_any")}
    metrics = json.loads((tmp_path / "results.metrics.json").read_text())
    assert set(metrics["methods"]) == {"memgas", "session"}
    mean = sum(json.loads(x)["retrieval_results"]["metrics"]["session"]["recall_all@5"]
               for x in lines) / 105
    assert abs(metrics["methods"]["memgas"]["all"]["recall_all@5"] - mean) < 1e-12


def test_eval_accepts_a_dataset_and_rejects_bad_input(tmp_path, locomo_flat_dir):
    runner = CliRunner()
    r = runner.invoke(cli, ["eval", str(locomo_flat_dir / "30.json"), "--method", "summary",
                            "--summaries", "source", "--device", "cpu", "--k", "1,5"])
    assert r.exit_code == 0, r.output
    assert "recall_all@5" in r.output
    r = runner.invoke(cli, ["eval", str(locomo_flat_dir / "30.json"), "--method", "bm42"])
    assert r.exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text('[{"question_id": "x", "haystack_sessions": 3')
    r = runner.invoke(cli, ["eval", str(bad)])
    assert r.exit_code == 2 and "bad.json" in r.output
    assert not list(tmp_path.glob("*.jsonl"))
