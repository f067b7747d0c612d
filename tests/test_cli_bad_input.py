"""Every bad input to every command is one line on stderr naming the option (or the
argument), exit status 2, no traceback (docs/failure.md, "Options and parameters").

Each case runs the real command (``python -m memgas_gpu.cli`` in a subprocess) against
one small index built once for the module. The cases run two at a time (most end
before torch is imported, the others take its import); each case is still its own
test, and a ``-k`` selection runs only the cases it selects.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from _hostile import one_line_error, run_cli

TEST = "test_bad_input_is_one_line_naming_the_option"

# (id, arguments, what the line must name, paths that must not exist afterwards)
# {IDX}: an index folder; {DATA}: its dataset file; {CONV}: one of its conversation ids;
# {TMP}: the module's temporary folder
CASES = [
    # --- memgas search: the cases, a traceback naming question_date / queries[0]
    ("search-date-month-13", ["search", "{IDX}", "--conversation", "{CONV}", "cats",
                              "--date", "2024-13-45"], "'--date'", []),
    ("search-date-a-word", ["search", "{IDX}", "--conversation", "{CONV}", "cats",
                            "--date", "yesterday"], "'--date'", []),
    ("search-empty-question", ["search", "{IDX}", "--conversation", "{CONV}", ""],
     "'QUERIES...': question 1 is empty", []),
    ("search-blank-second-question", ["search", "{IDX}", "--conversation", "{CONV}", "cats",
                                      "  "], "'QUERIES...': question 2 is empty", []),
    # a NaN given with --set was blamed on --damping, an option search does not have
    ("search-set-nan", ["search", "{IDX}", "--conversation", "{CONV}", "cats", "--set",
                        "damping=nan"], "Invalid value for --set: damping must be finite",
     []),
    ("eval-set-nan", ["eval", "{IDX}", "--set", "time_beta=nan"],
     "Invalid value for --set: time_beta must be finite", []),
    # --- summary and keyword sources: refused after loading and indexing, unnamed
    ("eval-summaries-missing-file", ["eval", "{DATA}", "--summaries", "{TMP}/nope.jsonl"],
     "'--summaries': '{TMP}/nope.jsonl': no such file", []),
    ("index-keywords-typo", ["index", "{DATA}", "--out", "{TMP}/k.idx", "--keywords", "ofline"],
     "'--keywords': 'ofline': no such file", ["{TMP}/k.idx"]),
    ("gam-summaries-typo", ["gam", "{DATA}", "--summaries", "rwa"], "'--summaries'", []),
    ("answer-keywords-a-folder", ["answer", "{DATA}", "--retrieval", "{DATA}", "--llm-model",
                                  "m", "--out", "{TMP}/a.jsonl", "--keywords", "{TMP}"],
     "'--keywords': '{TMP}': not a file", ["{TMP}/a.jsonl"]),
    # --- memgas sweep: grid values refused after the index was loaded, naming nothing
    ("sweep-grid-unknown-fusion", ["sweep", "{IDX}", "--grid", "fusion=bogus"],
     "--grid: fusion must be one of", []),
    ("sweep-grid-unknown-graph", ["sweep", "{IDX}", "--grid", "graph=nope"],
     "--grid: graph must be one of", []),
    ("sweep-grid-nan", ["sweep", "{IDX}", "--grid", "damping=nan"], "--grid", []),
    ("sweep-grid-stopwords-on-an-index", ["sweep", "{IDX}", "--grid", "stopwords=en"],
     "--grid: a stopwords axis", []),
    ("sweep-grid-unknown-stopwords", ["sweep", "{DATA}", "--grid", "stopwords=xx"],
     "--grid: stopwords: unknown stopword list 'xx'", []),
    ("sweep-unknown-method", ["sweep", "{IDX}", "--method", "nope"], "'--method'", []),
    ("sweep-rank-by-not-a-cut-off", ["sweep", "{IDX}", "--k", "3", "--rank-by",
                                     "recall_all@7"], "--rank-by: 'recall_all@7'", []),
    # --- dataset options and DATA: ignored on an index, or errors naming neither
    ("eval-conversations-on-an-index", ["eval", "{IDX}", "--conversations", "{CONV}"],
     "--conversations: selects conversations of a dataset", []),
    ("sweep-exclude-on-an-index", ["sweep", "{IDX}", "--exclude-conversations", "{CONV}"],
     "--exclude-conversations: selects conversations of a dataset", []),
    ("stats-exclude-unknown-id", ["stats", "{DATA}", "--exclude-conversations", "nope"],
     "--exclude-conversations: {TMP}/demo.json: no conversation 'nope'", []),
    ("index-data-is-an-index", ["index", "{IDX}", "--out", "{TMP}/y.idx"],
     "DATA: {TMP}/demo.idx: an index folder", ["{TMP}/y.idx"]),
    ("gam-data-is-an-index", ["gam", "{IDX}"], "DATA: {TMP}/demo.idx: an index folder", []),
    # --- empty paths: "no output" without a word, or the current folder
    ("eval-out-empty", ["eval", "{IDX}", "--out", ""], "'--out': an empty path", []),
    ("sweep-out-empty", ["sweep", "{IDX}", "--out", ""], "'--out': an empty path", []),
    ("index-out-empty", ["index", "{DATA}", "--out", ""], "'--out': an empty path", []),
    ("eval-store-empty", ["eval", "{DATA}", "--store", ""], "'--store': an empty path", []),
    ("synth-out-empty", ["synth", "--out", ""], "'--out': an empty path", []),
    ("expand-out-empty", ["expand", "{DATA}", "--llm-model", "m", "--out", ""],
     "'--out': an empty value", []),
    # --- the rest
    ("expand-base-url-not-http", ["expand", "{DATA}", "--llm-model", "m", "--out", "{TMP}/p",
                                  "--base-url", "ftp://me:hunter2hunter2@host/v1"],
     "'--base-url': 'ftp://host/v1': must start with http:// or https://",
     ["{TMP}/p-summary_level.jsonl"]),
    ("expand-base-url-no-scheme", ["expand", "{DATA}", "--llm-model", "m", "--out",
                                   "{TMP}/p", "--base-url", "me:hunter2hunter2@host"],
     "'--base-url': '…@host': must start with http://", ["{TMP}/p-summary_level.jsonl"]),
    ("bench-no-stage", ["bench", "--out", "{TMP}/b", "--stages", ","],
     "'--stages': no stage named", ["{TMP}/b/report.md"]),
    ("serve-a-folder-that-is-not-a-memory", ["serve", "{TMP}/notmem", "--port", "0"],
     "FOLDER: {TMP}/notmem: a folder that is not an index (holds 'notes.txt')", []),
    ("serve-replicas-without-ray", ["serve", "{TMP}/srv", "--replicas", "3"],
     "--replicas and --ray-address go with --ray", ["{TMP}/srv"]),
    ("serve-encoder-not-a-model", ["serve", "{TMP}/srv", "--encoder", "/etc"],
     "'--encoder': '/etc': not a model folder", ["{TMP}/srv"]),
    ("memgas-unknown-option", ["--bogus"], "memgas: No such option '--bogus'", []),
    # (already one line before: kept as the baseline of the table)
    ("search-k-zero", ["search", "{IDX}", "--conversation", "{CONV}", "cats", "--k", "0"],
     "'--k'", []),
]
NEEDS_SERVER = {c[0] for c in CASES if c[1][0] == "serve"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """A synthetic dataset, its index (tiny random encoder), and folders for the cases."""
    from _hostile import tiny_encoder
    from memgas_gpu import load_dataset
    from memgas_gpu.retrieve import MemoryIndex

    root = tmp_path_factory.mktemp("bad_input")
    data = root / "demo.json"
    res = run_cli("synth", "--out", data, "--questions", "3", "--sessions", "4",
                  "--turns", "2", "--words", "6", "-q")
    assert res.returncode == 0, res.stderr
    ds = load_dataset(data)
    idx = MemoryIndex.build(ds, tiny_encoder(root / "bert"), device="cpu", progress=False)
    idx.save(root / "demo.idx")
    (root / "notmem").mkdir()
    (root / "notmem" / "notes.txt").write_text("mine")
    return {"TMP": str(root), "IDX": str(root / "demo.idx"), "DATA": str(data),
            "CONV": ds.conversations[0].id}


def _fill(text: str, where: dict) -> str:
    for key, value in where.items():
        text = text.replace("{" + key + "}", value)
    return text


#: commands with a --device option (the cases run on the CPU)
DEVICE = ("search", "eval", "sweep", "index", "gam", "bench", "serve")


def _run(case, where):
    _, args, _, _ = case
    argv = [_fill(a, where) for a in args] + (["--device", "cpu"] if args[0] in DEVICE
                                               else [])
    try:  # a server that starts instead of refusing would run until killed
        return run_cli(*argv, timeout=60 if args[0] == "serve" else 120)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(argv, -9, "", f"timed out: {e}")


@pytest.fixture(scope="module")
def results(request, quick):
    """The selected cases, run two at a time: {id: CompletedProcess}."""
    chosen = {item.callspec.params["case"][0] for item in request.session.items
              if getattr(item, "originalname", None) == TEST and hasattr(item, "callspec")}
    todo = [c for c in CASES if c[0] in chosen and not (
        c[0] in NEEDS_SERVER and importlib.util.find_spec("uvicorn") is None)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip([c[0] for c in todo], pool.map(lambda c: _run(c, quick), todo)))
    return done


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_naming_the_option(case, results, quick):
    name, args, names, absent = case
    if name in NEEDS_SERVER and importlib.util.find_spec("uvicorn") is None:
        pytest.skip('memgas serve needs the "serve" extra')
    line = one_line_error(results[name])  # exit 2, one non-empty line, no traceback
    assert line.startswith("error: "), line
    assert _fill(names, quick) in line, line
    for path in absent:  # refused before any work
        assert not os.path.exists(_fill(path, quick)), path
    if name.startswith("expand-base-url"):
        assert "hunter2" not in line  # a password is never shown
    if name.startswith("serve-a-folder"):
        assert [p.name for p in Path(_fill("{TMP}/notmem", quick)).iterdir()] == ["notes.txt"]


def test_every_command_has_a_case():
    """The table covers every subcommand `memgas --help` lists (qa-eval's options are
    answer's, checked by the same callbacks)."""
    from memgas_gpu.cli.main import cli

    covered = {c[1][0] for c in CASES}
    assert set(cli.commands) - covered <= {"qa-eval"}, set(cli.commands) - covered
