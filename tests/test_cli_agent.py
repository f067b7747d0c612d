"""The command line as a user meets it: one default method, settings lines that show
what changed, `memgas stats` listing conversation ids (datasets and index folders),
`--out` naming, `--store-dtype`, `--quiet` everywhere, and one-line errors (exit 2)
checked before any work: bad devices and backends, unwritable outputs, a file-size
limit, query bytes that are not UTF-8, a closed stderr."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from memgas_gpu.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]


def one_line(r) -> str:
    """Exit 2, exactly one non-empty stderr line, no traceback; the line."""
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code == 2, (r.exit_code, r.output[-2000:], r.exception)
    assert "Traceback" not in r.output and len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A synthetic dataset, a tiny random encoder and an index of the two."""
    from memgas_gpu.encode.tiny import make_random_bert
    from memgas_gpu.synth import write_synthetic

    d = tmp_path_factory.mktemp("cli")
    write_synthetic(d / "d.json", questions=3, sessions=5, turns=4, words=10, progress=False)
    model = make_random_bert(str(d / "bert"))
    r = CliRunner().invoke(cli, ["index", str(d / "d.json"), "--out", str(d / "idx"),
                                 "--encoder", model, "--device", "cpu", "-q"])
    assert r.exit_code == 0, r.output
    return d / "d.json", model, d / "idx"


@pytest.fixture
def no_work(monkeypatch):
    """Any loading of data or an index fails the test: checks come first."""
    import memgas_gpu.data as data
    from memgas_gpu.retrieve import MemoryIndex

    def boom(*a, **k):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(data, "load_dataset", boom)
    monkeypatch.setattr(MemoryIndex, "load", classmethod(boom))


def test_cli_constants_match_the_library():
    from memgas_gpu.bench import suite
    from memgas_gpu.cli import bench
    from memgas_gpu.retrieve import DEFAULT_METHOD

    # the method each command runs when none is named is the library's
    for name in ("search", "sweep", "eval"):
        method = next(p for p in cli.commands[name].params if "--method" in p.opts)
        default = method.default[0] if method.multiple else method.default
        assert default == DEFAULT_METHOD == "memgas_hybrid", name
    assert bench.SCALES == tuple(suite.SCALES) and bench.STAGES == suite.STAGES


def test_every_command_has_quiet():
    for name, cmd in cli.commands.items():
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert {"--quiet", "-q"} <= opts, name


