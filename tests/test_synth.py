"""Tests of the synthetic LongMemEval-format generator (``memgas_gpu.synth``)."""
from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from memgas_gpu.synth import QUESTION_TYPES, SynthParamError, write_synthetic

KEYS = ["question_id", "question_type", "question", "answer", "question_date",
        "haystack_session_ids", "haystack_dates", "haystack_sessions", "answer_session_ids"]
DATE_FMT = "%Y/%m/%d (%a) %H:%M"
SHAPE = dict(questions=36, sessions=24, turns=6, words=40)
STOP = set("a an the i me my we you your it its to of in on at for with and or but is are "
           "was were be been do did does have has had what which who how when where why "
           "that this so as by from about can could would should will any some not now "
           "there up out than then just very more most much many".split())


def _write(tmp_path: Path, name: str = "d.json", **kw) -> Path:
    path = tmp_path / name
    write_synthetic(path, **{**SHAPE, "progress": False, **kw})
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[dict]:
    path = _write(tmp_path_factory.mktemp("synth"), abstention_rate=0.25)
    return json.loads(path.read_text())


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower())) - STOP


# ---- determinism --------------------------------------------------------------------
def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = _write(tmp_path, "a.json", seed=7).read_bytes()
    b = _write(tmp_path, "b.json", seed=7).read_bytes()
    c = _write(tmp_path, "c.json", seed=8).read_bytes()
    assert a == b
    assert a != c


