"""Corrupted, edited, concurrently replaced and killed-while-written index folders
(issue 17, items 3 (NaN embeddings), 6, 7 and 9)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from memgas_gpu.bench.data import index_from_nodes
from safetensors.torch import load_file, save_file

from memgas_gpu.retrieve import MemoryIndex, retrieve
from memgas_gpu.storage.persist import IndexFormatError, load_index, save_index

from _hostile import ROOT, build_small_index, one_line_error, run_cli
from _rss import HWM


@pytest.fixture(scope="module")
def small(tmp_path_factory, locomo_list_path):
    folder = tmp_path_factory.mktemp("small")
    idx = build_small_index(locomo_list_path, folder)
    idx.snapshot().graph()
    save_index(idx, folder / "idx")
    return idx, folder / "idx"


def _version_dir(path: Path) -> Path:
    return path / json.loads((path / "manifest.json").read_text())["current"]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _same(a: MemoryIndex, b: MemoryIndex) -> None:
    ra, rb = retrieve(a, method="memgas", device="cpu"), retrieve(b, method="memgas",
                                                                  device="cpu")
    assert torch.equal(ra.rankings, rb.rankings)


# ---- item 9 and the layout ------------------------------------------------------------
def test_every_index_file_has_the_umask_mode(tmp_path, small):
    idx, _ = small
    old = os.umask(0o027)
    try:
        out = save_index(idx, tmp_path / "idx")
    finally:
        os.umask(old)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"manifest.json", "tensors.safetensors"}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {oct(0o640)}


def test_replacing_keeps_one_version_and_removes_leftovers(tmp_path, small):
    idx, _ = small
    out = save_index(idx, tmp_path / "idx")
    first = _version_dir(out)
    # what killed writers leave: an unfinished build here, the old writer's siblings
    (out / ".tmp-v-0123").mkdir()
    (out / ".tmp-v-0123" / "tensors.safetensors").write_bytes(b"partial")
    (tmp_path / ".idx.old").mkdir()
    (tmp_path / ".idx.k2j3x9y_.tmp").mkdir()
    save_index(idx, out)
    assert not first.exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("v-")) == \
        [".lock", "manifest.json"]
    assert len([p for p in out.iterdir() if p.name.startswith("v-")]) == 1
    assert not (tmp_path / ".idx.old").exists() and not (tmp_path / ".idx.k2j3x9y_.tmp").exists()
    _same(idx, load_index(out))


def test_version_1_folders_load_and_are_converted_when_saved_over(tmp_path, small):
    idx, path = small
    v1 = tmp_path / "v1"
    shutil.copytree(_version_dir(path), v1)
    m = json.loads((v1 / "manifest.json").read_text())
    (v1 / "manifest.json").write_text(json.dumps(dict(m, version=1)))
    _same(idx, load_index(v1))
    save_index(idx, v1)
    assert not (v1 / "tensors.safetensors").exists() and _version_dir(v1).is_dir()
    _same(idx, load_index(v1))


def test_saving_never_replaces_a_folder_that_is_not_an_index(tmp_path, small):
    idx, _ = small
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(IndexFormatError, match="not an index"):
        save_index(idx, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(IndexFormatError, match="not a folder"):
        save_index(idx, tmp_path / "file")


# ---- item 6: kills and concurrency, with real processes ---------------------------------
_WRITER = """
import sys
from memgas_gpu.storage.persist import load_index, save_index
a = load_index(sys.argv[1])
b = load_index(sys.argv[2])
print("ready", flush=True)
for i in range(int(sys.argv[4])):
    save_index(a if i % 2 else b, sys.argv[3], force=True)  # replace, whatever is there
