"""Corrupted, edited, hostile, concurrently replaced and killed-while-written memory
folders (issue 17, items 3 (NaN embeddings), 6, 7 and 9), in the one folder format (4)
and the older ones a save converts.

Hostile *contents* are written the way an editor who knows the format can
(``tests/_format4.py``: blobs appended with their CRC-32 recomputed, the directory and
the root written again, the pointer moved), so that the reader's validation, not its
checksums, must refuse them; damage that keeps the old checksums is refused by them,
naming the file and the offset.  The same checks run on the parts of an older folder
(``tests/_legacy_writers.py``)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import _format4 as f4
from _hostile import ROOT, build_small_index, one_line_error, run_cli
from _legacy_writers import write_v1, write_v2, write_v3
from _rss import HWM
from memgas_gpu.bench.data import index_from_nodes
from memgas_gpu.retrieve import IndexFormatError, MemoryIndex, retrieve
from memgas_gpu.storage.commit import read_commit
from memgas_gpu.storage.folder import folder_format, save_index

def load_index(path):
    """Load a folder and read all of it: a memory opened on a format-4 folder reads each
    conversation and store chunk (and refuses a damaged one) the first time a read
    needs it (docs/index-format.md, "Reading a folder lazily"); a whole snapshot needs
    every one."""
    idx = MemoryIndex.load(path)
    idx.snapshot()
    return idx


def load_all(path):
    """:func:`load_index`, and the store's reference counts, which writes and commits
    read (here all of them, through the commit's reader)."""
    idx = load_index(path)
    read_commit(path)[1].ref_tree.counts()
    return idx


@pytest.fixture(scope="module")
def small(tmp_path_factory, locomo_list_path):
    folder = tmp_path_factory.mktemp("small")
    idx = build_small_index(locomo_list_path, folder)
    idx.snapshot().graph()
    save_index(idx, folder / "idx")
    return idx, folder / "idx"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _same(a: MemoryIndex, b: MemoryIndex) -> None:
    ra, rb = retrieve(a, method="memgas", device="cpu"), retrieve(b, method="memgas",
                                                                  device="cpu")
    assert torch.equal(ra.rankings, rb.rankings)


def _names_a_file(dst: Path, msg: str) -> None:
    """One line naming the pointer or a pack of ``dst`` (or the folder, for a reference
    that names no blob)."""
    assert "\n" not in msg, msg
    assert re.match(re.escape(str(dst)) + r"(/manifest\.json|/data/[0-9]{8}\.pack|/data)?: ",
                    msg), msg


def _refused(dst: Path, *want: str, load=load_index) -> str:
    with pytest.raises(IndexFormatError) as e:
        load(dst)
    msg = str(e.value)
    _names_a_file(dst, msg)
    for w in want:
        assert w in msg, (w, msg)
    return msg


def _layout(path: Path) -> list:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ---- item 9 and the layout ------------------------------------------------------------
def test_every_index_file_has_the_umask_mode(tmp_path, small):
    idx, _ = small
    old = os.umask(0o027)
    try:
        out = save_index(idx, tmp_path / "idx")
        save_index(idx, out)  # replaced: a new pack, a new pointer
    finally:
        os.umask(old)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {str(p.relative_to(out)) for p in files} >= {
        "manifest.json", ".lock", "data/00000002.pack"}
    assert any(p.parent.name == "wal" for p in files)
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {oct(0o640)}


def test_replacing_keeps_one_commit_and_removes_leftovers(tmp_path, small):
    """What killed writers leave in the folder (a pointer temporary, the pack of an
    unfinished commit, a temporary in data/) is removed by the next save, which leaves
    one pack; nothing beside the folder is touched."""
    idx, _ = small
    out = save_index(idx, tmp_path / "idx")
    (out / ".manifest.json.k2j3x9y_.tmp").write_text("{")
    (out / "data" / "00000009.pack").write_bytes(b"MGAS-PCK unfinished")
    (out / "data" / ".00000001.pack.abcdefgh.tmp").write_bytes(b"x")
    (tmp_path / ".idx.old").mkdir()  # another program's files beside the folder
    (tmp_path / ".idx.k2j3x9y_.tmp").mkdir()
    save_index(idx, out)
    assert _layout(out) == [".lock", "data", "data/00000010.pack", "manifest.json", "wal",
                            *[f"wal/{p.name}" for p in (out / "wal").glob("*.log")]]
    assert len(list((out / "wal").glob("*.log"))) == 1
    assert (tmp_path / ".idx.old").is_dir() and (tmp_path / ".idx.k2j3x9y_.tmp").is_dir()
    assert f4.pointer(out)["root"][0] == 10
    _same(idx, load_index(out))


@pytest.mark.parametrize("version", [1, 2, 3])
def test_older_folders_load_and_are_converted_when_saved_over(tmp_path, small, version):
    """A folder of format 1, 2 or 3 loads as it is; a save over it writes format 4 and
    removes every file of the older format, by its exact name (a file of the user's
    named like one is kept)."""
    idx, _ = small
    old = tmp_path / f"v{version}"
    {1: write_v1, 2: write_v2, 3: write_v3}[version](idx, old)
    if version == 2:  # what a version-2 writer killed mid-save left
        (old / ".tmp-v-0123").mkdir()
        (old / ".tmp-v-0123" / "tensors.safetensors").write_bytes(b"partial")
        (old / f"v-{'ab' * 16}").mkdir()  # an unreferenced version
    (old / "v-notes.txt").write_text("mine")  # not a version's name: kept
    assert folder_format(old) == version
    _same(idx, load_index(old))
    save_index(idx, old)
    assert folder_format(old) == 4
    left = [p for p in _layout(old) if not p.startswith(("data/0", "wal/0"))]
    assert left == [".lock", "data", "manifest.json", "v-notes.txt", "wal"], left
    assert len(list((old / "data").iterdir())) == 1 and f4.root(old)["commit"] >= 1
    assert (old / "v-notes.txt").read_text() == "mine"
    _same(idx, load_index(old))


def test_saving_never_replaces_a_folder_that_is_not_an_index(tmp_path, small):
    idx, _ = small
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(IndexFormatError, match="not an index"):
        save_index(idx, tmp_path / "mine")
    assert _layout(tmp_path / "mine") == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(IndexFormatError, match="not a folder"):
        save_index(idx, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "x"


def test_a_deleted_pointer_is_refused_and_nothing_is_overwritten(tmp_path, small):
    """``manifest.json`` gone while the packs are there: every reader and writer refuses
    ("missing … pointer"), and neither ``open`` nor ``save`` writes over the packs (the
    pointer may still be restored)."""
    idx, path = small
    dst = _copy(path, tmp_path / "idx")
    (dst / "manifest.json").unlink()
    before = f4.folder_bytes(dst)
    for how in (load_index, lambda d: MemoryIndex.open(d),
                lambda d: MemoryIndex.open(d, readonly=True),
                lambda d: save_index(idx, d), lambda d: save_index(idx, d, force=True)):
        with pytest.raises(IndexFormatError) as e:
            how(dst)
        msg = str(e.value)
        assert msg.startswith(f"{dst / 'manifest.json'}: missing") and "pointer" in msg, msg
        assert "\n" not in msg
        assert f4.folder_bytes(dst) == before


def test_a_missing_or_irregular_pack_is_refused_naming_it(tmp_path, small):
    """A pack deleted, replaced by a folder or a FIFO (which would block a reader for
    ever), or a ``data`` that is a file: one line naming it, never a hang."""
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    pack = dst / "data" / "00000001.pack"
    raw = pack.read_bytes()
    pack.unlink()
    _refused(dst, f"{pack}: missing")
    with pytest.raises((IndexFormatError, FileNotFoundError), match=re.escape(str(pack))):
        MemoryIndex.open(dst)  # the writer refuses too, and changes nothing
    assert not pack.exists() and f4.pointer(dst)["root"][0] == 1
    pack.mkdir()
    _refused(dst, f"{pack}: a folder, not a file")
    pack.rmdir()
    os.mkfifo(pack)
    got = {}

    def read():
        try:
            load_index(dst)
        except BaseException as e:  # noqa: BLE001 - checked below
            got["e"] = e

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # release the blocked open, then fail
        os.close(os.open(pack, os.O_WRONLY | os.O_NONBLOCK))
        t.join(30)
        pytest.fail("a FIFO in place of a pack blocked the reader")
    assert isinstance(got.get("e"), IndexFormatError), got
    assert str(got["e"]) == f"{pack}: not a regular file"
    pack.unlink()
    shutil.rmtree(dst / "data")
    (dst / "data").write_text("not a folder")
    _refused(dst, f"{dst / 'data'}: not a folder")
    (dst / "data").unlink()
    (dst / "data").mkdir()
    pack.write_bytes(raw)
    load_index(dst)


# ---- item 6: kills and concurrency, with real processes ---------------------------------
_WRITER = """
import sys
from memgas_gpu.retrieve import MemoryIndex
a = MemoryIndex.load(sys.argv[1])
b = MemoryIndex.load(sys.argv[2])
print("ready", flush=True)
for i in range(int(sys.argv[4])):
    (a if i % 2 else b).save(sys.argv[3], force=True)  # replace, whatever is there
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


def _clean(dst: Path) -> None:
    """One pack, one pointer, no temporary: what a save leaves."""
    assert len(list((dst / "data").iterdir())) == 1, _layout(dst)
    assert not [p for p in _layout(dst) if p.endswith(".tmp")], _layout(dst)


def test_a_killed_writer_leaves_the_old_or_the_new_index(tmp_path, small):
    a, b, marks = _two_sources(tmp_path, small)
    assert len(marks) == 2
    delays = (0.05, 0.3, 0.6)  # three writers at once, each on a folder of its own
    dsts = [tmp_path / f"dst{i}" for i in range(len(delays))]
    for dst in dsts:
        save_index(load_index(a), dst)
    writers = [_writer(a, b, dst, 100_000) for dst in dsts]
    for w in writers:
        assert w.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    for w, delay in zip(writers, delays):
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
        w.send_signal(signal.SIGKILL)
    for w, dst in zip(writers, dsts):
        w.wait(timeout=30)
        got = load_index(dst)  # never "no index", never a partial one
        assert int(got.q_emb[0, 0].mul(1e6).round()) in marks
    for dst in dsts:
        save_index(load_index(a), dst)  # the next writer cleans what the killed one left
        _clean(dst)
    with MemoryIndex.open(dsts[0]) as m:  # and the writer that opens it reads it whole
        assert int(m.q_emb[0, 0].mul(1e6).round()) in marks


def test_readers_always_see_a_whole_index_while_writers_race(tmp_path, small):
    a, b, marks = _two_sources(tmp_path, small)
    dst = tmp_path / "dst"
    save_index(load_index(a), dst)
    writers = [_writer(a, b, dst, 30) for _ in range(2)]
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
    _clean(dst)



def test_a_save_crashed_at_any_call_leaves_the_old_or_the_new_memory(tmp_path, small):
    """A kill or a power loss at each write, fsync, rename and unlink of a save over a
    memory (the recording file layer of tests/_fsrecord.py keeps what each would leave):
    the folder holds the old memory or the new one, complete, never none; the next save
    over what the kill left leaves one pack and no temporary."""
    from _fsrecord import FSRecorder, SimulatedCrash

    a, b, _ = _two_sources(tmp_path, small)
    new = load_index(b)

    def mark(folder):
        return int(load_index(folder).q_emb[0, 0].mul(1e6).round())

    old_mark, new_mark = mark(a), mark(b)
    seen, n = set(), 1
    while True:
        base = tmp_path / f"crash-{n}"
        dst = _copy(a, base / "mem")
        with FSRecorder(dst, real_fsync=False) as rec:
            rec.crash_at(n, base / "states")
            try:
                save_index(new, dst, force=True)
            except SimulatedCrash:
                pass
            for fd in rec.leaked_fds():
                os.close(fd)
        if rec.crash is None:  # n is past the save's last call
            break
        for state in (rec.crash.kill, rec.crash.power):
            got = mark(state)
            assert got in (old_mark, new_mark), (n, rec.crash.event)
            seen.add(got)
        save_index(new, rec.crash.kill, force=True)
        _clean(rec.crash.kill)
        assert mark(rec.crash.kill) == new_mark
        shutil.rmtree(base)
        n += 1
    assert n > 10 and seen == {old_mark, new_mark}

# ---- item 7: the pointer and the root, edited ----------------------------------------------
def test_a_bad_pointer_gets_a_one_line_error(tmp_path, small):
    """``manifest.json`` (no checksum of its own): not JSON, wrong fields, or a root
    reference to no root (another blob, a missing pack, past the end, a checksum that
    is not the blob's)."""
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    mf = dst / "manifest.json"
    original = mf.read_bytes()
    ptr = json.loads(original)
    r = f4.root(dst)
    pack = str(dst / "data" / "00000001.pack")
    cases = {
        "no_format": ({k: v for k, v in ptr.items() if k != "format"}, "not a memgas_gpu index"),
        "format": (dict(ptr, format="x"), "not a memgas_gpu index"),
        "no_version": ({k: v for k, v in ptr.items() if k != "version"},
                       "field 'version': expected an integer"),
        "v0": (dict(ptr, version=0), "field 'version': 0 is not a format version"),
        "v-1": (dict(ptr, version=-1), "field 'version': -1 is not"),
        "vtrue": (dict(ptr, version=True), "field 'version': expected an integer, got true"),
        "vstr": (dict(ptr, version="4"), "field 'version': expected an integer, got \"4\""),
        "vfloat": (dict(ptr, version=4.0), "field 'version': expected an integer, got 4.0"),
        "v99": (dict(ptr, version=99), "index format version 99 is newer than this "
                "memgas_gpu reads (4); upgrade"),
        "no_commit": ({k: v for k, v in ptr.items() if k != "commit"},
                      "field 'commit': expected a positive integer"),
        "commit_str": (dict(ptr, commit="1"), "field 'commit': expected a positive integer"),
        "commit_0": (dict(ptr, commit=0), "field 'commit': expected a positive integer"),
        "commit_other": (dict(ptr, commit=2), "the root: commit 1, the pointer names 2"),
        "no_root": ({k: v for k, v in ptr.items() if k != "root"},
                    "field 'root': expected a blob reference"),
        "root_str": (dict(ptr, root="data/00000001.pack"), "field 'root': expected a blob"),
        "root_short": (dict(ptr, root=ptr["root"][:3]), "field 'root': expected a blob"),
        "root_negative": (dict(ptr, root=[1, -24, 10, 0]), "field 'root': expected a blob"),
        "root_huge": (dict(ptr, root=[1, 24, 10**20, 0]),
                      f"{pack}: offset 24: the root: 100000000000000000000 bytes, more than"),
        "root_crc": (dict(ptr, root=ptr["root"][:3] + [ptr["root"][3] ^ 1]),
                     f"{pack}: offset {ptr['root'][1]}: the root differs from the CRC-32"),
        "root_past_end": (dict(ptr, root=[1, ptr["root"][1] + 10, ptr["root"][2], 0]),
                          f"{pack}: offset {ptr['root'][1] + 10}: the root is cut short"),
        "root_missing_pack": (dict(ptr, root=[7] + ptr["root"][1:]),
                              f"{dst / 'data' / '00000007.pack'}: missing"),
        "root_is_questions": (dict(ptr, root=r["questions"]), "the root: not JSON"),
        "root_is_a_page": (dict(ptr, root=next(p for p in r["directory"]["pages"] if p)),
                           "the root: not the root of a format-4 commit"),
    }
    for what, (value, want) in cases.items():
        mf.write_text(json.dumps(value))
        msg = _refused(dst, want)
        assert what and msg
    for raw, want in ((b"\xff\xfe{", "not UTF-8"), (b"{", "invalid JSON"),
                      (b"[]", "expected a JSON object"), (b"", "invalid JSON"),
                      (b"[" * 5000 + b"]" * 5000, "JSON nested too deeply"),
                      (original.replace(b'"commit":1', b'"commit":' + b"1" * 5000),
                       "integer of 5000 digits"),
                      (original.replace(b'"commit":1', b'"commit":NaN'), "NaN")):
        mf.write_bytes(raw)
        _refused(dst, f"{mf}: ", want)
    mf.write_bytes(original)
    load_index(dst)


def _pop(key):
    return lambda r: r.pop(key)


def _set(**kw):
    return lambda r: r.update(kw)


#: root edits (its checksum recomputed): what is refused, naming the field
ROOT_EDITS = {
    "no_params": (_pop("params"), "field 'params': missing"),
    "no_graphs": (_pop("graphs"), "field 'graphs': missing"),
    "no_config": (_pop("config"), "field 'config': missing"),
    "no_directory": (_pop("directory"), "field 'directory': missing"),
    "no_questions": (_pop("questions"), "the questions: not a blob reference"),
    "no_lsn": (_pop("lsn"), "field 'lsn': missing"),
    "lsn_str": (_set(lsn="0"), "field 'lsn': expected int"),
    "no_format": (_pop("format"), "not the root of a format-4 commit"),
    "format": (_set(format="x"), "not the root of a format-4 commit"),
    "version": (_set(version=3), "not the root of a format-4 commit"),
    "commit": (_set(commit=2), "the root: commit 2, the pointer names 1"),
    "dim": (_set(dim=31), "field 'dim': 31, the embeddings have 32"),
    "params_extra": (lambda r: r["params"].update(bogus=1),
                     "field 'params.bogus': unknown setting"),
    "params_type": (lambda r: r["params"].update(m="30"),
                    "field 'params.m': expected an integer, got str"),
    "params_neg": (lambda r: r["params"].update(topk=-1),
                   "field 'params.topk': -1 is outside [1, 1048576]"),
    "m_float": (lambda r: r["params"].update(m=1e30), "field 'params.m': expected an integer"),
    "m_huge": (lambda r: r["params"].update(m=10**30),
               "field 'params.m': 1000000000000000000000000000000 is outside"),
    "rule": (lambda r: r["params"].update(rule="bogus"),
             "field 'params.rule': 'bogus' is not one of gmm, topk"),
    "graph_unknown": (_set(graphs=["nope"]), "field 'graphs[0]': 'nope' is not a graph name"),
    "graph_bogus": (_set(graphs=["bogus", "gmm"]), "field 'graphs[0]': 'bogus' is not a graph"),
    "graph_not_stored": (_set(graphs=["gmm", "topk5"]), "graph 'topk5': missing"),
    "graphs_str": (_set(graphs="gmm"), "field 'graphs': expected list, got str"),
    "graphs_int": (_set(graphs=[1]), "field 'graphs[0]': expected a string, got int"),
    "graphs_twice": (_set(graphs=["gmm", "gmm"]), "field 'graphs': graph 'gmm' appears twice"),
    "lexical_str": (_set(lexical="x"), "field 'lexical': expected an object"),
    "lexical_no_tokenizer": (_set(lexical={"n_terms": 3}), "field 'lexical.tokenizer': missing"),
    "lexical_bad_tokenizer": (lambda r: r["lexical"].update(tokenizer={"bogus": 1}),
                              "field 'lexical.tokenizer."),
    "lexical_none": (_set(lexical=None), "the header and the store disagree on lexical"),
    "token_pattern": (lambda r: r["lexical"]["tokenizer"].update(token_pattern=r"(\w+\s?)+$"),
                      "field 'lexical.tokenizer.token_pattern': '(\\\\w+\\\\s?)+$' is not a "
                      "known token"),
    "stemmer": (lambda r: r["lexical"]["tokenizer"].update(stemmer="bogus"),
                "field 'lexical.tokenizer.stemmer'"),
    "granularities": (lambda r: r["lexical"].update(granularities=["S", "T", "U"]),
                      "field 'lexical.granularities': must hold S, T, U, K"),
    "config_list": (_set(config=[]), "field 'config': expected dict, got list"),
    "config_expansion_str": (lambda r: r["config"].update(expansion="offline"),
                             "field 'config.expansion': expected an object"),
    "config_summaries_int": (lambda r: r["config"].update(expansion={"summaries": 3}),
                             "field 'config.expansion.summaries'"),
    "config_build_list": (lambda r: r["config"].update(build=[]),
                          "field 'config.build': expected an object"),
    "pooling": (lambda r: r["config"]["encoder"].update(pooling="bogus"),
                "field 'config.encoder.pooling': expected one of mean, cls"),
    "max_length": (lambda r: r["config"]["encoder"].update(max_length=-5),
                   "field 'config.encoder.max_length'"),
    "source_type": (lambda r: r["config"].update(encoder_source="/etc"),
                    "field 'config.encoder_source': expected an object"),
    "tables": (_set(tables=["concat", "extra"]), "field 'tables': ['concat', 'extra'], the "
               "store holds ['concat']"),
    "table_reserved": (_set(tables=["gran"]), "field 'tables[0]': expected a name"),
    "signal_module": (_set(signal_modules={"x": "os; rm -rf"}),
                      "field 'signal_modules.x': expected a module name"),
    "chunks_empty": (_set(chunks=[]), "field 'chunks': empty"),
    "chunk_slots": (lambda r: r["chunks"][0].update(slots=[0, 5]),
                    "chunk 0: 6 slots, the root says [0, 5]"),
    "chunk_from_1": (lambda r: r["chunks"][0].update(slots=[1, 6]),
                     "chunks[0] does not follow the previous one"),
    "chunk_terms": (lambda r: r["chunks"][0].update(terms=[0, 3]),
                    "chunk 0: 571 vocabulary terms, the root says [0, 3]"),
    "chunk_ref": (lambda r: r["chunks"][0].update(ref="chunk"), "store chunk 0: not a blob"),
    "conversations": (lambda r: r["directory"].update(conversations=2),
                      "the directory lists 1 conversations, the root says 2"),
    "pages": (lambda r: r["directory"].update(pages=r["directory"]["pages"][:63]),
              "directory: 63 pages, not 64"),
    "no_pages": (lambda r: r["directory"].pop("pages"), "directory: field 'pages': missing"),
    "no_conversations": (lambda r: r["directory"].update(pages=[None] * 64, conversations=0),
                         "field 'question_conversations[0]': 'conv-30' is not a conversation"),
    "surrogate": (lambda r: r["config"].update(dataset={"source": "x\udfff"}),
                  "field 'config.dataset.source': a lone UTF-16 surrogate"),
}


def test_every_edited_root_gets_a_one_line_error(tmp_path, small):
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    original = (dst / "manifest.json").read_bytes()
    for what, (edit, want) in ROOT_EDITS.items():
        f4.edit_root(dst, edit)
        msg = _refused(dst)
        assert want in msg, (what, msg)
        (dst / "manifest.json").write_bytes(original)
    root = f4.json_blob(dst, json.loads(original)["root"])
    text = json.dumps(root, separators=(",", ":"))
    assert '"m":4' in text
    for raw, want in ((b"\xff\xfe{", "not JSON (UnicodeDecodeError"), (b"{", "not JSON"),
                      (b"[]", "not the root of a format-4 commit"), (b"", "not JSON"),
                      (b"[" * 5000 + b"]" * 5000, "not JSON (RecursionError"),
                      (text.replace('"m":4', '"m":' + "1" * 5000).encode(),
                       "integer of 5000 digits"),
                      (text.replace('"m":4', '"m":NaN').encode(), "NaN is not"),
                      (text.replace('"m":4', '"m":-Infinity').encode(), "-Infinity is not")):
        f4.set_root(dst, raw=raw)
        msg = _refused(dst, "the root: ", want)
        assert str(dst / "data" / "00000001.pack") in msg
        (dst / "manifest.json").write_bytes(original)
    load_index(dst)


def _meta(**kw):
    return lambda t, m: m.update(kw)


#: a conversation's segment edited (its checksum, leaf, page and root written again)
SEGMENT_EDITS = {
    "no_id": (lambda t, m: m.pop("id"), "its segment does not match its directory entry"),
    "other_id": (_meta(id="conv-31"), "its segment does not match its directory entry"),
    "no_session_ids": (lambda t, m: m.pop("session_ids"),
                       "field 'conversations[0].session_ids': missing"),
    "extra_session": (lambda t, m: (m["session_ids"].append("x"),
                                    m["session_dates"].append("")),
                      "tensor 'slots': dimension 0 is 6, expected 7"),
    "int_session": (lambda t, m: m["session_ids"].__setitem__(0, 7),
                    "field 'conversations[0].session_ids[0]': expected a string, got int"),
    "short_dates": (lambda t, m: m["session_dates"].pop(),
                    "field 'conversations[0].session_dates': 5 dates for 6 sessions"),
    "dup_session": (lambda t, m: m["session_ids"].__setitem__(1, m["session_ids"][0]),
                    "field 'conversations[0].session_ids': session id 'session_1' appears "
                    "twice"),
    "metadata_short": (_meta(session_metadata=[{}]),
                       "field 'conversations[0].session_metadata': 1 entries for 6 sessions"),
    "metadata_str": (_meta(session_metadata="x"),
                     "field 'conversations[0].session_metadata': expected a list"),
    "surrogate": (lambda t, m: m["session_dates"].__setitem__(0, "x\udfff"),
                  "field 'session_dates[0]': a lone UTF-16 surrogate"),
    "slots_range": (lambda t, m: t["slots"].__setitem__(0, 10_000),
                    "tensor 'slots': values outside [0, 6)"),
    "slots_negative": (lambda t, m: t["slots"].__setitem__(0, -1),
                       "tensor 'slots': values outside [0, 6)"),
    "slots_int8": (lambda t, m: t.update(slots=t["slots"].to(torch.int8)),
                   "tensor 'slots': dtype int8, expected int64"),
    "slots_uint8": (lambda t, m: t.update(slots=t["slots"].to(torch.uint8)),
                    "tensor 'slots': dtype uint8, expected int64"),
    "slots_2d": (lambda t, m: t.update(slots=t["slots"][None].clone()),
                 "tensor 'slots': expected 1 dimensions"),
    "days_float32": (lambda t, m: t.update(days=t["days"].float()),
                     "tensor 'days': dtype float32, expected float64"),
    "graph_range": (lambda t, m: t["graph.gmm.indices"].__setitem__(0, 10_000),
                    "tensor 'graph.gmm.indices': values outside [0, 24)"),
    "graph_short": (lambda t, m: t.update({"graph.gmm.indptr": t["graph.gmm.indptr"][:-1]}),
                    "tensor 'graph.gmm.indptr': dimension 0 is 24, expected 25"),
    "graph_down": (lambda t, m: t["graph.gmm.indptr"].__setitem__(3, -1),
                   "tensor 'graph.gmm.indptr': not non-decreasing offsets"),
    "graph_no_indices": (lambda t, m: t.pop("graph.gmm.indices"),
                         "tensor 'graph.gmm.indices': missing"),
    "graph_missing": (lambda t, m: (t.pop("graph.gmm.indices"), t.pop("graph.gmm.indptr")),
                      "graph 'gmm': missing"),
    "no_slots": (lambda t, m: t.pop("slots"), "its segment does not match its directory"),
}

#: the questions' blob edited
QUESTION_EDITS = {
    "no_records": (lambda t, m: m.pop("records"), "field 'questions': expected a list"),
    "records_empty": (_meta(records=[], conversations=[]),
                      "tensor 'q_emb': dimension 0 is 12, expected 0"),
    "record_extra": (lambda t, m: m["records"].append(dict(m["records"][0])),
                     "field 'question_conversations': expected one conversation id per"),
    "no_text": (lambda t, m: m["records"][0].pop("text"), "field 'questions[0].text': missing"),
    "abstention_str": (lambda t, m: m["records"][0].update(is_abstention="no"),
                       "field 'questions[0].is_abstention': expected true or false"),
    "evidence_str": (lambda t, m: m["records"][0].update(evidence_session_ids="s"),
                     "field 'questions[0].evidence_session_ids': expected a list"),
    "evidence_int": (lambda t, m: m["records"][0].update(evidence_turn_ids=[3]),
                     "field 'questions[0].evidence_turn_ids[0]': expected a string"),
    "record_list": (lambda t, m: m["records"].__setitem__(0, []),
                    "field 'questions[0].id': missing"),
    "conversation_unknown": (lambda t, m: m["conversations"].__setitem__(0, "nope"),
                             "field 'question_conversations[0]': 'nope' is not a "
                             "conversation of the index"),
    "surrogate": (lambda t, m: m["records"][0].update(answer="x\udfff"),
                  "field 'records[0].answer': a lone UTF-16 surrogate"),
    "no_q_emb": (lambda t, m: t.pop("q_emb"), "tensor 'q_emb': missing"),
    "q_emb_rows": (lambda t, m: t.update(q_emb=torch.cat([t["q_emb"], t["q_emb"][:1]])),
                   "tensor 'q_emb': dimension 0 is 13, expected 12"),
    "q_emb_dim": (lambda t, m: t.update(q_emb=t["q_emb"][:, :16].clone()),
                  "tensor 'q_emb': dimension 1 is 16, expected 32"),
    "inf_q_emb": (lambda t, m: t["q_emb"].__setitem__((0, 0), float("inf")),
                  "tensor 'q_emb': 1 embedding(s) hold NaN or inf"),
    "q_terms_range": (lambda t, m: t["q.indices"].__setitem__(0, 10**9),
                      "tensor 'lexical.q.indices': values outside [0, 571)"),
    "q_no_terms": (lambda t, m: [t.pop(k) for k in ("q.indptr", "q.indices", "q.tf")],
                   "the questions' terms and the store's lexical documents disagree"),
}


def _straddle(t: dict, char: bytes) -> None:
    """A two-byte character across the end of turn text 0: the whole buffer is UTF-8,
    but text 0 ends and text 1 starts in the middle of it."""
    end = int(t["turn_text.offsets"][1])
    t["turn_text.bytes"][end - 1:end + 1] = torch.tensor(list(char), dtype=torch.uint8)


def _put(name, index, value):
    return lambda t, m: t[name].__setitem__(index, value)


#: a store chunk edited
CHUNK_EDITS = {
    "nan_gran": (_put("gran", (1, 2, 3), float("nan")),
                 "tensor 'gran': 1 embedding(s) hold NaN or inf, or overflow"),
    "nan_concat": (_put("dense.concat", (0, 0), float("nan")),
                   "tensor 'concat': 1 embedding(s) hold NaN or inf"),
    "huge_turns": (_put("turns", (0, 0), 3e30), "tensor 'turns': 1 embedding(s) hold NaN or "
                   "inf, or overflow"),
    "nan_tf": (_put("lexical.S.tf", 0, float("nan")),
               "tensor 'lexical.S.tf': negative, NaN or inf term counts"),
    "negative_tf": (_put("lexical.T.tf", 0, -3.0), "tensor 'lexical.T.tf': negative"),
    "gran_2d": (lambda t, m: t.update(gran=t["gran"][:, 0].clone()), "chunk 0: "),
    "gran_rows": (lambda t, m: t.update(gran=t["gran"][:-1].clone()),
                  "chunk 0: 5 slots, the root says [0, 6]"),
    "no_gran": (lambda t, m: t.pop("gran"), "chunk 0: 0 slots"),
    "gran_width": (lambda t, m: t.update(gran=t["gran"][:, :, :16].clone()),
                   "field 'dim': 32, the embeddings have 16"),
    "no_concat": (lambda t, m: t.pop("dense.concat"), "field 'tables': ['concat'], the store "
                  "holds []"),
    "digest_short": (lambda t, m: t.update(digest=t["digest"][:, :15].clone()),
                     "tensor 'slot_digest': dimension 1 is 15, expected 16"),
    "turn_ptr": (_put("turn_ptr", 1, -1), "tensor 'turn_ptr': not non-decreasing offsets"),
    "turns_rows": (lambda t, m: t.update(turns=t["turns"][:-1].clone()),
                   "tensor 'turns': dimension 0 is 60, expected 61"),
    "lexical_term_range": (_put("lexical.S.indices", 0, 10**9),
                           "tensor 'lexical.S.indices': values outside [0, 571)"),
    "lexical_indices_int8": (lambda t, m: t.update(
        {"lexical.K.indices": t["lexical.K.indices"].to(torch.int8)}),
        "tensor 'lexical.K.indices': dtype int8, expected int64"),
    "doc_ptr": (_put("lexical.U.doc_ptr", 2, 0),
                "tensor 'lexical.U.doc_ptr': not non-decreasing offsets"),
    "vocab_offsets": (lambda t, m: t["vocab.offsets"].__setitem__(-1, t["vocab.offsets"][-1] + 5),
                      "tensor 'vocab.offsets': not non-decreasing offsets from 0 ending at"),
    "vocab_int64": (lambda t, m: t.update({"vocab.bytes": t["vocab.bytes"].long()}),
                    "tensor 'vocab.bytes': dtype int64, expected uint8"),
    "vocab_not_utf8": (_put("vocab.bytes", 0, 0xC3), "tensor 'vocab.bytes': not UTF-8"),
    "text_int64": (lambda t, m: t.update({"turn_text.bytes": t["turn_text.bytes"].long()}),
                   "tensor 'turn_text.bytes': dtype int64, expected uint8"),
    "text_not_utf8": (_put("turn_text.bytes", 0, 0xFF), "tensor 'turn_text.bytes': not UTF-8"),
    "text_cut_char": (lambda t, m: _straddle(t, "é".encode()),
                      "tensor 'turn_text.offsets': a string starts inside a UTF-8 character"),
    "text_few_offsets": (lambda t, m: t.update(
        {"turn_text.offsets": t["turn_text.offsets"][:-5].clone()}),
        "tensor 'turn_text.offsets': dimension 0 is 57, expected 62"),
    "no_turn_ptr": (lambda t, m: t.pop("turn_ptr"), "tensor 'turn_ptr': missing"),
}


def test_tampered_contents_with_recomputed_checksums_are_refused(tmp_path, small):
    """Items 7, 11 and 20: every blob of a commit edited and its checksum recomputed (a
    hostile editor's work): each change is refused with one line naming the file and
    the field or tensor, by the validation every reader runs."""
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    original = (dst / "manifest.json").read_bytes()
    cases = [(f"segment {k}", lambda e=e: f4.edit_segment(dst, "conv-30", e), w)
             for k, (e, w) in SEGMENT_EDITS.items()]
    cases += [(f"questions {k}", lambda e=e: f4.edit_questions(dst, e), w)
              for k, (e, w) in QUESTION_EDITS.items()]
    cases += [(f"chunk {k}", lambda e=e: f4.edit_chunk(dst, 0, e), w)
              for k, (e, w) in CHUNK_EDITS.items()]
    chunk = f4.root(dst)["chunks"][0]["ref"]
    raw = f4.blob(dst, chunk)
    huge_header = (10**12).to_bytes(8, "little") + raw[8:]
    for i, damaged in enumerate((raw[: len(raw) // 2], raw[:4], b"", huge_header,
                                 os.urandom(500), raw[:8] + b"[" + raw[9:])):
        cases.append((f"chunk bytes {i}", lambda d=damaged: f4.rewrite(dst, chunks={0: d}),
                      "store chunk 0: unreadable"))
        cases.append((f"segment bytes {i}",
                      lambda d=damaged: f4.rewrite(dst, segments={"conv-30": d}),
                      "conversation 'conv-30': unreadable"))
    for what, edit, want in cases:
        edit()
        msg = _refused(dst)
        assert want in msg, (what, msg)
        (dst / "manifest.json").write_bytes(original)
    _same(load_index(path), load_index(dst))


def _two_conversation_index(tmp_path: Path) -> Path:
    idx = index_from_nodes(torch.randn(5 * 4, 8), [2, 3])
    idx.snapshot().graph(device="cpu")
    return save_index(idx, tmp_path / "two")


def test_a_conversation_listed_twice_is_refused(tmp_path):
    """A directory listing one conversation id twice (the second entry's segment says
    the same id, every checksum recomputed): one of them would be unreachable."""
    two = _two_conversation_index(tmp_path)
    d = f4.directory(two)
    assert sorted(d) == ["0", "1"]
    t, m = f4.blob_tensors(two, d["1"][2:6])
    m["id"] = "0"
    seg = f4.tensor_blob(t, m)
    i, j = f4.leaf_of("0")
    r = f4.root(two)
    page = f4.json_blob(two, r["directory"]["pages"][i])
    leaf = f4.json_blob(two, page["leaves"][j])
    leaf["entries"].append(["0", 2, *f4.append_blob(two, seg), d["1"][6]])
    page["leaves"][j] = f4.append_blob(two, f4._dumps(leaf))
    r["directory"]["pages"][i] = f4.append_blob(two, f4._dumps(page))
    r["directory"].update(conversations=3, next_ordinal=3)
    f4.set_root(two, r)
    with pytest.raises(IndexFormatError,
                       match="field 'conversations': conversation id '0' appears twice") as e:
        load_index(two)
    _names_a_file(two, str(e.value))


def test_a_flipped_byte_in_any_blob_is_refused_naming_the_file_and_offset(tmp_path, small):
    """One byte changed anywhere in any blob of the commit (the root, a chunk, the
    questions, a directory page or leaf, a segment): refused by its checksum, naming
    the pack and the blob's offset; never loaded."""
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    blobs = f4.commit_blobs(dst)
    assert {w.split()[0] for w, _ in blobs} == {"root", "chunk", "questions", "page", "leaf",
                                                "segment", "reference"}
    for what, (pack, off, n, _) in blobs:
        file = dst / "data" / f"{pack:08d}.pack"
        for at in sorted({0, n // 3, n - 1}):
            raw = file.read_bytes()
            file.write_bytes(raw[:off + at] + bytes([raw[off + at] ^ 0x40]) + raw[off + at + 1:])
            msg = _refused(dst, f"{file}: offset {off}: ", "CRC-32", load=load_all)
            assert what.split()[0] in msg or what.startswith("segment"), (what, msg)
            file.write_bytes(raw)
    file = dst / "data" / "00000001.pack"
    raw = file.read_bytes()
    off = f4.root(dst)["chunks"][0]["ref"][1]
    file.write_bytes(raw[:off + 100] + bytes([raw[off + 100] ^ 1]) + raw[off + 101:])
    damaged = f4.folder_bytes(dst)
    with pytest.raises(IndexFormatError, match=f"{file}: offset {off}: store chunk 0 differs"):
        MemoryIndex.open(dst)  # the writer refuses it too, and changes nothing
    assert f4.folder_bytes(dst).keys() == damaged.keys()
    assert f4.folder_bytes(dst)["data/00000001.pack"] == damaged["data/00000001.pack"]


def test_cli_exits_2_in_one_line_on_nan_embeddings_and_truncated_packs(tmp_path, small):
    _, path = small
    dst = _copy(path, tmp_path / "idx")
    f4.edit_chunk(dst, 0, CHUNK_EDITS["nan_gran"][0])
    line = one_line_error(run_cli("eval", dst, "--method", "session", "--device", "cpu"))
    assert line.startswith("error: ") and "NaN or inf" in line
    pack = dst / "data" / "00000001.pack"
    pack.write_bytes(pack.read_bytes()[:100])
    line = one_line_error(run_cli("eval", dst, "--device", "cpu"))
    assert f"{pack}: offset" in line and "cut short" in line


# ---- round 3: indexes that load, and tampered ones that must not ----------------------
def test_an_index_without_turn_embeddings_or_texts_saves_and_loads(tmp_path,
                                                                   locomo_list_path):
    """Item 2: keep_turns=False kept turn_ptr (for the texts) but no turns; the reader
    wanted both.  The loaded turn texts are the dataset's turns, in order."""
    from _hostile import small_dataset

    for kw in ({"keep_turns": False}, {"keep_turns": False, "keep_text": False}):
        idx = build_small_index(locomo_list_path, tmp_path, **kw)
        back = load_index(save_index(idx, tmp_path / f"idx{len(kw)}"))
        assert back.snapshot().turns is None
        assert torch.equal(back.snapshot().turn_ptr, idx.snapshot().turn_ptr)
        turns = [t for s in small_dataset(locomo_list_path).conversations[0].sessions
                 for t in s.turns]
        if "keep_text" in kw:
            assert back.snapshot().turn_text is None
        else:
            assert [back.snapshot().turn_text[i] for i in range(len(turns))] == turns
        _same(idx, back)


_SPARSE = HWM + """
import sys
from memgas_gpu.retrieve import MemoryIndex
for folder in sys.argv[1:]:
    base = hwm_bytes()
    try:
        MemoryIndex.load(folder)
        print("loaded")
    except Exception as e:
        print(e)
    print(hwm_bytes() - base)
"""


def test_a_sparse_3_gb_pointer_manifest_or_root_is_refused_before_it_is_read(tmp_path, small):
    """Item 16: a file was read whole before its size was checked (6.4 GB and 40 s for a
    3 GB sparse manifest): the pointer, an older folder's version manifest and a root
    whose reference names 3 GB are refused from their size."""
    idx, path = small
    pointer = _copy(path, tmp_path / "pointer")
    with open(pointer / "manifest.json", "r+b") as f:
        f.truncate(3 << 30)  # sparse: no disk used
    v2 = write_v2(idx, tmp_path / "v2")
    inner = v2 / json.loads((v2 / "manifest.json").read_text())["current"] / "manifest.json"
    with open(inner, "r+b") as f:
        f.truncate(3 << 30)
    root = _copy(path, tmp_path / "root")
    pack = root / "data" / "00000001.pack"
    start = pack.stat().st_size
    with open(pack, "r+b") as f:
        f.truncate(start + (3 << 30))
    ptr = f4.pointer(root)
    (root / "manifest.json").write_text(json.dumps(dict(ptr, root=[1, start, 3 << 30, 0])))
    res = subprocess.run([sys.executable, "-c", _SPARSE, str(pointer), str(v2), str(root)],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    out = res.stdout.strip().splitlines()
    assert len(out) == 6, res.stdout + res.stderr[-2000:]
    for (msg, grown), file in zip(zip(out[::2], out[1::2]),
                                  (pointer / "manifest.json", inner, pack)):
        assert msg.startswith(f"{file}: ") and "3221225472 bytes, more than the " in msg, msg
        assert int(grown) < 64 << 20, (msg, grown)


def _swap_turn_texts(t: dict) -> dict:
    """Turn texts 0 and 1 swapped, offsets adjusted: a valid table, other contents."""
    b, o = t["turn_text.bytes"], t["turn_text.offsets"]
    a0, a1, a2 = int(o[0]), int(o[1]), int(o[2])
    t["turn_text.bytes"] = torch.cat([b[a1:a2], b[a0:a1], b[a2:]])
    t["turn_text.offsets"] = o.clone()
    t["turn_text.offsets"][1] = a0 + (a2 - a1)
    return t


def _overwrite(folder: Path, ref: list, data: bytes) -> None:
    """Write ``data`` over the blob ``ref`` names, in place (its checksum kept)."""
    assert len(data) == ref[2]
    with open(folder / "data" / f"{ref[0]:08d}.pack", "r+b") as f:
        f.seek(ref[1])
        f.write(data)


def test_contents_changed_after_writing_are_refused(tmp_path, small):
    """Item 20: reordered turn texts or embedding rows loaded and answered silently;
    an edited conversation too.  The checksum each blob was written with catches each
    (format 4 and a version-2 folder's tensor checksums alike)."""
    idx, path = small
    for what in ("turn_texts", "gran_rows", "segment"):
        dst = _copy(path, tmp_path / what)
        if what == "segment":
            ref = f4.path_of(dst, "conv-30")["segment"]
            t, m = f4.blob_tensors(dst, ref)
            m["session_dates"].reverse()
            name = "conversation 'conv-30'"
        else:
            ref = f4.root(dst)["chunks"][0]["ref"]
            t, m = f4.blob_tensors(dst, ref)
            if what == "turn_texts":
                _swap_turn_texts(t)
            else:
                t["gran"] = t["gran"][[1, 0, *range(2, t["gran"].shape[0])]].contiguous()
            name = "store chunk 0"
        _overwrite(dst, ref, f4.tensor_blob(t, m))
        pack = dst / "data" / f"{ref[0]:08d}.pack"
        _refused(dst, f"{pack}: offset {ref[1]}: {name} differs from the CRC-32 checksum "
                      "its commit recorded")
        if what == "turn_texts":
            line = one_line_error(run_cli("eval", dst, "--method", "session", "--device",
                                          "cpu"))
            assert "CRC-32" in line and str(pack) in line
    from _hostile import version_dir

    v2 = write_v2(idx, tmp_path / "v2")
    tf = version_dir(v2) / "tensors.safetensors"
    from safetensors.torch import load_file, save_file

    save_file(_swap_turn_texts(load_file(str(tf))), str(tf))
    with pytest.raises(IndexFormatError, match="tensor 'turn_text.bytes': its contents "
                                               "differ from the CRC-32"):
        load_index(v2)


def test_a_tampered_version_2_folder_is_refused_by_the_same_checks(tmp_path, small):
    """An older folder's parts go through the same validation: a version-2 folder whose
    manifest and tensors were edited with their checksums recomputed is refused naming
    its file and the field or tensor; so is a pointer naming no version."""
    from _hostile import rewrite_index, version_dir
    from safetensors.torch import load_file

    idx, _ = small
    edits = {
        "row_slot_int8": (lambda t, m: t.update(row_slot=t["row_slot"].to(torch.int8)),
                          "tensor 'row_slot': missing, or not int64"),
        "slot_range": (lambda t, m: t["row_slot"].__setitem__(0, 10_000),
                       "tensor 'slots': values outside [0, 6)"),
        "text_not_utf8": (lambda t, m: t["turn_text.bytes"].__setitem__(0, 0xFF),
                          "tensor 'turn_text.bytes': not UTF-8"),
        "nan_gran": (lambda t, m: t["gran"].__setitem__((0, 0, 0), float("nan")),
                     "tensor 'gran': 1 embedding(s) hold NaN"),
        "m_huge": (lambda t, m: m["params"].update(m=10**30), "field 'params.m': "
                   "1000000000000000000000000000000 is outside"),
        "dup_session": (lambda t, m: m["conversations"][0]["session_ids"].__setitem__(
            1, m["conversations"][0]["session_ids"][0]), "session id 'session_1' appears "
            "twice"),
        "surrogate": (lambda t, m: m["questions"][0].update(answer="x\udfff"),
                      "field 'questions[0].answer': a lone UTF-16 surrogate"),
    }
    for what, (edit, want) in edits.items():
        v2 = write_v2(idx, tmp_path / what)
        m = json.loads((version_dir(v2) / "manifest.json").read_text())
        t = load_file(str(version_dir(v2) / "tensors.safetensors"))
        edit(t, m)
        rewrite_index(v2, m, t)
        with pytest.raises(IndexFormatError) as e:
            load_index(v2)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(str(v2)) and want in msg, (what, msg)
    v2 = write_v2(idx, tmp_path / "pointer")
    top = json.loads((v2 / "manifest.json").read_text())
    for current, want in (("../a", "expected 'v-'"), (5, "expected 'v-'"),
                          ("v-" + "0" * 32, "incomplete")):
        (v2 / "manifest.json").write_text(json.dumps(dict(top, current=current)))
        with pytest.raises(IndexFormatError, match=want):
            load_index(v2)


def test_the_manifest_never_brings_a_regex_that_runs(tmp_path, small):
    """Item 22: '(\\w+\\s?)+$' in the manifest hung every query past 60 s.  Only a
    registered pattern is used; a custom one reopens once registered by name."""
    from memgas_gpu.lexical import Tokenizer

    _, path = small
    dst = _copy(path, tmp_path / "idx")
    custom = r"(?u)\b\w+\b"  # words of one character too
    f4.edit_root(dst, lambda r: r["lexical"]["tokenizer"].update(token_pattern=custom))
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
    f4.edit_root(dst, lambda r: r["config"].update(encoder_source={"path": "/etc",
                                                                   "bundled": False}))
    line = one_line_error(run_cli("search", dst, "violin", "--conversation", "conv-30",
                                  "--device", "cpu"))
    assert "'/etc' is not a model folder" in line
