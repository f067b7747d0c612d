"""``memgas gam``: methods and segmentations from the command line."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memgas_gpu.cli.main import cli


def _data(tmp_path):
    turns = [("A", "I adopted a puppy named Rex"), ("B", "Rex is a lovely name"),
             ("A", "We went camping by the lake"), ("B", "The lake was cold"),
             ("A", "I started painting sunsets"), ("B", "Sunsets are hard to paint")]
    conv = {"speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1 May 2023",
            "session_1": [{"speaker": s, "dia_id": f"D1:{i + 1}", "text": t}
                          for i, (s, t) in enumerate(turns[:4])],
            "session_2_date_time": "9 May 2023",
            "session_2": [{"speaker": s, "dia_id": f"D2:{i + 1}", "text": t}
                          for i, (s, t) in enumerate(turns[4:])]}
    qa = [{"question": "What is the puppy called?", "answer": "Rex", "evidence": ["D1:1"],
           "category": 4},
          {"question": "What does A paint?", "answer": "sunsets", "evidence": ["D2:1"],
           "category": 4}]
    p = tmp_path / "tiny_locomo.json"
    p.write_text(json.dumps([{"sample_id": "t1", "conversation": conv, "qa": qa}]))
    return p


def test_one_list_of_gam_methods():
    """GAM's method names live in gam/presets.py: the commands take their choices from it,
    every name is a preset, and the docs that list them list exactly these."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from memgas_gpu.cli.eval import eval_cmd
    from memgas_gpu.cli.gam import gam
    from memgas_gpu.gam import FLAT_METHODS, GAM_METHODS, METHODS, preset

    assert GAM_METHODS == ("gam", "gam_no_tan", "gam_no_epg", "gam_no_ssm", "gam_no_mfr")
    assert METHODS == GAM_METHODS + FLAT_METHODS

    def choices(cmd, name):
        return next(p for p in cmd.params if p.name == name).type.choices

    assert tuple(choices(gam, "methods")) == METHODS + ("all",)
    assert set(GAM_METHODS) <= set(choices(eval_cmd, "methods"))
    assert not set(FLAT_METHODS) & set(choices(eval_cmd, "methods"))
    params = {m: preset(m) for m in METHODS}
    assert len({repr(params[m]) for m in GAM_METHODS}) == len(GAM_METHODS)  # all differ
    assert all(params[m] == params["gam"] for m in FLAT_METHODS)
    with pytest.raises(ValueError, match="unknown GAM method"):
        preset("gam_no_everything")
    root = Path(__file__).resolve().parents[1]
    for doc in ("README.md", "docs/gam.md"):
        rows = [ln for ln in (root / doc).read_text().splitlines()
                if ln.startswith("|") and "`gam_no_tan`" in ln]
        assert len(rows) == 1, doc
        assert tuple(re.findall(r"`(gam[a-z_]*)`", rows[0])) == GAM_METHODS, doc
    # the command line imports the names without GAM's tensor code
    code = ("import sys, memgas_gpu.cli.gam, memgas_gpu.cli.eval; "
            "print(sorted(m for m in sys.modules if m.startswith('memgas_gpu.gam.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['memgas_gpu.gam.params', 'memgas_gpu.gam.presets']"


@pytest.mark.parametrize("opt", ["--theta", "--noise"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_non_finite_or_negative_settings_are_refused(tmp_path, opt, value):
    res = CliRunner().invoke(cli, ["gam", str(_data(tmp_path)), opt, value])
    assert res.exit_code == 2, res.output
    assert opt in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_gam_command(tmp_path):
    from memgas_gpu.encode.tiny import make_random_bert

    model = make_random_bert(str(tmp_path / "tiny"))
    out = tmp_path / "m.json"
    res = CliRunner().invoke(cli, ["gam", str(_data(tmp_path)), "--method", "gam",
                                   "--method", "flat_bm25", "--segmentation", "turns3",
                                   "--encoder", model, "--device", "cpu", "--out", str(out)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    got = json.loads(out.read_text())
    assert set(got["results"]) == {"gam", "flat_bm25"}
    assert got["results"]["gam"]["topics"] == 2 + 1  # turns3: 2 topics in session 1 (3 + 1), 1 in 2
    # BM25 finds both evidence utterances at rank 1 (rare shared words)
    assert got["results"]["flat_bm25"]["metrics"]["turn"]["recall_all@5"] == 1.0


def test_bad_segmentation_is_a_usage_error(tmp_path):
    bad = CliRunner().invoke(cli, ["gam", str(_data(tmp_path)), "--segmentation", "windows"])
    assert bad.exit_code == 2 and "unknown segmentation" in bad.output
