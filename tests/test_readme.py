"""The README's quick start and Python API run as written (parsed from README.md, so
the test breaks when the README drifts): on a tiny scale with a tiny random encoder by
default, exactly as written with the bundled encoder under ``-m slow``."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from memgas_gpu.cli.main import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, f"README.md has no '## {title}' section"
    return m.group(1)


def _blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def quick_start_commands() -> list[list[str]]:
    """Every ``memgas …`` line of the Quick start's bash blocks, as argv lists."""
    cmds = []
    for block in _blocks(_section("Quick start"), "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                assert words[0] == "memgas", line
                cmds.append(words[1:])
    return cmds


def test_readme_keeps_the_setup_commands_and_a_quick_start():
    setup = _blocks(_section("Set up and test"), "bash")[0].splitlines()
    assert setup == ['pip install -e ".[dev]"', "python -m pytest -q"]  # CI runs these
    cmds = quick_start_commands()
    assert [c[0] for c in cmds[:2]] == ["synth", "eval"]  # data first, then the table
    assert "## Online memory" in README.read_text(encoding="utf-8")


def _run_quick_start(workdir: Path, tiny_model=None):
    """Run the quick start in ``workdir``; returns each command's result."""
    results = []
    for argv in quick_start_commands():
        argv = list(argv)
        if tiny_model is not None:
            if argv[0] == "synth":
                argv += ["--questions", "3", "--sessions", "4", "--no-progress"]
            if argv[0] in ("index", "eval"):
                argv += ["--encoder", tiny_model, "--device", "cpu"]
        r = CliRunner().invoke(cli, argv)
        assert r.exit_code == 0, (argv, r.output)
        results.append((argv, r))
    return results


def _check(workdir: Path, results):
    from memgas_gpu.retrieve import METHODS

    data = json.loads((workdir / "demo.json").read_text())
    n = len(data)  # questions in the file, counted from the raw JSON
    outputs = {argv[0] + " " + argv[1]: r.stdout for argv, r in results}
    first_eval = outputs["eval demo.json"]
    assert f"== memgas ({n} questions)" in first_eval and f"== bm25 ({n} questions)" in first_eval
    assert "recall_all@5" in first_eval and "ndcg_any@10" in first_eval
    for method in ("memgas", "bm25"):
        log = workdir / f"demo.results.{method}.jsonl"
        recs = [json.loads(x) for x in log.read_text().splitlines()]
        assert sorted(r["question_id"] for r in recs) == sorted(d["question_id"] for d in data)
    assert set(json.loads((workdir / "demo.results.metrics.json").read_text())["methods"]) \
        == {"memgas", "bm25"}
    if "eval demo.idx" in outputs:
        assert (workdir / "demo.idx" / "manifest.json").exists()
        assert len(re.findall(r"^== ", outputs["eval demo.idx"], re.M)) == len(METHODS)


def test_quick_start_runs_as_written_on_a_tiny_scale(tmp_path, monkeypatch, tiny_model):
    monkeypatch.chdir(tmp_path)
    _check(tmp_path, _run_quick_start(tmp_path, tiny_model))


def test_python_api_block_runs(tmp_path, monkeypatch, tiny_model, capsys):
    import memgas_gpu.encode as enc_mod

    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(cli, ["synth", "--out", "demo.json", "--questions", "3",
                                    "--sessions", "4", "--no-progress"]).exit_code == 0
    real = enc_mod.Encoder
    monkeypatch.setattr(enc_mod, "Encoder", lambda *a, **k: real(tiny_model, device="cpu"))
    code = _blocks(_section("Python API"), "python")[0]
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "torch.Size([3, " in out and "recall_all@" in out
    assert (tmp_path / "demo.idx" / "manifest.json").exists()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from memgas_gpu.encode.tiny import make_random_bert

    return make_random_bert(str(tmp_path_factory.mktemp("bert")))


@pytest.mark.slow
def test_quick_start_exactly_as_written(tmp_path, monkeypatch):
    """The bundled MiniLM at the README's own scale."""
    monkeypatch.chdir(tmp_path)
    _check(tmp_path, _run_quick_start(tmp_path))
