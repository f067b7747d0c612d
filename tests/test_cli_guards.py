"""What the command line prints and refuses: ids from a hostile index shown safely, an
encoder path that is not a model, unbounded synthetic sizes, option values and output
folders checked before any work; each refusal is one line naming what is wrong."""
from __future__ import annotations

import json
import re

import pytest

from _hostile import one_line_error, run_cli

# what a terminal acts on: C0 controls (bar newline, which ends lines), DEL, C1,
# bidi controls, line/paragraph separators
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                 "\u2066-\u2069\u2028\u2029]")

CONV_IDS = ["ok-\x1b[2Jcleared", "bad\nfake-conv        7          0", "日本語-ok\u202e"]
SESSION_IDS = [["s\x1b]0;title\x07", "s2\nforged 99 99"], ["a\u202eb", "café\x9b"], ["x\x7f"]]


@pytest.fixture(scope="module")
def hostile_ids_index(tmp_path_factory):
    """An index whose conversation and session ids hold escape sequences, newlines,
    C1 controls, DEL and bidi overrides (a turn text holds colour codes)."""
    from memgas_gpu import Dataset
    from memgas_gpu.data.model import Conversation, Question, Session
    from memgas_gpu.encode import Encoder
    from memgas_gpu.encode.tiny import make_random_bert
    from memgas_gpu.retrieve import MemoryIndex

    root = tmp_path_factory.mktemp("hostile_ids")
    enc = Encoder(make_random_bert(str(root / "bert")), device="cpu", max_length=32)
    convs = []
    for cid, sids in zip(CONV_IDS, SESSION_IDS):
        sessions = [Session.from_messages(sid, f"2023-01-0{i + 1}", [
            {"role": "user", "content": f"hello {i} about cats"},
            {"role": "assistant", "content": "ok \x1b[31mred\x1b[0m"}])
            for i, sid in enumerate(sids)]
        qs = [Question(f"q-{len(convs)}", "cats?", evidence_session_ids=(sids[-1],))]
        convs.append(Conversation(cid, sessions, qs))
    idx = MemoryIndex.build(Dataset(convs), enc, device="cpu", progress=False, m=2,
                            skip_sessions=0)
    idx.save(root / "idx")
    return root / "idx"


def _shown(text: str) -> str:
    """The oracle: how repr writes a string, without its quotes."""
    return repr(text)[1:-1]


def test_stats_shows_hostile_ids_escaped_one_row_each(hostile_ids_index):
    res = run_cli("stats", hostile_ids_index)
    assert res.returncode == 0, res.stderr
    assert not RAW.search(res.stdout) and not RAW.search(res.stderr), res.stdout
    lines = res.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("conversation id"))
    rows = lines[head + 1:]
    assert len(rows) == len(CONV_IDS)  # no forged row
    for row, cid, sids in zip(rows, CONV_IDS, SESSION_IDS):
        assert row.startswith(_shown(cid))
        assert row[len(_shown(cid)):].split() == [str(len(sids)), "1"]
    assert "日本語-ok" in res.stdout  # ordinary Unicode stays readable
    # --json: the same ids after parsing, nothing raw in the text
    res = run_cli("stats", "--json", hostile_ids_index)
    assert res.returncode == 0, res.stderr
    assert not RAW.search(res.stdout) and "日本語" in res.stdout
    assert json.loads(res.stdout)["conversation_ids"] == CONV_IDS


