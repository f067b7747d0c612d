"""docs/gam.md's Python example runs as written (parsed from the file), on the README's
synthetic demo data with a tiny random encoder."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from memgas_gpu.cli.main import cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "gam.md"


@pytest.fixture(scope="module")
def tiny_model(tiny_bert):
    return tiny_bert


def test_gam_example_runs_as_written(tmp_path, monkeypatch, tiny_model, capsys):
    import memgas_gpu.encode as enc_mod

    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(cli, ["synth", "--out", "demo.json", "--questions", "3",
                                    "--sessions", "4", "--no-progress"]).exit_code == 0
    real = enc_mod.Encoder
    monkeypatch.setattr(enc_mod, "Encoder", lambda *a, **k: real(tiny_model, device="cpu"))
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)[0]
    exec(compile(code, str(DOC), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "recall_all@10" in out[0] and "recall_all@10" in out[2]
    assert out[1] == "True"