# ------------------------------------------------------------------ stats
def test_stats_lists_conversation_ids_of_a_dataset_and_an_index(tiny):
    data, _, idx = tiny
    raw = json.loads(data.read_text())
    ids = [r["question_id"] for r in raw]  # LongMemEval: one conversation per question
    sessions = [len(r["haystack_session_ids"]) for r in raw]
    for path in (data, idx):
        r = CliRunner().invoke(cli, ["stats", str(path), "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["conversation_ids"] == ids and doc["conversations"] == len(ids)
        assert [c["sessions"] for c in doc["by_conversation"]] == sessions
        assert [c["questions"] for c in doc["by_conversation"]] == [1] * len(ids)
        text = CliRunner().invoke(cli, ["stats", str(path)])
        assert text.exit_code == 0, text.output
        rows = {x.split()[0]: x.split()[1:] for x in text.stdout.splitlines() if x.strip()}
        assert all(rows[i] == [str(n), "1"] for i, n in zip(ids, sessions))
    assert json.loads(CliRunner().invoke(cli, ["stats", str(idx), "--json"]).stdout)[
        "kind"] == "index"


# ------------------------------------------------------------------ eval and search
def _eval(idx, *args):
    r = CliRunner().invoke(cli, ["eval", str(idx), "--device", "cpu", *args])
    assert r.exit_code == 0, r.output
    return r


def _settings_lines(out: str) -> dict:
    lines = out.splitlines()
    return {lines[i][3:].split(" (")[0]: lines[i + 1].strip() for i, x in enumerate(lines)
            if x.startswith("== ")}


def test_eval_defaults_to_memgas_hybrid_and_says_what_differs(tiny):
    _, _, idx = tiny
    default = _settings_lines(_eval(idx).stdout)
    assert list(default) == ["memgas_hybrid"]
    line = default["memgas_hybrid"]
    # memgas_hybrid's preset against the paper's ReadParams defaults (by hand)
    for s in ("norm=z", "temperature=1.0", "fusion=sum", "speaker_gamma=1.0", "time_beta=2.0"):
        assert s in line, line
    for s in ("router=", "alpha=", "damping=", "graph=", "k1="):  # as in the paper
        assert s not in line, line
    off = _settings_lines(_eval(idx, "--set", "time_beta=0").stdout)["memgas_hybrid"]
    assert off != line and "time_beta=" not in off.split(";")[0]
    assert "changed from the memgas_hybrid preset: time_beta 2.0 -> 0.0" in off
    paper = _settings_lines(_eval(idx, "--method", "memgas").stdout)["memgas"]
    assert paper == "settings: the paper's defaults"
    damped = _settings_lines(_eval(idx, "--method", "memgas", "--damping", "0.3").stdout)
    assert damped["memgas"] == ("settings: damping=0.3; changed from the memgas preset: "
                                "damping 0.1 -> 0.3")


def test_out_is_the_file_named_for_one_method_and_the_metrics_say_what_ran(tiny, tmp_path):
    _, model, idx = tiny
    one = tmp_path / "one.jsonl"
    _eval(idx, "--out", str(one))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.jsonl", "one.metrics.json"]
    several = tmp_path / "sev" / "r.jsonl"
    several.parent.mkdir()  # --out's folder must exist (it is not made)
    _eval(idx, "--method", "memgas", "--method", "bm25", "--out", str(several))
    assert sorted(p.name for p in several.parent.iterdir()) == [
        "r.bm25.jsonl", "r.memgas.jsonl", "r.metrics.json"]
    for path in (tmp_path / "one.metrics.json", several.parent / "r.metrics.json"):
        m = json.loads(path.read_text())
        assert m["memgas_gpu"] == version("memgas_gpu")
        assert m["encoder"]["model"] == os.path.normpath(model)


def test_search_uses_the_default_method_and_survives_bytes_that_are_not_utf8(tiny):
    _, _, idx = tiny
    conv = json.loads((tiny[0]).read_text())[0]["question_id"]
    args = ["search", str(idx), "--conversation", conv, "--json", "--k", "3", "--device", "cpu"]
    bad = CliRunner().invoke(cli, args + ["violin \udcff"])  # what Python makes of b"\xff"
    assert bad.exit_code == 0, bad.output
    rec = json.loads(bad.stdout)
    assert rec["query"] == "violin \ufffd" and "not valid UTF-8" in bad.stderr
    same = CliRunner().invoke(cli, args + ["--method", "memgas_hybrid", "violin \ufffd"])
    assert json.loads(same.stdout) == rec  # the default method, the replaced text


def test_gam_prints_percentages_and_records_the_encoder(tiny, tmp_path):
    data, model, _ = tiny
    out = tmp_path / "gam.json"
    r = CliRunner().invoke(cli, ["gam", str(data), "--encoder", model, "--device", "cpu",
                                 "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["memgas_gpu"] == version("memgas_gpu")
    assert doc["encoder"]["model"] == os.path.normpath(model)
    line = next(x for x in r.stdout.splitlines() if x.startswith("gam "))
    shown = dict(kv.split("=") for kv in line.split() if "@" in kv)
    assert shown
    for k, v in shown.items():
        assert float(v) == pytest.approx(100 * doc["results"]["gam"]["metrics"]["turn"][k],
                                         abs=0.006)


# ------------------------------------------------------------------ store dtype
def test_store_keeps_float32_unless_asked(tiny, tmp_path):
    from memgas_gpu.retrieve import MemoryIndex

    data, model, plain = tiny
    base = ["index", str(data), "--encoder", model, "--device", "cpu", "-q"]
    for name, extra in (("s32", []), ("s16", ["--store-dtype", "float16"])):
        r = CliRunner().invoke(cli, base + ["--out", str(tmp_path / f"{name}.idx"),
                                            "--store", str(tmp_path / name)] + extra)
        assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "s32" / "manifest.json").read_text())["dtype"] == "float32"
    assert json.loads((tmp_path / "s16" / "manifest.json").read_text())["dtype"] == "float16"
    plain_idx, s32 = MemoryIndex.load(plain), MemoryIndex.load(tmp_path / "s32.idx")
    ref = plain_idx.snapshot().node_embeddings()
    # float32 rows: a build without a store, up to the summation order of other batches
    torch.testing.assert_close(s32.snapshot().node_embeddings(), ref, atol=1e-6, rtol=0)
    assert all(torch.equal(x, y) for x, y in zip(s32.snapshot().graph(), plain_idx.snapshot().graph()))
    half = MemoryIndex.load(tmp_path / "s16.idx").snapshot().node_embeddings()
    direct = torch.arange(half.shape[0]) % 4 != 1  # node 4·row + g: S, U, K (T is a mean)
    assert torch.equal(half[direct], ref[direct].half().float())  # float16's rounding only
    assert not torch.equal(half, ref)
    torch.testing.assert_close(half, ref, atol=2e-3, rtol=0)


# ------------------------------------------------------------------ refused before any work
@pytest.mark.parametrize("command", ["search", "eval", "index"])
@pytest.mark.parametrize("device", ["bogus", "cuda:99", "cuda"])
def test_bad_device_is_one_line_before_any_work(tiny, tmp_path, no_work, command, device):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    data, _, idx = tiny
    argv = {"search": ["search", str(idx), "--conversation", "x", "q"],
            "eval": ["eval", str(idx)],
            "index": ["index", str(data), "--out", str(tmp_path / "o")]}[command]
    line = one_line(CliRunner().invoke(cli, argv + ["--device", device]))
    assert "--device" in line and repr(device) in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["bogus", "native "])
def test_bad_backend_is_one_line_before_any_work(tiny, tmp_path, monkeypatch, no_work, value):
    from memgas_gpu._native import native_available

    if value.strip() == "native" and native_available("cpu"):
        value = "bogus2"  # native is a fine choice where the kernels are built
    data, _, idx = tiny
    monkeypatch.setenv("MEMGAS_BACKEND", value)
    for argv in (["index", str(data), "--out", str(tmp_path / "o")], ["eval", str(idx)],
                 ["search", str(idx), "--conversation", "x", "q"]):
        assert "MEMGAS_BACKEND" in one_line(CliRunner().invoke(cli, argv))


def test_unwritable_outputs_are_refused_before_any_work(tiny, tmp_path, no_work):
    data, _, idx = tiny
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_text("x")
    cases = [
        ["index", str(data), "--out", str(a_file / "idx")],        # under a file
        ["index", str(data), "--out", str(foreign)],               # not an index: kept
        ["eval", str(idx), "--out", str(tmp_path)],                # a folder for a file
        ["eval", str(idx), "--out", str(a_file / "r.jsonl")],
        ["eval", str(data), "--save-index", str(foreign)],
        ["sweep", str(idx), "--grid", "alpha=15", "--out", str(a_file / "s")],
        ["gam", str(data), "--out", str(a_file / "g.json")],
        ["synth", "--out", str(a_file / "d.json")],
        ["bench", "--out", str(a_file / "b"), "--scale", "tiny"],
        ["qa-eval", str(data), str(data), "--out", str(a_file / "q.json")],
    ]
    if sys.platform.startswith("linux"):  # /proc takes no new files, whoever asks (root too)
        cases.append(["index", str(data), "--out", "/proc/memgas-test/idx"])
    for argv in cases:
        line = one_line(CliRunner().invoke(cli, argv))
        assert "--out" in line or "--save-index" in line, (argv, line)
    assert sorted(p.name for p in foreign.iterdir()) == ["cat.jpg"]


# ------------------------------------------------------------------ other processes
def _run(args, env=None, preexec_fn=None, **kw):
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "memgas_gpu.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=e,
                          preexec_fn=preexec_fn, **kw)