def test_search_shows_hostile_session_ids_and_texts_escaped(hostile_ids_index):
    res = run_cli("search", hostile_ids_index, "--conversation", CONV_IDS[0], "cats",
                  "--k", "2", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert not RAW.search(res.stdout) and not RAW.search(res.stderr), res.stdout
    ranked = [ln.split(". ", 1)[1].rsplit("  ", 1)[0] for ln in res.stdout.splitlines()
              if re.match(r"  \d\. ", ln)]
    assert sorted(ranked) == sorted(map(_shown, SESSION_IDS[0]))
    assert "\\x1b[31mred" in res.stdout
    res = run_cli("search", hostile_ids_index, "--conversation", CONV_IDS[0], "cats",
                  "--json", "--device", "cpu")
    assert res.returncode == 0 and not RAW.search(res.stdout)
    assert sorted(json.loads(res.stdout)["session_ids"]) == sorted(SESSION_IDS[0])


def test_errors_naming_hostile_ids_are_one_safe_line(hostile_ids_index):
    line = one_line_error(run_cli("search", hostile_ids_index, "--conversation", "nope",
                                  "cats", "--device", "cpu"))
    assert not RAW.search(line)
    for cid in CONV_IDS:  # (an error line collapses runs of spaces)
        assert " ".join(_shown(cid).split()) in line
    from memgas_gpu.cli.main import _one_line
    from memgas_gpu.errors import MemgasError

    assert _one_line(MemgasError("session 'a\x1b]0;x\x07\u202eb' is bad")) == \
        "error: session 'a\\x1b]0;x\\x07\\u202eb' is bad"


def test_safe_text_escapes_what_a_terminal_acts_on_and_keeps_the_rest():
    import unicodedata

    from memgas_gpu._display import safe_json, safe_text

    bidi = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
    for o in range(0x3100):
        c = chr(o)
        unsafe = unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs") or c in bidi
        assert safe_text(c) == (repr(c)[1:-1] if unsafe else c), hex(o)
        assert safe_text(f"a{c}b").count("\n") == 0
        doc = json.dumps({"id": f"a{c}b"}, ensure_ascii=False, indent=1)
        assert json.loads(safe_json(doc)) == {"id": f"a{c}b"}
        assert not RAW.search(safe_json(doc).replace("\n", ""))


def test_eval_table_shows_a_hostile_question_type_on_one_row():
    from types import SimpleNamespace

    from memgas_gpu.eval import format_table

    s = {"n": 1, "recall_all@5": 1.0, "ndcg_any@5": 1.0}
    ev = SimpleNamespace(ks=(5,), summary={"all": s, "strict": s, "by_type": {
        "multi\nfake 1 2 3": s, "\x1b]0;t\x07x": s}})
    table = format_table(ev, ks=(5,))
    assert not RAW.search(table) and len(table.splitlines()) == 2 + 1 + 2 + 1
    assert "multi\\nfake 1 2 3" in table and "\\x1b]0;t\\x07x" in table


# ---------------------------------------------------------------- --encoder not a model
@pytest.mark.parametrize("command, kind, missing", [
    ("index", "etc", "no config.json"),
    ("gam", "file", "is a file"),
    ("eval", "no_weights", "no model weights"),
    ("index", "nowhere", "no such folder"),
])
def test_an_encoder_that_is_not_a_model_is_one_line_naming_it(tmp_path, command, kind,
                                                               missing):
    data = tmp_path / "d.json"
    data.write_text("[]")
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "file").write_text("not a model")
    path = {"etc": "/etc", "file": str(tmp_path / "file"),
            "no_weights": str(tmp_path / "no_weights"),
            "nowhere": str(tmp_path / "nowhere")}[kind]
    args = [command, data, "--encoder", path, "--device", "cpu"]
    if command == "index":
        args += ["--out", tmp_path / "idx"]
    line = one_line_error(run_cli(*args))
    assert "--encoder" in line and repr(path) in line and missing in line, line
    assert not (tmp_path / "idx").exists()


def test_opening_a_folder_that_is_not_a_model_raises_encoder_load_error(tmp_path):
    import shutil

    from memgas_gpu.encode import Encoder, EncoderLoadError
    from memgas_gpu.encode.tiny import make_random_bert
    from memgas_gpu.errors import MemgasError

    for path, why in (("/etc", "no config.json"), ("/etc/hostname", "is a file")):
        with pytest.raises(EncoderLoadError, match=re.escape(f"'{path}': ") + ".*" + why):
            Encoder(path, device="cpu")
    # a model folder whose config is not JSON: transformers' own error, in one line
    bad = tmp_path / "bad"
    shutil.copytree(make_random_bert(str(tmp_path / "bert")), bad)
    (bad / "config.json").write_text("{ not json")
    with pytest.raises(MemgasError, match=r"'.*bad': cannot be opened as a model: \S") as e:
        Encoder(str(bad), device="cpu")
    assert isinstance(e.value, EncoderLoadError) and "\n" not in str(e.value)
    Encoder(str(tmp_path / "bert"), device="cpu")  # the intact folder opens