def test_output_is_plain_json_dump(tmp_path):
    path = _write(tmp_path)
    raw = path.read_bytes()
    assert json.dumps(json.loads(raw)).encode() == raw  # exactly json.dump's layout
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ---- shape --------------------------------------------------------------------------
def test_shape(data):
    assert len(data) == SHAPE["questions"]
    for inst in data:
        assert list(inst) == KEYS
        assert len(inst["haystack_sessions"]) == SHAPE["sessions"]
        assert len(inst["haystack_session_ids"]) == SHAPE["sessions"]
        assert len(inst["haystack_dates"]) == SHAPE["sessions"]
        assert len(set(inst["haystack_session_ids"])) == SHAPE["sessions"]
        for s in inst["haystack_sessions"]:
            assert len(s) == SHAPE["turns"]
            assert [m["role"] for m in s] == ["user", "assistant"] * (SHAPE["turns"] // 2)
            assert all(isinstance(m["content"], str) and m["content"] for m in s)


def test_question_types_cycle_and_abstention_fraction(data):
    assert [d["question_type"] for d in data] == [
        QUESTION_TYPES[i % len(QUESTION_TYPES)] for i in range(len(data))]
    n_abs = sum(d["question_id"].endswith("_abs") for d in data)
    assert n_abs == round(0.25 * len(data))
    assert len({d["question_id"] for d in data}) == len(data)
    assert all(re.fullmatch(r"[0-9a-f]{8}(_abs)?", d["question_id"]) for d in data)


def test_evidence_sessions_and_has_answer(data):
    for inst in data:
        gold = inst["answer_session_ids"]
        ids = inst["haystack_session_ids"]
        assert 1 <= len(gold) <= 3 and set(gold) <= set(ids)
        assert all(g.startswith("answer_") for g in gold)
        if inst["question_type"] == "multi-session":
            assert len(gold) >= 2
        if inst["question_type"] in ("temporal-reasoning", "knowledge-update"):
            assert len(gold) == 2
        for sid, s in zip(ids, inst["haystack_sessions"]):
            flags = [m["has_answer"] for m in s if "has_answer" in m]
            assert all(f is True for f in flags)
            assert (len(flags) == 1) == (sid in gold), sid
            assert sid.startswith("answer_") == (sid in gold)


def test_dates_sorted_and_question_after(data):
    for inst in data:
        dates = [datetime.strptime(d, DATE_FMT) for d in inst["haystack_dates"]]
        assert dates == sorted(dates)
        assert datetime.strptime(inst["question_date"], DATE_FMT) > dates[-1]
        # the weekday in parentheses is the real one
        assert all(d.strftime(DATE_FMT) == s for d, s in zip(dates, inst["haystack_dates"]))


def test_pool_sessions_shared_with_identical_content(data):
    seen: dict[str, str] = {}
    uses: Counter = Counter()
    owner: dict[str, str] = {}
    for inst in data:
        for sid, s in zip(inst["haystack_session_ids"], inst["haystack_sessions"]):
            text = json.dumps(s)
            assert seen.setdefault(sid, text) == text
            uses[sid] += 1
            if sid.startswith("answer_"):
                assert owner.setdefault(sid, inst["question_id"]) == inst["question_id"]
    pool = [sid for sid in uses if not sid.startswith("answer_")]
    assert len(pool) <= 2 * SHAPE["sessions"]
    assert sum(uses[sid] > 1 for sid in pool) > 0.8 * len(pool)
    assert all(uses[sid] == 1 for sid in uses if sid.startswith("answer_"))


def test_words_per_message(data):
    counts = [len(m["content"].split()) for inst in data[:6]
              for s in inst["haystack_sessions"] for m in s]
    mean = sum(counts) / len(counts)
    assert 0.8 * SHAPE["words"] <= mean <= 1.2 * SHAPE["words"]
    assert min(counts) >= 5


def test_text_is_varied_english(data):
    sessions = {sid: s for inst in data
                for sid, s in zip(inst["haystack_session_ids"], inst["haystack_sessions"])}
    contents = [m["content"] for s in sessions.values() for m in s]
    assert len(set(contents)) > 0.95 * len(contents)  # distinct sessions' messages differ
    vocab = Counter(w for c in contents for w in re.findall(r"[a-z]+", c.lower()))
    assert len(vocab) > 500
    assert "lorem" not in vocab


def test_planted_evidence_is_lexically_findable(data):
    hits = total = 0
    for inst in data:
        if inst["question_id"].endswith("_abs"):
            continue
        q = _tokens(inst["question"])
        scores = [len(q & _tokens(" ".join(m["content"] for m in s)))
                  for s in inst["haystack_sessions"]]
        gold = [i for i, sid in enumerate(inst["haystack_session_ids"])
                if sid in inst["answer_session_ids"]]
        best = max(scores[i] for i in gold)
        hits += sum(v > best for v in scores) < 3  # an evidence session in the top 3
        total += 1
    assert hits >= 0.8 * total


def test_default_scale_and_pool(tmp_path):
    path = tmp_path / "s.json"
    summary = write_synthetic(path, progress=False)
    data = json.loads(path.read_text())
    assert summary.questions == len(data) == 20
    assert all(len(d["haystack_sessions"]) == 20 for d in data)
    assert summary.bytes == path.stat().st_size
    assert summary.pool == 40


# ---- validation and atomicity -------------------------------------------------------
@pytest.mark.parametrize("kw,param", [
    ({"sessions": 2}, "sessions"), ({"questions": 0}, "questions"), ({"turns": 1}, "turns"),
    ({"words": 0}, "words"), ({"pool": 5, "sessions": 10}, "pool"),
    ({"abstention_rate": 1.5}, "abstention_rate"),
])
def test_bad_params_raise_and_write_nothing(tmp_path, kw, param):
    with pytest.raises(SynthParamError) as e:
        write_synthetic(tmp_path / "x.json", progress=False, **kw)
    assert e.value.param == param
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    from memgas_gpu.synth import _writer

    calls = {"n": 0}
    real = _writer._instance

    def boom(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(_writer, "_instance", boom)
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        write_synthetic(target, progress=False)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


# ---- CLI ----------------------------------------------------------------------------
def test_cli_writes_file(tmp_path):
    from memgas_gpu.cli.synth import synth

    out = tmp_path / "cli.json"
    res = CliRunner().invoke(synth, ["--out", str(out), "--questions", "7", "--sessions", "5",
                                     "--words", "20", "--seed", "3", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "7 questions" in res.output
    data = json.loads(out.read_text())
    assert len(data) == 7 and all(len(d["haystack_sessions"]) == 5 for d in data)
    # the library with the same arguments gives the same bytes
    lib = tmp_path / "lib.json"
    write_synthetic(lib, questions=7, sessions=5, words=20, seed=3, progress=False)
    assert lib.read_bytes() == out.read_bytes()


def test_cli_registered_in_group(tmp_path):
    from memgas_gpu.cli.main import cli

    out = tmp_path / "g.json"
    res = CliRunner().invoke(cli, ["synth", "--out", str(out), "--questions", "2",
                                   "--sessions", "3", "--turns", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert out.exists()


@pytest.mark.parametrize("args", [
    ["--sessions", "2"], ["--turns", "1"], ["--questions", "0"],
    ["--sessions", "10", "--pool", "3"], ["--abstention-rate", "-0.1"], ["--scale", "xl"],
    ["--distinct-sessions", "many"], ["--sessions", "10", "--distinct-sessions", "8"],
    ["--pool", "40", "--distinct-sessions", "all"],
])
def test_cli_bad_params_exit_2(tmp_path, args):
    from memgas_gpu.cli.synth import synth

    out = tmp_path / "bad.json"
    res = CliRunner().invoke(synth, ["--out", str(out), "--no-progress", *args])
    assert res.exit_code == 2, res.output
    assert list(tmp_path.iterdir()) == []


def test_cli_scale_preset_is_overridden_by_explicit_options(tmp_path):
    from memgas_gpu.cli.synth import synth

    out = tmp_path / "m.json"
    res = CliRunner().invoke(synth, ["--out", str(out), "--scale", "m", "--questions", "2",
                                     "--sessions", "4", "--no-progress"])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert len(data) == 2 and len(data[0]["haystack_sessions"]) == 4
    assert len(data[0]["haystack_sessions"][0]) == 10  # turns from the m preset


# ---- round trip through the project loader ------------------------------------------
def test_loads_through_load_dataset(tmp_path):
    load_dataset = pytest.importorskip("memgas_gpu").load_dataset
    path = _write(tmp_path, abstention_rate=0.25, distractor_rate=0.3)
    raw = json.loads(path.read_text())
    ds = load_dataset(path)
    assert len(ds.conversations) == len(raw)
    for conv, inst in zip(ds.conversations, raw):
        assert len(conv.sessions) == SHAPE["sessions"]
        assert all(len(s.turns) == SHAPE["turns"] // 2 for s in conv.sessions)
        (q,) = conv.questions
        assert q.text == inst["question"] and q.type == inst["question_type"]
        assert q.is_abstention == inst["question_id"].endswith("_abs")
        gold = {g[len("answer_"):] for g in inst["answer_session_ids"]}
        assert set(q.evidence_session_ids) == gold
        assert gold <= {s.id for s in conv.sessions}
        flagged = {sid[len("answer_"):] if sid.startswith("answer_") else sid
                   for sid, sess in zip(inst["haystack_session_ids"], inst["haystack_sessions"])
                   if any(m.get("has_answer") for m in sess)}
        assert flagged == gold  # the planted messages, and only they, carry has_answer
    # pool sessions recur across conversations with identical content (dates differ
    # per haystack, as each instance has its own timeline)
    keys = [s.content_key for c in ds.conversations for s in c.sessions]
    assert len(set(keys)) < 0.5 * len(keys)
    # without answer_session_ids the loader derives the gold sessions from the flags
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([{k: v for k, v in inst.items() if k != "answer_session_ids"}
                                for inst in raw]))
    derived = load_dataset(bare)
    assert [q.evidence_session_ids for q in derived.questions] == \
        [q.evidence_session_ids for q in ds.questions]
    assert sum(bool(q.evidence_session_ids) for q in ds.questions) >= len(raw) // 2


# ---- distinct sessions ---------------------------------------------------------------
def _distinct_contents(data) -> tuple[int, int]:
    texts = [json.dumps(s) for inst in data for s in inst["haystack_sessions"]]
    return len(set(texts)), len(texts)


def test_all_distinct_sessions(tmp_path):
    from memgas_gpu.cli.synth import synth

    out = tmp_path / "all.json"
    res = CliRunner().invoke(synth, ["--out", str(out), "--questions", "6", "--sessions", "9",
                                     "--words", "15", "--distinct-sessions", "all",
                                     "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "all filler sessions distinct" in res.output and "54 distinct of 54" in res.output
    data = json.loads(out.read_text())
    assert _distinct_contents(data) == (54, 54)  # nothing for deduplication to save
    ids = [sid for inst in data for sid in inst["haystack_session_ids"]]
    assert len(set(ids)) == 54
    assert all(any(sid.startswith("answer_") for sid in inst["haystack_session_ids"])
               for inst in data)
    again = tmp_path / "again.json"
    write_synthetic(again, questions=6, sessions=9, words=15, distinct_sessions="all",
                    progress=False)
    assert again.read_bytes() == out.read_bytes()  # deterministic


def test_distinct_sessions_count_is_the_pool(tmp_path):
    a = _write(tmp_path, "a.json", distinct_sessions=30)
    b = _write(tmp_path, "b.json", pool=30)
    assert a.read_bytes() == b.read_bytes()
    data = json.loads(a.read_text())
    n_distinct, n = _distinct_contents(data)
    n_answer = sum(len(inst["answer_session_ids"]) for inst in data)
    assert n_distinct <= 30 + n_answer < n
