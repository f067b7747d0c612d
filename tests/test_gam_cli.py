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


def test_methods_match_the_library():
    from memgas_gpu.cli import gam as cli_gam
    from memgas_gpu.gam import METHODS, SEGMENTATIONS

    assert cli_gam.METHODS == METHODS
    assert cli_gam.SEGMENTATIONS == SEGMENTATIONS


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