# ---------------------------------------------------------------- memgas synth sizes
SMALL = {"questions": 2, "sessions": 4, "turns": 2, "words": 3}


@pytest.mark.parametrize("change, param", [
    ({"questions": 100_001}, "questions"), ({"sessions": 10_001}, "sessions"),
    ({"turns": 1_001}, "turns"), ({"words": 10_001}, "words"),
    ({"pool": 1_000_001}, "pool"), ({"distinct_sessions": 1_000_001}, "distinct_sessions"),
    ({"questions": 100_000, "sessions": 10_000, "turns": 2, "words": 6}, "size"),
    ({"pool": 1_000_000, "turns": 10, "words": 21}, "pool_size"),
    ({"sessions": 10_000, "turns": 1_000, "words": 11}, "pool_size"),  # default pool
])
def test_synthetic_sizes_above_the_bounds_are_refused(change, param):
    from memgas_gpu.synth import (LIMITS, MAX_POOL_WORDS, MAX_TOTAL_WORDS, SynthParamError,
                                  validate_params)

    shape = {**SMALL, **{k: v for k, v in change.items() if k in SMALL}}
    extra = {k: v for k, v in change.items() if k not in SMALL}
    with pytest.raises(SynthParamError) as e:
        validate_params(**shape, pool=extra.get("pool"), abstention_rate=0.0,
                        distinct_sessions=extra.get("distinct_sessions"))
    assert e.value.param == param
    total = shape["questions"] * shape["sessions"] * shape["turns"] * shape["words"]
    pool = extra.get("pool", 2 * shape["sessions"])
    # the oracle: which bound the sizes cross, computed here
    if param in LIMITS or param == "distinct_sessions":
        assert f"{LIMITS.get(param, LIMITS['pool']):,}" in e.value.message
    elif param == "size":
        assert total > MAX_TOTAL_WORDS and f"{total:,}" in e.value.message
    else:
        assert pool * shape["turns"] * shape["words"] > MAX_POOL_WORDS


def test_synthetic_sizes_at_the_bounds_are_accepted():
    from memgas_gpu.synth import LIMITS, MAX_POOL_WORDS, MAX_TOTAL_WORDS, validate_params

    for name, top in LIMITS.items():
        shape = dict(SMALL, **({name: top} if name in SMALL else {}))
        validate_params(**shape, pool=top if name == "pool" else None, abstention_rate=0.0)
    # exactly the most words in a file, and in the pool
    validate_params(questions=100_000, sessions=10_000, turns=2, words=5, pool=None,
                    abstention_rate=0.0)
    assert 100_000 * 10_000 * 2 * 5 == MAX_TOTAL_WORDS
    validate_params(questions=1, sessions=4, turns=10, words=20, pool=1_000_000,
                    abstention_rate=0.0)
    assert 1_000_000 * 10 * 20 == MAX_POOL_WORDS


def test_synth_refuses_a_billion_words_per_message_at_once(tmp_path):
    from memgas_gpu.synth import LIMITS, MAX_POOL_WORDS, MAX_TOTAL_WORDS

    out = tmp_path / "s.json"
    line = one_line_error(run_cli("synth", "--out", out, "--words", "1000000000",
                                  timeout=60))
    assert f"'--words': must be <= {LIMITS['words']:,}, got 1,000,000,000" in line, line
    line = one_line_error(run_cli("synth", "--out", out, "--questions", "100000",
                                  "--sessions", "10000", timeout=60))
    assert "--questions" in line and f"{MAX_TOTAL_WORDS:,}" in line
    assert not out.exists()
    res = run_cli("synth", "--help")
    for text in (f"{MAX_TOTAL_WORDS:,}", f"{MAX_POOL_WORDS:,}", *(f"{v:,}" for v in
                                                                 LIMITS.values())):
        assert text in " ".join(res.stdout.split()), text


