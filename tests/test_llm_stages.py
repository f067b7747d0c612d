"""LLM stages end to end against the fake server: expand, answer, judge, qa-eval."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from click.testing import CliRunner  # noqa: E402

import memgas_gpu as mg  # noqa: E402
from memgas_gpu.cli.main import cli  # noqa: E402
from memgas_gpu.data.model import Conversation, Dataset, Question, Session  # noqa: E402
from memgas_gpu.expand import expand_dataset, reference_key  # noqa: E402
from memgas_gpu.llm import (ChatClient, LLMConfig, LLMSource, dialogue_style,  # noqa: E402
                            expansion_paths, write_expansion_files)
from memgas_gpu.llm.prompts import answer_prompt, expansion_prompt  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _openai_server import FakeOpenAI, rule_answer  # noqa: E402

SECRET = "sk-test-SECRET-5b1e0d44"


@pytest.fixture
def server():
    with FakeOpenAI() as srv:
        yield srv


@pytest.fixture(scope="module")
def lme(lme_sample_path):
    return mg.load_dataset(lme_sample_path)


def _client(srv, cache=None):
    return ChatClient(LLMConfig(model="fake", base_url=srv.base_url, api_key=SECRET,
                                backoff=0.001), cache=cache, progress=False)


def _run(args, env_key=True):
    env = {"OPENAI_API_KEY": SECRET} if env_key else {}
    res = CliRunner().invoke(cli, [str(a) for a in args], env=env, catch_exceptions=False)
    return res


# --- summaries and keywords -----------------------------------------------------------
def test_prompts_follow_the_paper():
    p = expansion_prompt("summary", ["t1", "t2"], "user-user")
    assert p.startswith("Below is an user-user dialogue memory. Please summarize the "
                        "following dialogue as concisely as possible in a short paragraph")
    assert p.endswith("t1\n\nt2\n\nYour answer:")
    k = expansion_prompt("keywords", ["t"], "user-ai")
    assert "user-AI assistant dialogue memory. Please extract the most relevant keywords, " \
           "separated by semicolon." in k
    a = answer_prompt("When?", "22 October 2023", "history")
    assert "Question Date: 22 October 2023\nQuestion: When?" in a
    with pytest.raises(ValueError):
        expansion_prompt("summary", [], "robots")


def test_dialogue_style(lme, locomo_list_path):
    assert dialogue_style(lme) == "user-ai"
    assert dialogue_style("locomo_flat") == "user-user"


def test_llm_source_plugs_into_expand_dataset(server, lme):
    src = LLMSource(_client(server), dialogue_style(lme))
    exp = expand_dataset(lme, summaries=src, keywords=src)
    n = len(lme.distinct_sessions())
    assert server.requests == 2 * n == 38  # once per distinct session, not per haystack
    conv = lme[0]
    for s, u, k in zip(conv.sessions, exp.summaries[conv.id], exp.keywords[conv.id]):
        assert u == rule_answer(expansion_prompt("summary", s.turns, "user-ai")).strip()
        assert k == rule_answer(expansion_prompt("keywords", s.turns, "user-ai")).strip()
    cfg = exp.config["summaries"]
    assert cfg["name"] == "llm" and cfg["model"] == "fake" and cfg["dialogue"] == "user-ai"
    assert SECRET not in json.dumps(exp.config)


def test_expansion_paths(tmp_path):
    assert expansion_paths(tmp_path) == (tmp_path / "summary_level.jsonl",
                                         tmp_path / "keyword_level.jsonl")
    assert expansion_paths(f"{tmp_path}/new/") == (tmp_path / "new" / "summary_level.jsonl",
                                                   tmp_path / "new" / "keyword_level.jsonl")
    assert expansion_paths(tmp_path / "lme")[1] == tmp_path / "lme-keyword_level.jsonl"


def test_expand_cli_writes_files_the_index_reads(server, lme, lme_sample_path, tmp_path,
                                                 caplog):
    cache = tmp_path / "cache.sqlite"
    server.inject("429", retry_after=0)  # a retry, so its log line is searched too
    with caplog.at_level(logging.DEBUG):
        res = _run(["expand", lme_sample_path, "--llm-model", "fake", "--base-url",
                    server.base_url, "--cache", cache, "--out", tmp_path / "lme"])
    assert res.exit_code == 0, res.output
    su, kw = tmp_path / "lme-summary_level.jsonl", tmp_path / "lme-keyword_level.jsonl"
    lines = [json.loads(x) for x in su.read_text().splitlines()]
    assert len(lines) == 19 and all(len(x) == 1 for x in lines)
    assert "locomo26_session_1" in {k for x in lines for k in x}  # LongMemEval: session ids
    exp = expand_dataset(lme, summaries=str(su), keywords=str(kw))
    direct = expand_dataset(lme, summaries=LLMSource(_client(server, cache)),
                            keywords=LLMSource(_client(server, cache)))
    assert exp.summaries == direct.summaries and exp.keywords == direct.keywords
    assert server.auth and all(a == f"Bearer {SECRET}" for a in server.auth)
    # the key never shows: output, logs, written files, cache (and its WAL)
    assert "retry 1/6" in caplog.text
    blobs = [res.output, caplog.text] + [p.read_bytes().decode("latin-1")
                                         for p in tmp_path.iterdir() if p.is_file()]
    assert cache.exists() and len(blobs) >= 4  # both outputs and the cache file(s)
    for b in blobs:
        assert SECRET not in b
    # a rerun costs nothing
    server.reset_counts()
    res = _run(["expand", lme_sample_path, "--llm-model", "fake", "--base-url",
                server.base_url, "--cache", cache, "--out", tmp_path / "again"])
    assert res.exit_code == 0 and server.requests == 0
    assert "38 cache hits" in res.output


def test_expand_cli_locomo_user_user_reference_keys(server, locomo_list_path, tmp_path):
    res = _run(["expand", locomo_list_path, "--llm-model", "fake", "--base-url",
                server.base_url, "--no-cache", "--out", f"{tmp_path}/out/",
                "--concurrency", "16"])
    assert res.exit_code == 0, res.output
    ds = mg.load_dataset(locomo_list_path)
    keys = [next(iter(json.loads(x))) for x in
            (tmp_path / "out" / "summary_level.jsonl").read_text().splitlines()]
    assert keys[0] == reference_key(ds[0].id, ds[0].sessions[0].id)
    assert len(keys) == sum(len(c.sessions) for c in ds)
    assert all("user-user dialogue memory" in p for p in server.prompts)
    exp = expand_dataset(ds, summaries=str(tmp_path / "out" / "summary_level.jsonl"),
                         keywords=str(tmp_path / "out" / "keyword_level.jsonl"))
    assert exp.keywords[ds[0].id][0].startswith("Caroline; ")


def test_same_id_different_content_gets_reference_key(server, tmp_path):
    a, b = Session("s1", "d", ("[user]: A",)), Session("s1", "d", ("[user]: B",))
    ds = Dataset([Conversation("q1", [a], [Question("q1", "?")]),
                  Conversation("q2", [b], [Question("q2", "?")]),
                  Conversation("q3", [a], [Question("q3", "?")])], format="longmemeval")
    su, kw = write_expansion_files(ds, LLMSource(_client(server)), f"{tmp_path}/")
    keys = [next(iter(json.loads(x))) for x in su.read_text().splitlines()]
    assert keys == ["s1", reference_key("q2", "s1")]
    exp = expand_dataset(ds, summaries=str(su), keywords=str(kw))
    assert exp.summaries["q1"] == exp.summaries["q3"] != exp.summaries["q2"]
    assert "[user]: B" in exp.summaries["q2"][0]


# --- answers ------------------------------------------------------------------------
def _retrieval_log(ds, path, qids, k=3):
    """A hand-written `memgas eval --out` log: gold session first, then the others from
    the last one back (so the log's order is not the dataset's), ``k + 2`` in all."""
    with open(path, "w", encoding="utf-8") as f:
        for c in ds:
            for q in c.questions:
                if q.id not in qids:
                    continue
                ids = [s.id for s in c.sessions]
                gold = list(q.evidence_session_ids)
                ranked = gold + [i for i in reversed(ids) if i not in gold]
                items = [{"corpus_id": i, "timestamp": c.sessions[ids.index(i)].date}
                         for i in ranked[:k + 2]]
                f.write(json.dumps({
                    "question_id": q.id, "question_type": q.type, "question": q.text,
                    "answer": q.answer, "question_date": q.date, "conversation_id": c.id,
                    "answer_session_ids": gold,
                    "retrieval_results": {"query": q.text, "ranked_items": items,
                                          "metrics": {"session": {}, "turn": {}}}}) + "\n")
    return path


def _log_ids(path) -> dict:
    """question id -> ranked session ids of a retrieval log."""
    return {r["question_id"]: [x["corpus_id"] for x in r["retrieval_results"]["ranked_items"]]
            for r in map(json.loads, Path(path).read_text().splitlines())}


QIDS = ("locomo26_q0", "locomo26_q1", "locomo26_q2", "locomo26_q5")


def test_answer_cli_end_to_end(server, lme, lme_sample_path, tmp_path):
    cache = tmp_path / "c.sqlite"
    log = _retrieval_log(lme, tmp_path / "results.jsonl", QIDS)
    assert _run(["expand", lme_sample_path, "--llm-model", "fake", "--base-url",
                 server.base_url, "--cache", cache, "--out", tmp_path / "x"]).exit_code == 0
    server.reset_counts()
    hyp = tmp_path / "hyp.jsonl"
    res = _run(["answer", lme_sample_path, "--retrieval", log, "--top-k", 2,
                "--summaries", tmp_path / "x-summary_level.jsonl",
                "--keywords", tmp_path / "x-keyword_level.jsonl", "--llm-model", "fake",
                "--base-url", server.base_url, "--cache", cache, "--out", hyp, "--judge"])
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in hyp.read_text().splitlines()]
    assert [r["question_id"] for r in recs] == list(QIDS)
    filters = [p for p in server.prompts if "Filter the History Dialogs" in p]
    answers = [p for p in server.prompts if "concise, coherent and helpful" in p]
    judges = [p for p in server.prompts if "yes or no only" in p]
    assert len(filters) == len(answers) == len(judges) == len(QIDS)
    q0 = lme.get("locomo26_q0")
    f0 = next(p for p in filters if q0.questions[0].text in p)
    assert f0.count("### Session Date:") == 2 and "Session Summary:\nSummary: " in f0
    assert "Session Keyword:\n" in f0 and "Question Date: 9:55 am on 22 October, 2023" in f0
    for r in recs:
        assert r["hypothesis"].startswith("answer-") and r["filtered_context"]
        assert r["retrieved_session_ids"] == _log_ids(log)[r["question_id"]][:2]
        ans_prompt = next(p for p in answers if r["filtered_context"] in p)
        assert r["hypothesis"] == rule_answer(ans_prompt)
    qa = json.loads((tmp_path / "hyp.qa.json").read_text())
    assert qa["overall"]["n"] == 4 and qa["overall"]["judge"] == 1.0
    assert "temporal-reasoning" in qa["by_type"] and "judge" in res.output
    # rerun: everything cached
    server.reset_counts()
    assert _run(["answer", lme_sample_path, "--retrieval", log, "--llm-model", "fake",
                 "--base-url", server.base_url, "--cache", cache, "--out", hyp, "--top-k",
                 2, "--summaries", tmp_path / "x-summary_level.jsonl", "--keywords",
                 tmp_path / "x-keyword_level.jsonl"]).exit_code == 0
    assert server.requests == 0


def test_answer_no_filter(server, lme, lme_sample_path, tmp_path):
    log = _retrieval_log(lme, tmp_path / "r.jsonl", QIDS[:2], k=6)
    res = _run(["answer", lme_sample_path, "--retrieval", log, "--no-filter", "--llm-model",
                "fake", "--base-url", server.base_url, "--no-cache", "--out",
                tmp_path / "h.jsonl"])
    assert res.exit_code == 0, res.output
    assert server.requests == 2
    assert not any("Filter the History" in p for p in server.prompts)
    rec = json.loads((tmp_path / "h.jsonl").read_text().splitlines()[0])
    assert len(_log_ids(log)[rec["question_id"]]) == 8
    assert rec["retrieved_session_ids"] == _log_ids(log)[rec["question_id"]][:5]  # default 5
    assert rec["filtered_context"].count("### Session Date:") == 5
    assert "Session Summary" not in rec["filtered_context"]


@pytest.mark.parametrize("line,match", [
    ("{not json", "invalid JSON"),
    ('{"question_id": "locomo26_q0"}', "retrieval_results"),
    ('{"question_id": "nope", "retrieval_results": {"ranked_items": []}}',
     "question not in the dataset"),
    ('{"question_id": "locomo26_q0", "conversation_id": "locomo26_q0", "retrieval_results": '
     '{"ranked_items": [{"corpus_id": "ghost"}]}}', "retrieved session 'ghost'"),
])
def test_answer_bad_retrieval_log(server, lme_sample_path, tmp_path, line, match):
    log = tmp_path / "bad.jsonl"
    log.write_text(line + "\n")
    res = _run(["answer", lme_sample_path, "--retrieval", log, "--llm-model", "fake",
                "--base-url", server.base_url, "--no-cache", "--out", tmp_path / "h.jsonl"])
    assert res.exit_code == 2 and match in res.output
    assert server.requests == 0


def test_answer_reports_bad_response_and_missing_model(server, lme, lme_sample_path,
                                                       tmp_path, monkeypatch):
    log = _retrieval_log(lme, tmp_path / "r.jsonl", QIDS[:1])
    server.inject("no_choices")
    res = _run(["answer", lme_sample_path, "--retrieval", log, "--llm-model", "fake",
                "--base-url", server.base_url, "--no-cache", "--out", tmp_path / "h.jsonl"])
    assert res.exit_code == 2 and "filter for question 'locomo26_q0'" in res.output
    assert not (tmp_path / "h.jsonl").exists()
    monkeypatch.delenv("MEMGAS_LLM_MODEL", raising=False)
    res = _run(["answer", lme_sample_path, "--retrieval", log, "--base-url",
                server.base_url, "--no-cache", "--out", tmp_path / "h.jsonl"])
    assert res.exit_code == 2 and "MEMGAS_LLM_MODEL" in res.output


def test_qa_eval_cli(server, lme, lme_sample_path, tmp_path):
    qs = {q.id: q for q in lme.questions}
    hyp = tmp_path / "hyp.jsonl"
    hyp.write_text("".join(json.dumps({"question_id": qid, "hypothesis": h}) + "\n" for qid, h in
                           [("locomo26_q0", qs["locomo26_q0"].answer),
                            ("locomo26_q1", "WRONG answer")]))
    res = _run(["qa-eval", hyp, lme_sample_path, "--out", tmp_path / "m.json"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["overall"]["n"] == 2 and m["overall"]["f1"] == 0.5 and "judge" not in m["overall"]
    res = _run(["qa-eval", hyp, lme_sample_path, "--judge-model", "judge", "--base-url",
                server.base_url, "--no-cache", "--out", tmp_path / "m.json"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["overall"]["judge"] == 0.5
    assert m["verdicts"] == {"locomo26_q0": True, "locomo26_q1": False}
    assert server.payloads[0]["model"] == "judge" and server.payloads[0]["max_tokens"] == 10
    hyp.write_text('{"question_id": "zzz", "hypothesis": "x"}\n')
    res = _run(["qa-eval", hyp, lme_sample_path])
    assert res.exit_code == 2 and "not in the dataset" in res.output
