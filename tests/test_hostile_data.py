"""Hostile and careless dataset files (issue 17, items 1, 2 and the loader part of 7):
bounded memory, one-line errors naming file and field, no silent wrong metrics."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from memgas_gpu.data import load_dataset
from memgas_gpu.errors import DataFormatError
from memgas_gpu.eval.metrics import gold_mask, retrieval_metrics

from _hostile import ROOT, one_line_error, run_cli
from _rss import HWM

DEPTH = 100_000


def _lme(**over) -> dict:
    rec = {"question_id": "q1", "question_type": "single", "question": "What colour?",
           "answer": "blue", "haystack_session_ids": ["s1", "answer_s2"],
           "haystack_dates": ["2023/01/01", "2023/01/02"],
           "haystack_sessions": [[{"role": "user", "content": "I like red."}],
                                 [{"role": "user", "content": "My car is blue.",
                                   "has_answer": True}]]}
    rec.update(over)
    return rec


def _write(path, text) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


_RSS = HWM + """
import sys, time
import memgas_gpu.data
base = hwm_bytes()
t = time.time()
try:
    memgas_gpu.data.load_dataset(sys.argv[1])
    out = "ok"
except memgas_gpu.errors.DataFormatError as e:
    out = str(e)
print(hwm_bytes() - base, time.time() - t)
print(out)
"""


@pytest.mark.parametrize("layout", ["longmemeval", "locomo"])
def test_deep_nesting_costs_memory_in_proportion_and_fails_in_one_line(tmp_path, layout,
                                                                       locomo_list_path):
    nest = "[" * DEPTH + "]" * DEPTH
    if layout == "longmemeval":
        text = json.dumps([_lme(answer="@@")]).replace('"@@"', nest)
    else:  # the json.load path (RecursionError before)
        rec = json.loads(locomo_list_path.read_text())[0]
        rec["qa"][0]["answer"] = "@@"
        text = json.dumps([rec]).replace('"@@"', nest)
    path = _write(tmp_path / "nested.json", text)
    size = os.path.getsize(path)
    res = subprocess.run([sys.executable, "-c", _RSS, path], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr[-2000:]
    grown, seconds = map(float, res.stdout.splitlines()[0].split())
    message = res.stdout.splitlines()[1]
    assert grown <= 3 * size + 16 * 2**20, (grown, size)  # was 1.2 GB (43 KB) to 24 GB
    assert seconds < 5
    assert "nested more than 64 levels" in message and "nested.json" in message
    if layout == "longmemeval":  # the CLI: exit 2, one line (once is enough: ~3 s)
        one_line_error(run_cli("stats", path))


def test_real_files_load_within_three_times_their_size_plus_a_constant(lme_sample_path,
                                                                      locomo_list_path):
    for path in (lme_sample_path, locomo_list_path):
        res = subprocess.run([sys.executable, "-c", _RSS, str(path)], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        grown = float(res.stdout.split()[0])
        assert res.stdout.splitlines()[1] == "ok"
        assert grown <= 3 * path.stat().st_size + 32 * 2**20, (path, grown)


def test_nesting_inside_strings_and_escapes_is_not_counted(tmp_path):
    deep_text = '[[[[{{{{ "quoted" \\ ' * 50
    path = _write(tmp_path / "s.json", json.dumps([_lme(question=deep_text)]))
    ds = load_dataset(path)
    assert ds.questions[0].text == deep_text


# ---- item 2: duplicate session ids ---------------------------------------------------
def test_duplicate_session_with_the_same_content_is_dropped_once(tmp_path, caplog):
    sess = [{"role": "user", "content": "My car is blue.", "has_answer": True}]
    rec = _lme(haystack_session_ids=["s1", "answer_s2", "s2"],
               haystack_dates=["a", "b", "c"],
               haystack_sessions=[[{"role": "user", "content": "I like red."}], sess, sess])
    ds = load_dataset(_write(tmp_path / "d.json", json.dumps([rec])))
    assert [s.id for s in ds[0].sessions] == ["s1", "s2"]
    assert "listed twice" in caplog.text


def test_duplicate_session_with_other_content_is_refused(tmp_path):
    rec = _lme(haystack_session_ids=["s1", "s1"])
    with pytest.raises(DataFormatError, match=r"record 0 \(id 'q1'\): field "
                       r"'haystack_session_ids\[1\]': session id 's1' used twice"):
        load_dataset(_write(tmp_path / "d.json", json.dumps([rec])))


def test_locomo_session_01_beside_session_1_is_refused(tmp_path, locomo_list_path):
    rec = json.loads(locomo_list_path.read_text())[0]
    conv = rec["conversation"]
    conv["session_01"] = conv["session_2"]
    path = _write(tmp_path / "l.json", json.dumps([rec]))
    with pytest.raises(DataFormatError, match="'session_1' and 'session_01' both name "
                                              "session_1"):
        load_dataset(path)
    # a file with only zero-padded names loads, named as LoCoMo's evidence names them
    rec = {"sample_id": "c", "conversation": {
        "speaker_a": "A", "speaker_b": "B",
        "session_01": [{"speaker": "A", "dia_id": "D1:1", "text": "hello"}]},
        "qa": [{"question": "q?", "answer": "x", "evidence": ["D1:1"], "category": 1}]}
    ds = load_dataset(_write(tmp_path / "p.json", json.dumps([rec])))
    assert [s.id for s in ds[0].sessions] == ["session_1"]
    assert ds.questions[0].evidence_session_ids == ("session_1",)


def _reference_recall(ranking, ids, gold, k):
    found = {ids[p] for p in ranking[:k]}
    g = set(gold)
    return float(bool(found & g)), float(g <= found)


def test_metrics_count_distinct_gold_ids_and_are_monotonic_in_k():
    # the case: the gold session twice in the haystack, two gold ids
    ids = [["a", "g1", "g1", "g2", "b", "c"]]
    gold = [["g1", "g2"]]
    rank = torch.tensor([[1, 2, 0, 3, 4, 5]])
    rel, n_gold = gold_mask(ids, gold)
    m = retrieval_metrics(rank, rel, n_gold, ks=(1, 2, 3, 4, 5, 6))
    assert [m[f"recall_all@{k}"].item() for k in (1, 2, 3, 4, 5, 6)] == [0, 0, 0, 1, 1, 1]
    assert m["ndcg_any@6"].item() <= 1.0
    # random haystacks with repeated ids: monotonic, and equal to the set-based reference
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 12, (1,), generator=g))
        hay = [f"s{int(x)}" for x in torch.randint(0, 6, (n,), generator=g)]
        gl = [f"s{int(x)}" for x in torch.randint(0, 7, (int(torch.randint(0, 3, (1,),
                                                                    generator=g)),),
                                                 generator=g)]
        r = torch.randperm(n, generator=g)
        rel, ng = gold_mask([hay], [gl])
        ks = tuple(range(1, n + 1))
        mm = retrieval_metrics(r[None], rel, ng, ks=ks)
        for name in ("recall_any", "recall_all"):
            seq = [mm[f"{name}@{k}"].item() for k in ks]
            assert seq == sorted(seq), (hay, gl, r, name, seq)
        for k in ks:
            ra, rl = _reference_recall(r.tolist(), hay, gl, k)
            assert (mm[f"recall_any@{k}"].item(), mm[f"recall_all@{k}"].item()) == (ra, rl)
            assert mm[f"ndcg_any@{k}"].item() <= 1.0 + 1e-12


# ---- item 7, loaders ---------------------------------------------------------------
def _locomo(locomo_list_path, edit):
    rec = json.loads(locomo_list_path.read_text())[0]
    edit(rec)
    return json.dumps([rec])


@pytest.mark.parametrize("case, want", [
    ("category_list", "field 'qa[0].category': expected a number or a string, got list"),
    ("category_dict", "field 'qa[0].category': expected a number or a string, got dict"),
    ("summary_list", "field 'session_summary': expected an object, got list"),
    ("huge_session_number", None),
])
def test_locomo_odd_fields(tmp_path, locomo_list_path, case, want):
    def edit(rec):
        if case == "category_list":
            rec["qa"][0]["category"] = [1, 2]
        elif case == "category_dict":
            rec["qa"][0]["category"] = {"a": 1}
        elif case == "summary_list":
            rec["session_summary"] = ["x"]
        else:  # more digits than int() converts: not a session key, ignored
            rec["conversation"]["session_" + "9" * 5000] = []
    path = _write(tmp_path / "l.json", _locomo(locomo_list_path, edit))
    if want is None:
        assert len(load_dataset(path)[0].sessions) == 19
    else:
        with pytest.raises(DataFormatError, match=want.replace("[", r"\[").replace("]", r"\]")):
            load_dataset(path)


def test_bom_is_accepted_and_lone_surrogates_refused(tmp_path, locomo_list_path):
    body = json.dumps([_lme()]).encode()
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + body)
    assert load_dataset(bom).questions[0].id == "q1"
    lbom = tmp_path / "lbom.json"
    lbom.write_bytes(b"\xef\xbb\xbf" + locomo_list_path.read_bytes())
    assert len(load_dataset(lbom)) == 3
    sur = _write(tmp_path / "sur.json", json.dumps([_lme(question="bad \udfff")]))
    with pytest.raises(DataFormatError, match="sur.json: record 0: not UTF-8"):
        load_dataset(sur)
    loc = _write(tmp_path / "lsur.json", _locomo(
        locomo_list_path, lambda r: r["qa"][1].update(answer="x\ud800")))
    with pytest.raises(DataFormatError, match=r"record 0: field 'qa\[1\].answer': a lone"):
        load_dataset(loc)


def test_empty_dataset_and_fifo_are_refused(tmp_path):
    empty = _write(tmp_path / "empty.json", "[]")
    with pytest.raises(DataFormatError, match="unknown format"):
        load_dataset(empty)
    for fmt in ("longmemeval", "locomo", "longmtbench"):
        with pytest.raises(DataFormatError, match="no conversations"):
            load_dataset(empty, fmt)
    assert "no conversations" in one_line_error(run_cli(
        "index", empty, "--format", "longmemeval", "--out", tmp_path / "idx"))
    assert not (tmp_path / "idx").exists()
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(DataFormatError, match="not a regular file"):
        load_dataset(fifo)


# ---- round 3, item 7: integers of thousands of digits ----------------------------------
_HUGE = "1" * 5000  # Python refuses to convert more than 4,300 digits


@pytest.mark.parametrize("layout", ["locomo", "longmemeval", "key_first"])
def test_a_huge_integer_is_one_line_not_a_segfault(tmp_path, layout):
    """ijson's C backend passes Python's failed int conversion on unchecked (exit 139 in
    format detection); every loader path now refuses such numbers in one line."""
    if layout == "locomo":
        text = '[{"x": ' + _HUGE + ', "sample_id": "a", "conversation": {}, "qa": []}]'
    elif layout == "longmemeval":
        text = json.dumps([_lme()]).replace('"blue"', _HUGE, 1)
    else:
        text = '[{"sample_id": ' + _HUGE + '}]'
    path = _write(tmp_path / "f.json", text)
    line = one_line_error(run_cli("stats", path))
    assert path in line and "more than 100 digits" in line
    with pytest.raises(DataFormatError, match="more than 100 digits"):
        load_dataset(path)


def test_format_detection_alone_survives_a_huge_integer(tmp_path):
    """detect_format is public: it must not hand ijson's Decimal mode a huge integer."""
    from memgas_gpu.data import detect_format

    path = _write(tmp_path / "f.json", '[{"x": ' + _HUGE + ', "sample_id": "a"}]')
    code = ("import sys\nfrom memgas_gpu.data import detect_format\n"
            "try:\n    detect_format(sys.argv[1])\nexcept Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    res = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert res.returncode == 0, (res.returncode, res.stderr[-500:])
    assert "DataFormatError" in res.stdout and "integer overflow" in res.stdout
    assert detect_format(_write(tmp_path / "g.json", '[{"x": 12, "sample_id": "a"}]')) \
        == "locomo"


def test_digit_runs_are_counted_across_chunks_and_not_inside_strings(tmp_path):
    from memgas_gpu.data._jsonscan import _CHUNK, check_json_file

    # 90 digits each side of the 1 MiB chunk boundary: one number of 180 digits
    pad = " " * (_CHUNK - 90 - 1)
    path = _write(tmp_path / "cut.json", "[" + pad + "1" * 180 + "]")
    with pytest.raises(DataFormatError, match="more than 100 digits"):
        check_json_file(path)
    # digits inside a string, and a string cut by the chunk boundary, are text
    ok = _write(tmp_path / "ok.json", '["' + "1" * 5000 + '", ' + "9" * 100 + "]")
    check_json_file(ok)
    ok2 = _write(tmp_path / "ok2.json", "[" + " " * (_CHUNK - 10) + '"' + "7" * 300 + '"]')
    check_json_file(ok2)