# ---------------------------------------------------------------- options read up front
def _invoke(args):
    """One CLI run in this process: (exit code, its one output line)."""
    from click.testing import CliRunner

    from memgas_gpu.cli.main import cli

    res = CliRunner().invoke(cli, [str(a) for a in args])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "Traceback" not in res.output and len(lines) == 1, res.output
    return res.exit_code, lines[0]


@pytest.mark.parametrize("args, option", [
    (["eval", "BAD", "--k", "0"], "'--k'"),
    (["eval", "BAD", "--k", "1,x"], "'--k'"),
    (["sweep", "BAD", "--k", "0,3"], "'--k'"),
    (["eval", "BAD", "--signals", "dense_S+nope"], "--signals"),
    (["eval", "BAD", "--set", "time_beta=-1"], "--set"),
    (["eval", "BAD", "--method", "bm25", "--set", "fusion=bogus"], "--set"),
    (["search", "EMPTY", "--conversation", "c", "--set", "fusion=x", "q"], "--set"),
    (["eval", "BAD", "--method", "gam", "--segmentation", "tokens0"], "'--segmentation'"),
])
def test_option_values_are_refused_before_the_data_is_read(tmp_path, args, option):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"question_id": ')  # reading it would be an error about the file
    (tmp_path / "empty").mkdir()
    code, line = _invoke([{"BAD": bad, "EMPTY": tmp_path / "empty"}.get(a, a)
                          for a in args] + ["--device", "cpu"])
    assert code == 2 and f"Invalid value for {option}" in line, line
    assert "bad.json" not in line and "manifest" not in line


@pytest.mark.parametrize("args, option", [
    (["index", "DATA", "--out", "MISSING/idx"], "--out"),
    (["eval", "DATA", "--out", "MISSING/r.jsonl"], "--out"),
    (["eval", "DATA", "--save-index", "MISSING/idx"], "--save-index"),
    (["synth", "--out", "MISSING/s.json"], "--out"),
    (["gam", "DATA", "--out", "MISSING/g.json"], "--out"),
    (["sweep", "DATA", "--out", "MISSING/s"], "--out"),
    (["bench", "--out", "MISSING/b"], "--out"),
    (["expand", "DATA", "--llm-model", "m", "--out", "MISSING/prefix"], "--out"),
    (["expand", "DATA", "--llm-model", "m", "--out", "MISSING/new/"], "--out"),
    (["answer", "DATA", "--retrieval", "DATA", "--llm-model", "m", "--out",
      "MISSING/a.jsonl"], "--out"),
    (["qa-eval", "DATA", "DATA", "--out", "MISSING/q.json"], "--out"),
])
def test_an_output_in_a_folder_that_does_not_exist_is_refused(tmp_path, args, option):
    data = tmp_path / "d.json"
    data.write_text("[]")
    missing = tmp_path / "missing" / "dir"
    code, line = _invoke([str(a).replace("MISSING", str(missing)).replace("DATA", str(data))
                          for a in args])
    assert code == 2 and f"Invalid value for {option}" in line, line
    assert f"the folder {missing} does not exist" in line
    assert not (tmp_path / "missing").exists()


def test_a_store_folder_is_still_made_with_its_parents(tmp_path):
    import click

    from memgas_gpu.cli._common import check_out_dir, check_out_file

    check_out_dir(tmp_path / "a" / "b" / "store", "--store", parents=True)
    check_out_dir(tmp_path / "new_index")  # a new folder in an existing one
    check_out_file(tmp_path / "x.json")
    with pytest.raises(click.BadParameter, match="does not exist"):
        check_out_dir(tmp_path / "a" / "b" / "store", "--store")
    assert not (tmp_path / "a").exists()
