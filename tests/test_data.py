"""Loaders on the LoCoMo and LongMemEval-format dev data (real or stand-in), and every
malformed-input case."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from memgas_gpu import DataFormatError, load_dataset
from memgas_gpu.cli.main import cli
from memgas_gpu.data import detect_format, pair_messages
from memgas_gpu.stats import dataset_stats


def _sessions(c):
    return [(s.id, s.date, s.turns) for s in c.sessions]


# --- LoCoMo -----------------------------------------------------------------------

def test_locomo_layouts_load_identically(locomo_list_path, locomo_flat_dir):
    a = load_dataset(locomo_list_path)
    b = load_dataset(locomo_flat_dir)
    assert a.format == b.format == "locomo"
    assert [c.id for c in a] == [c.id for c in b] == ["conv-26", "conv-30", "conv-41"]
    for ca, cb in zip(a, b):
        assert _sessions(ca) == _sessions(cb)
        assert ca.questions == cb.questions
    # a single flat file loads too, with the id from its file name
    one = load_dataset(locomo_flat_dir / "30.json")
    assert [c.id for c in one] == ["conv-30"] and _sessions(one[0]) == _sessions(a[1])


def test_locomo_turn_text_and_questions_follow_reference(locomo_list_path):
    raw = json.loads(locomo_list_path.read_text())
    ds = load_dataset(locomo_list_path)
    for rec, conv in zip(raw, ds):
        c = rec["conversation"]
        nums = sorted(int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k))
        assert [s.id for s in conv.sessions] == [f"session_{n}" for n in nums]
        for n, s in zip(nums, conv.sessions):
            msgs = []
            for d in c[f"session_{n}"]:
                m = f"[{d['speaker']}]: {d['text']}"
                if "blip_caption" in d:
                    m += f"\n The image Caption: {d['blip_caption']}"
                msgs.append(m)
            expect = [msgs[i] + "\n" + msgs[i + 1] if i + 1 < len(msgs) else msgs[i]
                      for i in range(0, len(msgs), 2)]
            assert list(s.turns) == expect
            assert s.text == "\n".join(expect)
            assert s.date == c[f"session_{n}_date_time"]
        assert len(conv.questions) == len(rec["qa"])
        for q, rq in zip(conv.questions, rec["qa"]):
            assert q.text == rq["question"]
            if "adversarial_answer" in rq:
                assert q.answer == str(rq["adversarial_answer"]) and q.type == "adversarial"
            gold = []
            for e in rq.get("evidence", []):
                m = re.fullmatch(r"D(\d+):(\d+)", e)
                if m:
                    gold.append(f"session_{int(m.group(1))}")
            assert list(q.evidence_session_ids) == list(dict.fromkeys(gold))
    # the malformed evidence entry in the real data is skipped, as the reference does
    q = [q for c in raw for q in c["qa"] if "D8:6; D9:17" in q["evidence"]]
    assert q


def test_pair_messages_odd_count():
    assert pair_messages(["a", "b", "c"]) == ("a\nb", "c")
    assert pair_messages([]) == ()


# --- LongMemEval ------------------------------------------------------------------

def test_longmemeval_sample(lme_sample_path):
    raw = json.loads(lme_sample_path.read_text())
    ds = load_dataset(lme_sample_path)
    assert ds.format == "longmemeval" and len(ds) == 40
    assert [c.id for c in ds] == [r["question_id"] for r in raw]
    distinct = ds.distinct_sessions()
    assert len(distinct) == 19  # 40 haystacks share the same 19 sessions
    for r, c in zip(raw, ds):
        assert [s.id for s in c.sessions] == [i.replace("answer_", "", 1)
                                            if i.startswith("answer_") else i
                                            for i in r["haystack_session_ids"]]
        assert [s.date for s in c.sessions] == r["haystack_dates"]
        q = c.questions[0]
        assert q.text == r["question"] and q.type == r["question_type"]
        assert list(q.evidence_session_ids) == [g.replace("answer_", "") for g in
                                                r["answer_session_ids"]]
        assert not any(s.startswith("answer_") for s in q.evidence_session_ids)
        first = r["haystack_sessions"][0]
        assert c.sessions[0].turns[0] == (f"[{first[0]['role']}]: {first[0]['content']}\n"
                                          f"[{first[1]['role']}]: {first[1]['content']}")
    # shared content: same id → one turns tuple in every haystack
    by_id = {}
    for c in ds:
        for s in c.sessions:
            assert by_id.setdefault(s.id, s.turns) is s.turns


def _write(tmp_path: Path, name: str, data) -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def _lme_records(lme_sample_path, n=3):
    return json.loads(lme_sample_path.read_text())[:n]


def test_longmemeval_abstention_and_derived_gold(tmp_path, lme_sample_path):
    recs = _lme_records(lme_sample_path)
    recs[1]["question_id"] += "_abs"
    del recs[2]["answer_session_ids"]  # derived from has_answer flags, like the reference
    flagged = [sid.replace("answer_", "") for sid, sess in
               zip(recs[2]["haystack_session_ids"], recs[2]["haystack_sessions"])
               if any(m.get("has_answer") for m in sess)]
    ds = load_dataset(_write(tmp_path, "lme.json", recs))
    assert [q.is_abstention for q in ds.questions] == [False, True, False]
    assert list(ds[2].questions[0].evidence_session_ids) == list(dict.fromkeys(flagged))


def test_longmemeval_user_only(tmp_path, lme_sample_path):
    ds = load_dataset(lme_sample_path, user_only=True)
    assert all(t.startswith("[user]: ") and "[assistant]" not in t
               for s in ds[0].sessions for t in s.turns)


# --- Long-MT-Bench+ ---------------------------------------------------------------

def test_longmtbench(tmp_path):
    data = [{"conversation_id": 7, "sessions": [["hi there", "how are you"], ["bye"]],
             "questions": ["what did I say?"], "answers": ["hi"]}]
    ds = load_dataset(_write(tmp_path, "lmtb.json", data))
    assert ds.format == "longmtbench"
    c = ds[0]
    assert c.id == "7" and [s.id for s in c.sessions] == ["session_1", "session_2"]
    assert c.sessions[0].turns == ("hi there", "how are you")
    assert c.questions[0].answer == "hi" and c.questions[0].evidence_session_ids == ()


# --- malformed input --------------------------------------------------------------

def _bad_cases(lme_sample_path, locomo_list_path):
    lme = _lme_records(lme_sample_path, 2)
    loc = json.loads(locomo_list_path.read_text())[:1]
    cases = {}
    cases["truncated_lme"] = (json.dumps(lme)[:-2000], r"record 1.*truncated")
    bad = json.loads(json.dumps(lme)); bad[1]["haystack_sessions"] = "oops"
    cases["wrong_type"] = (bad, r"record 1 \(id 'locomo26_q1'\).*haystack_sessions.*list")
    bad = json.loads(json.dumps(lme)); del bad[0]["question"]
    cases["missing_field"] = (bad, r"record 0 \(id 'locomo26_q0'\).*'question'.*missing")
    bad = json.loads(json.dumps(lme)); del bad[1]["haystack_sessions"][3][2]["content"]
    cases["missing_content"] = (bad, r"record 1.*haystack_sessions\[3\]\[2\]\.content")
    bad = json.loads(json.dumps(lme)); bad[0]["haystack_sessions"][2] = []
    cases["empty_session"] = (bad, r"record 0.*haystack_sessions\[2\].*empty session")
    cases["unknown_format"] = ([{"foo": 1}], r"unknown format")
    cases["not_json"] = ("hello", r"unknown format")
    cases["truncated_locomo"] = (json.dumps(loc)[:5000], r"truncated")
    bad = json.loads(json.dumps(loc)); bad[0]["conversation"]["session_2"] = {"x": 1}
    cases["locomo_wrong_type"] = (bad, r"record 0 \(id 'conv-26'\).*'session_2'.*list")
    bad = json.loads(json.dumps(loc)); del bad[0]["conversation"]["session_1"][0]["text"]
    cases["locomo_missing"] = (bad, r"conv-26.*session_1\[0\]\.text.*missing")
    bad = json.loads(json.dumps(loc)); bad[0]["conversation"]["session_3"] = []
    cases["locomo_empty"] = (bad, r"conv-26.*'session_3'.*empty session")
    return cases


@pytest.mark.parametrize("case", ["truncated_lme", "wrong_type", "missing_field",
                                  "missing_content", "empty_session", "unknown_format",
                                  "not_json", "truncated_locomo", "locomo_wrong_type",
                                  "locomo_missing", "locomo_empty"])
def test_malformed_input_names_file_record_field(tmp_path, lme_sample_path,
                                                 locomo_list_path, case):
    data, pattern = _bad_cases(lme_sample_path, locomo_list_path)[case]
    p = _write(tmp_path, f"{case}.json", data)
    with pytest.raises(DataFormatError) as ei:
        load_dataset(p)
    msg = str(ei.value)
    assert msg.startswith(str(p)), msg
    assert re.search(pattern, msg), msg
    # the CLI reports it in one line with exit code 2
    res = CliRunner().invoke(cli, ["stats", str(p)])
    assert res.exit_code == 2, res.output
    assert str(p) in res.output and "Traceback" not in res.output


def test_empty_session_policies(tmp_path, lme_sample_path):
    recs = _lme_records(lme_sample_path, 1)
    recs[0]["haystack_sessions"][2] = []
    p = _write(tmp_path, "e.json", recs)
    keep = load_dataset(p, empty_sessions="keep")
    drop = load_dataset(p, empty_sessions="drop")
    assert len(keep[0].sessions) == 19 and keep[0].sessions[2].turns == ()
    assert len(drop[0].sessions) == 18


def test_detect_format(lme_sample_path, locomo_list_path, locomo_flat_dir):
    assert detect_format(lme_sample_path) == "longmemeval"
    assert detect_format(locomo_list_path) == "locomo"
    assert detect_format(locomo_flat_dir / "26.json") == "locomo_flat"


def test_explicit_unknown_format(tmp_path, lme_sample_path):
    with pytest.raises(DataFormatError, match="unknown format 'csv'"):
        load_dataset(lme_sample_path, format="csv")


# --- stats ------------------------------------------------------------------------

def test_stats_match_independent_counts(lme_sample_path, locomo_list_path):
    raw = json.loads(lme_sample_path.read_text())
    st = dataset_stats(load_dataset(lme_sample_path))
    assert st.conversations == len(raw)
    assert st.sessions_total == sum(len(r["haystack_session_ids"]) for r in raw)
    distinct = {}
    for r in raw:
        for sid, sess in zip(r["haystack_session_ids"], r["haystack_sessions"]):
            distinct[sid.replace("answer_", "")] = sess
    assert st.sessions_distinct == len(distinct)
    assert st.turns_total == sum((len(s) + 1) // 2 for r in raw for s in r["haystack_sessions"])
    assert st.turns_distinct == sum((len(s) + 1) // 2 for s in distinct.values())
    assert st.questions == len(raw) and st.abstentions == 0
    from collections import Counter
    assert st.questions_per_type == dict(sorted(Counter(r["question_type"] for r in raw).items()))

    loc = json.loads(locomo_list_path.read_text())
    st = dataset_stats(load_dataset(locomo_list_path))
    assert st.questions == sum(len(c["qa"]) for c in loc)
    assert st.questions_per_type["adversarial"] == sum(
        1 for c in loc for q in c["qa"] if q["category"] == 5)
    assert st.questions_without_evidence == sum(
        1 for c in loc for q in c["qa"]
        if not any(re.fullmatch(r"D\d+:\d+", e) for e in q["evidence"]))


def test_stats_cli(lme_sample_path):
    res = CliRunner().invoke(cli, ["stats", str(lme_sample_path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["sessions_distinct"] == 19 and out["conversations"] == 40


def test_cli_help_and_version():
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0 and "stats" in r.output
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and "0.1.0" in r.output


def test_locomo_source_summaries(locomo_list_path, locomo_flat_dir):
    raw = json.loads(locomo_list_path.read_text())
    a, b = load_dataset(locomo_list_path), load_dataset(locomo_flat_dir)
    for rec, ca, cb in zip(raw, a, b):
        assert ca.source_summaries == cb.source_summaries
        for s in ca.sessions:
            assert ca.source_summaries[s.id] == rec["session_summary"][f"{s.id}_summary"]


def test_select_conversations(locomo_list_path, locomo_flat_dir):
    full = load_dataset(locomo_list_path)
    held = load_dataset(locomo_list_path, exclude=["conv-26"])
    assert [c.id for c in held] == ["conv-30", "conv-41"]
    assert len(held.questions) == len(full.questions) - len(full.get("conv-26").questions)
    # order follows the source, not the argument; sessions stay the same objects
    pick = full.select(["conv-41", "conv-26"])
    assert [c.id for c in pick] == ["conv-26", "conv-41"]
    assert pick.get("conv-41").sessions[0] is full.get("conv-41").sessions[0]
    assert [c.id for c in full.select(["conv-26", "conv-30"], exclude=["conv-30"])] == \
        ["conv-26"]
    # a folder of flat files selects the same way
    assert [c.id for c in load_dataset(locomo_flat_dir, conversations=["conv-30"])] == \
        ["conv-30"]
    with pytest.raises(ValueError, match=r"no conversation 'conv-99'.*conv-26, conv-30"):
        load_dataset(locomo_list_path, exclude=["conv-99"])


def test_cli_conversation_selection(tmp_path, locomo_list_path):
    r = CliRunner().invoke(cli, ["eval", str(locomo_list_path), "--method", "bm25",
                                 "--exclude-conversations", "conv-26,conv-41",
                                 "--device", "cpu", "--k", "3"])
    assert r.exit_code == 0, r.output
    assert "== bm25 (105 questions)" in r.output  # conv-30 alone
    r = CliRunner().invoke(cli, ["eval", str(locomo_list_path), "--method", "bm25",
                                 "--conversations", "conv-3"])
    assert r.exit_code == 2 and "no conversation 'conv-3'" in r.output
    r = CliRunner().invoke(cli, ["stats", str(locomo_list_path), "--json",
                                 "--exclude-conversations", "conv-26"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):])
    full = load_dataset(locomo_list_path)
    assert out["conversations"] == 2
    assert out["questions"] == len(full.questions) - len(full.get("conv-26").questions)
