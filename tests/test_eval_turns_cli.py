"""``memgas eval DATA --method gam --turns``: GAM and the session methods at the turn level
on a small hand-made LoCoMo-format conversation, with the logs' ``metrics.turn``."""
from __future__ import annotations

import json

from click.testing import CliRunner

from memgas_gpu.cli.main import cli

TOPICS = ["my sourdough starter and rye flour", "the marathon training plan for April",
          "adopting a grey kitten named Pixel", "repairing the bicycle chain and brakes",
          "a trip to Lisbon with tiles and custard tarts", "learning the cello with a teacher"]


def _locomo(path):
    conv = {"speaker_a": "Ana", "speaker_b": "Ben"}
    for n, topic in enumerate(TOPICS, 1):
        conv[f"session_{n}"] = [
            {"speaker": "Ana", "dia_id": f"D{n}:1", "text": f"Guess what, I started {topic}."},
            {"speaker": "Ben", "dia_id": f"D{n}:2", "text": "Nice, tell me more about it!"},
            {"speaker": "Ana", "dia_id": f"D{n}:3", "text": f"Well, {topic} takes time."},
            {"speaker": "Ben", "dia_id": f"D{n}:4", "text": "Good luck with that."}]
        conv[f"session_{n}_date_time"] = f"1:00 pm on {n} May, 2023"
    qa = [{"question": "What did Ana adopt?", "answer": "a kitten", "evidence": ["D3:1"],
           "category": 4},
          {"question": "Which city did Ana see on her trip?", "answer": "Lisbon", "evidence": ["D5:1"],
           "category": 4}]
    path.write_text(json.dumps([{"sample_id": "conv-x", "conversation": conv, "qa": qa}]))
    return path


def test_eval_gam_and_turn_metrics(tmp_path):
    data = _locomo(tmp_path / "x.json")
    out = tmp_path / "log.jsonl"
    r = CliRunner().invoke(cli, ["eval", str(data), "--method", "gam", "--method", "bm25",
                                 "--turns", "--device", "cpu", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "== gam (2 questions; utterance-level)" in r.output
    m = json.loads((tmp_path / "log.metrics.json").read_text())["methods"]
    # both questions quote their evidence message: found first by BM25 and by GAM
    assert m["gam"]["turn"]["recall_all@5"] == 1.0 and m["gam"]["turn"]["n"] == 2
    assert m["bm25"]["turn"]["recall_all@5"] == 1.0
    assert m["bm25"]["all"]["recall_all@1"] == 1.0
    for method in ("gam", "bm25"):
        lines = [json.loads(x) for x in (tmp_path / f"log.{method}.jsonl").read_text()
                 .splitlines()]
        assert len(lines) == 2
        assert all(x["retrieval_results"]["metrics"]["turn"]["recall_all@5"] == 1.0
                   for x in lines)
    gam_log = [json.loads(x) for x in (tmp_path / "log.gam.jsonl").read_text().splitlines()]
    assert gam_log[0]["retrieval_results"]["ranked_items"][0]["corpus_id"] == "session_3:0"
    assert gam_log[1]["retrieval_results"]["ranked_items"][0]["corpus_id"] == "session_5:0"


def test_gam_needs_a_dataset(tmp_path):
    idx = tmp_path / "idx"
    r = CliRunner().invoke(cli, ["index", str(_locomo(tmp_path / "x.json")), "--out", str(idx),
                                 "--device", "cpu"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["eval", str(idx), "--method", "gam"])
    assert r.exit_code == 2 and "need DATA" in r.output

