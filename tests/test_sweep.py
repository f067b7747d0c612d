"""`memgas sweep`: grid parsing, one batched run, ranked table, CSV/JSON, leave-one-out."""
from __future__ import annotations

import csv
import json

import click
import pytest
from click.testing import CliRunner

from memgas_gpu.cli.main import cli
from memgas_gpu.cli.sweep import parse_grid
from memgas_gpu.eval.sweep import leave_one_out, rank, run_sweep

pytest.importorskip("Stemmer")


def test_parse_grid():
    g = parse_grid(["alpha=15,30", "signals=bm25_S+dense_Tmax;lexical", "stopwords=en,none",
                    "temperature=0.5"])
    assert g["alpha"] == [15, 30] and g["temperature"] == [0.5]
    assert g["signals"][0] == ("bm25_S", "dense_Tmax") and "bm25_K" in g["signals"][1]
    assert g["stopwords"] == ["en", None]
    for bad in ("alpha", "colour=red", "alpha=x", "signals=bm25_Q"):
        with pytest.raises(click.BadParameter):
            parse_grid([bad])


def test_sweep_cli_writes_ranked_table_csv_json(locomo_index, tmp_path):
    _, idx = locomo_index
    src = tmp_path / "ix"
    idx.save(src)
    out = tmp_path / "res"
    res = CliRunner().invoke(cli, [
        "sweep", str(src), "--grid", "signals=default;bm25_S", "--grid", "fusion=sum,ppr",
        "--grid", "alpha=15,30", "--baselines", "--device", "cpu", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "18 settings" in res.output  # 8 grid points + 10 single signals
    assert "ranked by recall_all@3" in res.output
    rows = list(csv.reader(open(out.with_suffix(".csv"), encoding="utf-8")))
    head = rows[0]
    assert head[0] == "rank" and "recall_all@3" in head and "fusion" in head
    assert len(rows) - 1 == 8 + 10  # grid points + one row per single signal
    r3 = [float(r[head.index("recall_all@3")]) for r in rows[1:]]
    assert r3 == sorted(r3, reverse=True)
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["rank_by"] == "recall_all@3" and len(data["rows"]) == 18
    best = data["rows"][0]
    assert set(best["by_type"]) >= {"single-hop", "multi-hop", "temporal"}
    assert data["leave_one_out"] == {}  # a single conversation
    # per-type gains of rank 1 over the best baseline of each cell
    gains = data["gains"]
    assert {(g["type"], g["k"]) for g in gains} >= {("all", 3), ("single-hop", 10)}
    for g in gains:
        t, m = g["type"], f"recall_all@{g['k']}"
        vals = [(r[m] if t == "all" else r["by_type"][t][m]) for r in data["rows"]
                if r["settings"].get("baseline")]
        assert g["best_baseline"] == pytest.approx(100 * max(vals))
        assert g["gain"] == pytest.approx(g["ours"] - g["best_baseline"])
    assert "rank 1 against the best baseline" in res.output


def test_run_sweep_reuses_signals_and_matches_retrieve(locomo_index):
    from memgas_gpu.eval import evaluate
    from memgas_gpu.retrieve import retrieve

    _, idx = locomo_index
    rows = run_sweep(idx, {"fusion": ["ppr", "sum"], "temperature": [1.0]}, device="cpu")
    assert len(rows) == 2
    for row in rows:
        ev = evaluate(idx, retrieve(idx, method="memgas_hybrid", device="cpu",
                                    fusion=row["settings"]["fusion"]))
        assert row["recall_all@3"] == pytest.approx(ev.summary["all"]["recall_all@3"])


def test_leave_one_out_picks_on_other_conversations():
    def row(name, a, b):
        return {"settings": {"x": name}, "recall_all@3": 0,
                "by_conversation": {"c1": {"n": 10, "recall_all@3": a},
                                    "c2": {"n": 10, "recall_all@3": b}}}
    rows = rank([row("p", 0.9, 0.1), row("q", 0.2, 0.8)], "recall_all@3", (3,))
    loo = leave_one_out(rows, "recall_all@3")
    assert loo["by_conversation"]["c1"]["settings"] == {"x": "q"}  # chosen on c2
    assert loo["by_conversation"]["c1"]["held_out"] == 0.2
    assert loo["recall_all@3"] == pytest.approx((0.2 + 0.1) / 2)


def test_sweep_plain_bm25_baseline_equals_bm25s(locomo_list_path, tmp_path):
    """From a dataset, --baselines adds plain BM25 (bm25s's tokenizer defaults) and
    leaves the index's own (en_plus) lexical index in place."""
    import numpy as np
    import Stemmer
    import torch

    bm25s = pytest.importorskip("bm25s")
    from memgas_gpu import load_dataset
    from memgas_gpu.eval.metrics import gold_mask, retrieval_metrics

    out = tmp_path / "res"
    res = CliRunner().invoke(cli, [
        "sweep", str(locomo_list_path), "--conversations", "conv-30", "--summaries",
        "source", "--baselines", "--device", "cpu", "--k", "1,3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.with_suffix(".json").read_text())
    row = {r["settings"].get("signals"): r for r in data["rows"]}
    plain, bm25_s = row["bm25 (bm25s defaults)"], row["bm25_S"]
    assert plain["recall_all@1"] != bm25_s["recall_all@1"]  # en vs en_plus stopwords

    conv = load_dataset(locomo_list_path).get("conv-30")
    stem = Stemmer.Stemmer("english")
    r = bm25s.BM25()
    r.index(bm25s.tokenize([s.text for s in conv.sessions], stopwords="en", stemmer=stem,
                           show_progress=False), show_progress=False)
    q_tok = bm25s.tokenize([q.text for q in conv.questions], stopwords="en", stemmer=stem,
                           return_ids=False, show_progress=False)
    scores = torch.tensor(np.stack([r.get_scores([t for t in q if t in r.vocab_dict])
                                    for q in q_tok]))
    ranks = torch.argsort(scores, dim=1, descending=True, stable=True)
    rel, n_gold = gold_mask([[s.id for s in conv.sessions]] * len(conv.questions),
                            [q.evidence_session_ids for q in conv.questions], ranks.shape[1])
    ref = retrieval_metrics(ranks, rel, n_gold, ks=(1, 3))
    scored = torch.tensor([not q.is_abstention for q in conv.questions])
    for k in (1, 3):
        want = float(ref[f"recall_all@{k}"][scored].mean())
        assert plain[f"recall_all@{k}"] == pytest.approx(want)


def test_sweep_one_question_per_conversation_keeps_output_short(lme_sample_path, tmp_path):
    out = tmp_path / "lme"
    res = CliRunner().invoke(cli, ["sweep", str(lme_sample_path), "--grid", "temperature=1,2",
                                   "--device", "cpu", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "(40 conversations: per-conversation results in the JSON)" in res.output
    assert "locomo26_q0:" not in res.output
    loo = json.loads(out.with_suffix(".json").read_text())["leave_one_out"]
    assert len(loo["by_conversation"]) == 40


def test_sweep_on_the_quick_start_data_averages_as_eval_does(tmp_path):
    """The README's quick-start data holds a conversation whose only question is an
    abstention: the sweep printed ``nan`` for every leave-one-out number. Now each row
    equals ``memgas eval``'s own aggregate for the same settings, and the leave-one-out
    estimate is recomputed here from eval's per-question logs (abstentions left out,
    as eval leaves them out)."""
    from concurrent.futures import ThreadPoolExecutor

    from _hostile import run_cli, tiny_encoder
    from memgas_gpu import load_dataset
    from memgas_gpu.retrieve import MemoryIndex

    data, idx_dir = tmp_path / "demo.json", tmp_path / "demo.idx"
    res = run_cli("synth", "--out", data, "--questions", "10", "--sessions", "10",
                  "--turns", "4", "--words", "20", "-q")  # the README's quick start
    assert res.returncode == 0, res.stderr
    raw = json.loads(data.read_text())
    abstentions = {d["question_id"] for d in raw if d["question_id"].endswith("_abs")}
    assert abstentions  # the case is in the data
    MemoryIndex.build(load_dataset(data), tiny_encoder(tmp_path / "bert"), device="cpu",
                      progress=False).save(idx_dir)
    damping = ("0.1", "0.3")

    def sweep():
        return run_cli("sweep", idx_dir, "--grid", f"damping={','.join(damping)}",
                       "--k", "1,3,10", "--device", "cpu", "--out", tmp_path / "sw", "-q")

    def evaluate(d):
        return run_cli("eval", idx_dir, "--damping", d, "--k", "1,3,10", "--device", "cpu",
                       "--out", tmp_path / f"e{d}.jsonl", "-q")

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda f: f(), [sweep] + [lambda d=d: evaluate(d)
                                                        for d in damping]))
    for r in runs:
        assert r.returncode == 0, r.stderr
    out = runs[0].stdout
    assert "nan" not in out.lower(), out
    doc = json.loads((tmp_path / "sw.json").read_text())
    evals = {}
    for d in damping:
        summary = json.loads((tmp_path / f"e{d}.metrics.json").read_text())[
            "methods"]["memgas_hybrid"]["all"]
        logs = [json.loads(x) for x in (tmp_path / f"e{d}.jsonl").read_text().splitlines()]
        evals[float(d)] = (summary, logs)
    assert len(doc["rows"]) == len(damping)
    for row in doc["rows"]:
        summary, _ = evals[row["settings"]["damping"]]
        assert summary["n"] == len(raw) - len(abstentions)
        for k in (1, 3, 10):  # at k = 1 the abstention (2 gold sessions) would count 0
            assert row[f"recall_all@{k}"] == pytest.approx(summary[f"recall_all@{k}"])
    top = doc["rows"][0]
    assert 0 < top["recall_all@1"] < 1  # a number the averaging rule changes
    assert f"{round(100 * top['recall_all@1'], 2)}" in out.splitlines()[2]
    # leave-one-conversation-out from eval's per-question logs
    by = "recall_all@1"
    per = {d: {} for d in evals}  # setting -> conversation -> values of its questions
    skipped = set()
    for d, (_, logs) in evals.items():
        for rec in logs:
            if rec["question_id"] in abstentions:
                skipped.add(rec["conversation_id"])
                continue
            per[d].setdefault(rec["conversation_id"], []).append(
                rec["retrieval_results"]["metrics"]["session"][by])
    loo = doc["leave_one_out"]
    convs = set(per[0.1])
    assert set(loo["by_conversation"]) == convs and set(loo["skipped"]) == skipped - convs
    assert skipped - convs  # an abstention-only conversation, left out

    def mean(xs):
        return sum(xs) / len(xs)

    total = []
    for c in convs:
        train = {d: mean([v for c2, vs in per[d].items() if c2 != c for v in vs])
                 for d in per}
        best = max(train.values())
        got = loo["by_conversation"][c]
        assert got["train"] == pytest.approx(best)
        assert any(got["held_out"] == pytest.approx(mean(per[d][c])) for d in per
                   if train[d] == pytest.approx(best))
        total += [got["held_out"]] * len(per[0.1][c])
    assert loo[by] == pytest.approx(mean(total))
    assert f"leave-one-conversation-out {by}: {100 * loo[by]:.2f}" in out
    left_out = [ln for ln in out.splitlines() if "only abstention questions" in ln]
    assert len(left_out) == 1 and all(c in left_out[0] for c in skipped - convs), out


def test_a_metric_over_no_question_prints_as_a_dash():
    """Only abstention questions: the average is NaN, shown as ``-`` (as ``memgas
    eval`` shows an empty row), never ``nan``."""
    from memgas_gpu.cli.sweep import format_ranked

    nan = float("nan")
    rows = [{"settings": {"damping": 0.1}, "recall_all@3": nan, "by_type": {}},
            {"settings": {"damping": 0.3}, "recall_all@3": 0.5, "by_type": {}}]
    lines = format_ranked(rows, (3,), top=2).splitlines()
    assert lines[1].split() == ["1", "0.1", "-"] and lines[2].split() == ["2", "0.3", "50.0"]