"""


def _writer(src_a, src_b, dst, n):
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(src_a), str(src_b), str(dst),
                             str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT),
                                                OMP_NUM_THREADS="1"))


def _two_sources(tmp_path, small):
    """Two valid indexes that differ (the question embeddings of b are reversed)."""
    idx, path = small
    a = _copy(path, tmp_path / "a")
    other = load_index(path)
    other.q_emb = other.q_emb.flip(0).contiguous()
    b = save_index(other, tmp_path / "b")
    return a, b, {int(load_index(x).q_emb[0, 0].mul(1e6).round()) for x in (a, b)}


def test_a_killed_writer_leaves_the_old_or_the_new_index(tmp_path, small):
    a, b, marks = _two_sources(tmp_path, small)
    dst = tmp_path / "dst"
    save_index(load_index(a), dst)
    for delay in (0.05, 0.25, 0.5):
        w = _writer(a, b, dst, 1000)
        assert w.stdout.readline().strip() == "ready"
        time.sleep(delay)
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=30)
        got = load_index(dst)  # never "no index", never a partial one
        assert int(got.q_emb[0, 0].mul(1e6).round()) in marks
    save_index(load_index(a), dst)  # the next writer cleans what the killed ones left
    assert len([p for p in dst.iterdir() if p.name.startswith((".tmp", "v-"))]) == 1


def test_readers_always_see_a_whole_index_while_writers_race(tmp_path, small):
    a, b, marks = _two_sources(tmp_path, small)
    dst = tmp_path / "dst"
    save_index(load_index(a), dst)
    writers = [_writer(a, b, dst, 25) for _ in range(2)]
    for w in writers:
        assert w.stdout.readline().strip() == "ready"
    reads, deadline = 0, time.time() + 60
    while any(w.poll() is None for w in writers) and time.time() < deadline:
        got = load_index(dst)
        assert int(got.q_emb[0, 0].mul(1e6).round()) in marks
        reads += 1
    for w in writers:
        assert w.wait(timeout=60) == 0, w.stderr.read()[-2000:]
    assert reads > 5
    assert len([p for p in dst.iterdir() if p.name.startswith((".tmp", "v-"))]) == 1


# ---- item 7: edited manifests ----------------------------------------------------------
def _edit(m: dict, what: str):
    q0, c0 = m["questions"][0], m["conversations"][0]
    edits = {
        "no_params": lambda: m.pop("params"), "no_graphs": lambda: m.pop("graphs"),
        "no_config": lambda: m.pop("config"), "no_convs": lambda: m.pop("conversations"),
        "no_questions": lambda: m.pop("questions"), "no_format": lambda: m.pop("format"),
        "no_version": lambda: m.pop("version"), "format": lambda: m.update(format="x"),
        "v0": lambda: m.update(version=0), "v-1": lambda: m.update(version=-1),
        "vtrue": lambda: m.update(version=True), "vstr": lambda: m.update(version="1"),
        "vfloat": lambda: m.update(version=1.5), "v99": lambda: m.update(version=99),
        "params_extra": lambda: m["params"].update(bogus=1),
        "params_type": lambda: m["params"].update(m="30"),
        "params_neg": lambda: m["params"].update(topk=-1),
        "graph_unknown": lambda: m.update(graphs=["nope"]),
        "graphs_str": lambda: m.update(graphs="gmm"), "graphs_int": lambda: m.update(graphs=[1]),
        "convs_empty": lambda: m.update(conversations=[]),
        "convs_dict": lambda: m.update(conversations={}),
        "conv_no_id": lambda: c0.pop("id"),
        "conv_extra_session": lambda: (c0["session_ids"].append("x"),
                                       c0["session_dates"].append("")),
        "conv_int_session": lambda: c0["session_ids"].__setitem__(0, 7),
        "conv_short_dates": lambda: c0["session_dates"].pop(),
        "questions_empty": lambda: m.update(questions=[]),
        "question_extra": lambda: m["questions"].append(dict(q0)),
        "question_no_text": lambda: q0.pop("text"),
        "question_abst_str": lambda: q0.update(is_abstention="no"),
        "question_evidence_str": lambda: q0.update(evidence_session_ids="s"),
        "question_list": lambda: m["questions"].__setitem__(0, []),
        "lexical_str": lambda: m.update(lexical="x"),
        "lexical_no_tokenizer": lambda: m.update(lexical={"n_terms": 3}),
        "lexical_bad_tokenizer": lambda: m["lexical"].update(tokenizer={"bogus": 1}),
        "config_list": lambda: m.update(config=[]),
        "config_expansion_str": lambda: m["config"].update(expansion="offline"),
        "config_summaries_int": lambda: m["config"].update(expansion={"summaries": 3}),
        "config_build_list": lambda: m["config"].update(build=[]),
        "surrogate": lambda: q0.update(answer="x\udfff"),  # parses, cannot be written
    }
    edits[what]()
    return m


MANIFEST_EDITS = ["no_params", "no_graphs", "no_config", "no_convs", "no_questions",
                  "no_format", "no_version", "format", "v0", "v-1", "vtrue", "vstr", "vfloat",
                  "v99", "params_extra", "params_type", "params_neg", "graph_unknown",
                  "graphs_str", "graphs_int", "convs_empty", "convs_dict", "conv_no_id",
                  "conv_extra_session", "conv_int_session", "conv_short_dates",
                  "questions_empty", "question_extra", "question_no_text",
                  "question_abst_str", "question_evidence_str", "question_list",
                  "lexical_str", "lexical_no_tokenizer", "lexical_bad_tokenizer",
                  "config_list", "config_expansion_str", "config_summaries_int",
                  "config_build_list", "surrogate"]


def test_every_edited_manifest_gets_a_one_line_error(tmp_path, small):
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    mf = _version_dir(dst) / "manifest.json"
    original = mf.read_text()
    messages = {}
    for what in MANIFEST_EDITS:
        mf.write_text(json.dumps(_edit(json.loads(original), what)))
        with pytest.raises(IndexFormatError) as e:
            load_index(dst)
        messages[what] = str(e.value)
        assert "\n" not in messages[what] and str(mf.parent) in messages[what], (what, e.value)
    assert "field 'version': expected an integer, got \"1\"" in messages["vstr"]
    assert "version 99 is newer" in messages["v99"]
    assert "field 'params.bogus': unknown setting" in messages["params_extra"]
    assert "field 'questions[0].text': missing" in messages["question_no_text"]
    assert "field 'questions[0].answer': a lone UTF-16 surrogate" in messages["surrogate"]
    # read by the read path (signals="auto"): a string crashed search, eval and stats
    assert "field 'config.expansion': expected an object" in messages["config_expansion_str"]
    assert "field 'config.expansion.summaries'" in messages["config_summaries_int"]
    for raw in (b"\xff\xfe{", b"{", b"[]", b"", b"[" * 5000 + b"]" * 5000):
        mf.write_bytes(raw)
        with pytest.raises(IndexFormatError, match=str(mf)):
            load_index(dst)


def test_a_bad_pointer_gets_a_one_line_error(tmp_path, small):
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    top = json.loads((dst / "manifest.json").read_text())
    for current, want in (("../a", "expected 'v-'"), (5, "expected 'v-'"),
                          ("v-" + "0" * 32, "incomplete")):
        (dst / "manifest.json").write_text(json.dumps(dict(top, current=current)))
        with pytest.raises(IndexFormatError, match=want):
            load_index(dst)


# ---- item 7 and 3: damaged tensors -------------------------------------------------------
def _tensor_edit(t: dict, what: str):
    if what == "nan_gran":
        t["gran"][1, 2, 3] = float("nan")
    elif what == "inf_q_emb":
        t["q_emb"][0, 0] = float("inf")
    elif what == "nan_concat":
        t["concat"][0, 0] = float("nan")
    elif what == "nan_tf":
        t["lexical.S.tf"][0] = float("nan")
    elif what == "negative_tf":
        t["lexical.T.tf"][0] = -3.0
    elif what == "huge_turns":
        t["turns"][0, 0] = 3e30
    elif what == "row_slot_range":
        t["row_slot"][0] = 10_000
    elif what == "offsets_down":
        t["conv_offsets"][0] = 3
    elif what == "graph_range":
        t["graph.gmm.indices"][0] = 10_000
    elif what == "graph_short":
        t["graph.gmm.indptr"] = t["graph.gmm.indptr"][:-1].clone()
    elif what == "q_conv_range":
        t["q_conv"][0] = 5
    elif what == "gran_int":
        t["gran"] = t["gran"].long()
    elif what == "no_q_emb":
        del t["q_emb"]
    elif what == "q_emb_rows":
        t["q_emb"] = torch.cat([t["q_emb"], t["q_emb"][:1]])
    elif what == "gran_2d":
        t["gran"] = t["gran"][:, 0].contiguous()
    elif what == "lexical_term_range":
        t["lexical.S.indices"][0] = 10**9
    elif what == "vocab_offsets":
        t["lexical.vocab.offsets"][-1] += 5
    elif what == "turn_ptr":
        t["turn_ptr"][1] = -1
    return t


TENSOR_EDITS = ["nan_gran", "inf_q_emb", "nan_concat", "nan_tf", "negative_tf", "huge_turns",
                "row_slot_range",
                "offsets_down", "graph_range", "graph_short", "q_conv_range", "gran_int",
                "no_q_emb", "q_emb_rows", "gran_2d", "lexical_term_range", "vocab_offsets",
                "turn_ptr"]


def test_every_damaged_tensor_file_gets_a_one_line_error(tmp_path, small):
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    tf = _version_dir(dst) / "tensors.safetensors"
    raw = tf.read_bytes()
    for what in TENSOR_EDITS:
        save_file(_tensor_edit(load_file(str(path.joinpath(_version_dir(path).name,
                                                            "tensors.safetensors"))), what),
                  str(tf))
        with pytest.raises(IndexFormatError) as e:
            load_index(dst)
        assert "\n" not in str(e.value) and str(tf) in str(e.value), (what, e.value)
        if what.startswith(("nan", "inf")) and what != "nan_tf":
            assert "NaN or inf" in str(e.value)
    huge_header = (10**12).to_bytes(8, "little") + raw[8:]
    for damaged in (raw[: len(raw) // 2], raw[:4], b"", huge_header, os.urandom(500)):
        tf.write_bytes(damaged)
        with pytest.raises(IndexFormatError, match="unreadable safetensors"):
            load_index(dst)
    tf.unlink()
    with pytest.raises(IndexFormatError, match="incomplete"):
        load_index(dst)
    os.mkfifo(tf)  # would block a reader forever
    with pytest.raises(IndexFormatError, match="not a regular file"):
        load_index(dst)


def test_cli_exits_2_in_one_line_on_nan_embeddings_and_truncated_tensors(tmp_path, small):
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    tf = _version_dir(dst) / "tensors.safetensors"
    save_file(_tensor_edit(load_file(str(tf)), "nan_gran"), str(tf))
    line = one_line_error(run_cli("eval", dst, "--method", "session", "--device", "cpu"))
    assert line.startswith("error: ") and "NaN or inf" in line
    tf.write_bytes(tf.read_bytes()[:100])
    assert "unreadable" in one_line_error(run_cli("eval", dst, "--device", "cpu"))


# ---- round 3: indexes that load, and tampered ones that must not ----------------------
from _hostile import rewrite_index, version_dir  # noqa: E402


def _tensors_of(path: Path) -> dict:
    return load_file(str(version_dir(path) / "tensors.safetensors"))


def _manifest_of(path: Path) -> dict:
    return json.loads((version_dir(path) / "manifest.json").read_text())


def test_an_index_without_turn_embeddings_or_texts_saves_and_loads(tmp_path,
                                                                   locomo_list_path):
    """Item 2: keep_turns=False kept turn_ptr (for the texts) but no turns; the reader
    wanted both.  The loaded turn texts are the dataset's turns, in order."""
    from _hostile import small_dataset

    for kw in ({"keep_turns": False}, {"keep_turns": False, "keep_text": False}):
        idx = build_small_index(locomo_list_path, tmp_path, **kw)
        back = load_index(save_index(idx, tmp_path / f"idx{len(kw)}"))
        assert back.snapshot().turns is None and torch.equal(back.snapshot().turn_ptr, idx.snapshot().turn_ptr)
        turns = [t for s in small_dataset(locomo_list_path).conversations[0].sessions
                 for t in s.turns]
        if "keep_text" in kw:
            assert back.snapshot().turn_text is None
        else:
            assert [back.snapshot().turn_text[i] for i in range(len(turns))] == turns
        _same(idx, back)