def test_file_size_limit_while_saving_is_one_line(tiny, tmp_path):
    data, model, _ = tiny

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    r = _run(["index", data, "--out", tmp_path / "idx", "--encoder", model, "--device",
              "cpu", "-q"], preexec_fn=limit)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "large" in lines[0].lower()  # EFBIG: "File too large"
    assert not (tmp_path / "idx" / "manifest.json").exists()


def test_progress_never_reaches_stdout_even_with_stderr_closed(tiny):
    data, _, _ = tiny
    r = _run(["stats", data, "--json"], env={"MEMGAS_PROGRESS_INTERVAL": "0"},
             preexec_fn=lambda: os.close(2))
    assert r.returncode == 0
    assert json.loads(r.stdout)["conversations"] == 3  # nothing else on stdout


def test_synth_reports_plain_lines_in_a_log_and_quiet_silences_them(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMGAS_PROGRESS_INTERVAL", "0")
    args = ["synth", "--questions", "3", "--sessions", "4", "--out"]
    r = CliRunner().invoke(cli, args + [str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x]
    assert lines and all(x.startswith("synth: ") for x in lines) and "\r" not in r.stderr
    assert "done in" in lines[-1]
    q = CliRunner().invoke(cli, args + [str(tmp_path / "b.json"), "--quiet"])
    assert q.exit_code == 0 and q.stderr == "" and "wrote" in q.stdout
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


@pytest.mark.parametrize("argv", [["prepare", "missing.json", "OUT"],
                                  ["prepare", "BAD", "OUT"],
                                  ["standin", "AFILE/out"]])
def test_testing_commands_fail_in_one_line(tmp_path, capsys, argv):
    from memgas_gpu.testing.__main__ import main

    (tmp_path / "f").write_text("x")
    (tmp_path / "bad.json").write_text("{\"not\": \"a list\"}")
    subst = {"OUT": str(tmp_path / "out"), "BAD": str(tmp_path / "bad.json"),
             "AFILE/out": str(tmp_path / "f" / "out"),
             "missing.json": str(tmp_path / "missing.json")}
    assert main([subst.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_the_bundled_encoder_is_recorded_by_its_hub_id(tiny):
    from memgas_gpu.encode import Encoder

    enc = Encoder(device="cpu")
    assert enc.name == enc.describe()["model"] == \
        "sentence-transformers/all-MiniLM-L6-v2 (bundled)"
    assert Encoder(tiny[1], device="cpu").name == os.path.normpath(tiny[1])