def test_a_huge_or_non_finite_manifest_number_is_one_line(tmp_path, small):
    """Item 11: a manifest integer of 5,000 digits (Python's int() refuses more than
    4,300, a ValueError json does not wrap), NaN and Infinity (not JSON)."""
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    mf = version_dir(dst) / "manifest.json"
    text = mf.read_text()
    for bad, want in (("1" * 5000, "integer of 5000 digits"), ("NaN", "NaN is not"),
                      ("-Infinity", "-Infinity is not")):
        mf.write_text(text.replace('"m": 4', f'"m": {bad}', 1))
        with pytest.raises(IndexFormatError, match=want) as e:
            load_index(dst)
        assert str(mf) in str(e.value) and "\n" not in str(e.value)


def test_a_sparse_3_gb_manifest_is_refused_before_it_is_read(tmp_path, small):
    """Item 16: the manifest was read whole (6.4 GB and 40 s for a 3 GB sparse file)."""
    _, path = small
    code = HWM + ("import sys\nfrom memgas_gpu.storage.persist import load_index\n"
                  "base = hwm_bytes()\n"
                  "try:\n    load_index(sys.argv[1])\nexcept Exception as e:\n    print(e)\n"
                  "print(hwm_bytes() - base)\n")
    for which in ("version", "pointer"):
        dst = _copy(path, tmp_path / which)
        mf = version_dir(dst) / "manifest.json" if which == "version" else dst / "manifest.json"
        with open(mf, "r+b") as f:
            f.truncate(3 << 30)  # sparse: no disk used
        res = subprocess.run([sys.executable, "-c", code, str(dst)], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        msg, grown = res.stdout.strip().splitlines()[-2:]
        assert f"{mf}: 3221225472 bytes, more than the 268435456 a manifest may hold" in msg
        assert int(grown) < 64 << 20, grown


def _swap_turn_texts(t: dict) -> dict:
    """Turn texts 0 and 1 swapped, offsets adjusted: a valid table, other contents."""
    b, o = t["turn_text.bytes"], t["turn_text.offsets"]
    a0, a1, a2 = int(o[0]), int(o[1]), int(o[2])
    t["turn_text.bytes"] = torch.cat([b[a1:a2], b[a0:a1], b[a2:]])
    t["turn_text.offsets"] = o.clone()
    t["turn_text.offsets"][1] = a0 + (a2 - a1)
    return t


def test_contents_changed_after_writing_are_refused(tmp_path, small):
    """Item 20: reordered turn texts or embedding rows loaded and answered silently;
    a hand-edited manifest too.  The checksums written with them catch each."""
    _, path = small
    for what in ("turn_texts", "gran_rows", "manifest"):
        dst = _copy(path, tmp_path / what)
        tf = version_dir(dst) / "tensors.safetensors"
        t = _tensors_of(dst)
        if what == "turn_texts":
            save_file(_swap_turn_texts(t), str(tf))
            want = "tensor 'turn_text.bytes': its contents differ from the CRC-32"
        elif what == "gran_rows":
            t["gran"] = t["gran"][[1, 0, *range(2, t["gran"].shape[0])]].contiguous()
            save_file(t, str(tf))
            want = "tensor 'gran': its contents differ"
        else:
            mf = version_dir(dst) / "manifest.json"
            m = json.loads(mf.read_text())
            m["conversations"][0]["session_dates"].reverse()
            mf.write_text(json.dumps(m))
            want = "differ from the CRC-32 checksum the folder's pointer recorded"
        with pytest.raises(IndexFormatError, match=want) as e:
            load_index(dst)
        assert "\n" not in str(e.value)
        line = one_line_error(run_cli("eval", dst, "--method", "session", "--device", "cpu"))
        assert "CRC-32" in line


def _straddle(t: dict, char: bytes) -> None:
    """A two-byte character across the end of turn text 0: the whole buffer is UTF-8,
    but text 0 ends and text 1 starts in the middle of it."""
    end = int(t["turn_text.offsets"][1])
    t["turn_text.bytes"][end - 1:end + 1] = torch.tensor(list(char), dtype=torch.uint8)


def _two_conversation_index(tmp_path: Path) -> Path:
    idx = index_from_nodes(torch.randn(5 * 4, 8), [2, 3])
    idx.snapshot().graph(device="cpu")
    return save_index(idx, tmp_path / "two")


def test_tampered_contents_with_recomputed_checksums_are_refused(tmp_path, small):
    """Items 11 and 20: a hostile editor recomputes every checksum; what it changed must
    still be refused, each with one line naming the file and the field or tensor."""
    _, path = small
    edits = {
        "row_slot_int8": ("t", lambda t, m: t.update(row_slot=t["row_slot"].to(torch.int8)),
                          "tensor 'row_slot': dtype int8, expected int64"),
        "row_slot_uint8": ("t", lambda t, m: t.update(row_slot=t["row_slot"].to(torch.uint8)),
                           "tensor 'row_slot': dtype uint8"),
        "vocab_int64": ("t", lambda t, m: t.update(
            {"lexical.vocab.bytes": t["lexical.vocab.bytes"].long()}),
            "tensor 'lexical.vocab.bytes': dtype int64, expected uint8"),
        "text_int64": ("t", lambda t, m: t.update(
            {"turn_text.bytes": t["turn_text.bytes"].long()}),
            "tensor 'turn_text.bytes': dtype int64, expected uint8"),
        "text_not_utf8": ("t", lambda t, m: t["turn_text.bytes"].__setitem__(0, 0xFF),
                          "tensor 'turn_text.bytes': not UTF-8"),
        "text_cut_char": ("t", lambda t, m: _straddle(t, "é".encode()),
                          "a string starts inside a UTF-8 character"),
        "text_few_offsets": ("t", lambda t, m: t.update(
            {"turn_text.offsets": t["turn_text.offsets"][:-5].clone()}),
            "tensor 'turn_text.offsets': dimension 0"),
        "vocab_not_utf8": ("t", lambda t, m: t["lexical.vocab.bytes"].__setitem__(0, 0xC3),
                           "tensor 'lexical.vocab.bytes': not UTF-8"),
        "m_float": ("m", lambda t, m: m["params"].update(m=1e30),
                    "field 'params.m': expected an integer"),
        "m_huge": ("m", lambda t, m: m["params"].update(m=10**30),
                   "field 'params.m': 1000000000000000000000000000000 is outside"),
        "rule": ("m", lambda t, m: m["params"].update(rule="bogus"),
                 "field 'params.rule': 'bogus' is not one of gmm, topk"),
        "graph_bogus": ("tm", lambda t, m: (
            m.update(graphs=["bogus", "gmm"]),
            t.update({"graph.bogus.indptr": t["graph.gmm.indptr"].clone(),
                      "graph.bogus.indices": t["graph.gmm.indices"].clone()})),
            "field 'graphs[0]': 'bogus' is not a graph name"),
        "pooling": ("m", lambda t, m: m["config"]["encoder"].update(pooling="bogus"),
                    "field 'config.encoder.pooling': expected one of mean, cls"),
        "max_length": ("m", lambda t, m: m["config"]["encoder"].update(max_length=-5),
                       "field 'config.encoder.max_length'"),
        "source_type": ("m", lambda t, m: m["config"].update(encoder_source="/etc"),
                        "field 'config.encoder_source': expected an object"),
        "token_pattern": ("m", lambda t, m: m["lexical"]["tokenizer"].update(
            token_pattern=r"(\w+\s?)+$"),
            "field 'lexical.tokenizer.token_pattern': '(\\\\w+\\\\s?)+$' is not a known token"),
        "stemmer": ("m", lambda t, m: m["lexical"]["tokenizer"].update(stemmer="bogus"),
                    "field 'lexical.tokenizer.stemmer'"),
        "dup_session": ("m", lambda t, m: m["conversations"][0]["session_ids"].__setitem__(
            1, m["conversations"][0]["session_ids"][0]),
            "field 'conversations[0].session_ids': session id 'session_1' appears twice"),
    }
    for what, (kind, edit, want) in edits.items():
        dst = _copy(path, tmp_path / what)
        t, m = _tensors_of(dst), _manifest_of(dst)
        edit(t, m)
        rewrite_index(dst, m, t if "t" in kind else None)
        try:
            load_index(dst)
            raise AssertionError(f"{what}: loaded")
        except IndexFormatError as e:
            msg = str(e)
        assert "\n" not in msg and str(version_dir(dst)) in msg, (what, msg)
        assert want in msg, (what, msg)
    two = _two_conversation_index(tmp_path)
    m = _manifest_of(two)
    m["conversations"][1]["id"] = m["conversations"][0]["id"]
    rewrite_index(two, m)
    # named by the manifest's check (the field), before any tensor is read
    with pytest.raises(IndexFormatError,
                       match="field 'conversations': conversation id '0' appears twice"):
        load_index(two)


def test_the_manifest_never_brings_a_regex_that_runs(tmp_path, small):
    """Item 22: '(\\w+\\s?)+$' in the manifest hung every query past 60 s.  Only a
    registered pattern is used; a custom one reopens once registered by name."""
    from memgas_gpu.lexical import Tokenizer

    _, path = small
    dst = _copy(path, tmp_path / "idx")
    m = _manifest_of(dst)
    custom = r"(?u)\b\w+\b"  # words of one character too
    m["lexical"]["tokenizer"]["token_pattern"] = custom
    rewrite_index(dst, m)
    with pytest.raises(IndexFormatError, match="register_token_pattern"):
        load_index(dst)
    from memgas_gpu.lexical.tokenize import TOKEN_PATTERNS, register_token_pattern

    try:
        register_token_pattern("word1", custom)
        back = load_index(dst)
        assert back.snapshot().lexical.tokenizer.tokens("q z violin") == ["q", "z", "violin"]
    finally:
        TOKEN_PATTERNS.pop("word1", None)
    assert Tokenizer(token_pattern="word2").describe() == Tokenizer().describe()
    with pytest.raises(ValueError, match="taken"):
        register_token_pattern("word2", custom)


def test_the_recorded_encoder_is_resolved_offline(tmp_path, small, monkeypatch):
    """Item 23: a Hub id in the manifest made opening an index reach for the network
    (46 s of retries, then OSError); a folder like /etc was handed to transformers."""
    import socket

    from memgas_gpu.errors import MemgasError

    _, path = small
    idx = load_index(path)
    cfg = idx.config

    def no_network(*a, **k):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.delenv("MEMGAS_ALLOW_DOWNLOAD", raising=False)
    idx.config = dict(cfg, encoder_source={"path": "sentence-transformers/all-MiniLM-L6-v2",
                                           "bundled": False})
    with pytest.raises(MemgasError, match="not in the local Hugging Face cache and "
                                          "downloads are off"):
        idx.query_encoder()
    from memgas_gpu.encode import EncoderRecordError, recorded_encoder

    (tmp_path / "bin_only").mkdir()
    (tmp_path / "bin_only" / "config.json").write_text("{}")
    (tmp_path / "bin_only" / "pytorch_model.bin").write_bytes(b"pickle")
    for where, want in (("/etc", "not a model folder"), ("/no/such/dir", "does not exist"),
                        (str(tmp_path / "bin_only"), "holds no safetensors weights")):
        with pytest.raises(EncoderRecordError, match=want):
            recorded_encoder(dict(cfg, encoder_source={"path": where, "bundled": False}))
    enc = recorded_encoder(cfg)  # the recorded local folder opens, same fingerprint
    assert enc.fingerprint == cfg["encoder_fingerprint"]


def test_search_with_an_encoder_record_naming_etc_is_one_line(tmp_path, small):
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    m = _manifest_of(dst)
    m["config"]["encoder_source"] = {"path": "/etc", "bundled": False}
    rewrite_index(dst, m)
    line = one_line_error(run_cli("search", dst, "violin", "--conversation", "conv-30",
                                  "--device", "cpu"))
    assert "'/etc' is not a model folder" in line
