"""memgas_gpu.testing: where real data is found, the stand-ins, and `prepare`."""
from __future__ import annotations

import json

import pytest

from memgas_gpu import load_dataset
from memgas_gpu.testing import (data_dir, how_to_get_real_data, locomo_like_records,
                                paths, real_data_path, write_dev_layout)
from memgas_gpu.testing.__main__ import main as prepare_cli


def test_data_dir_from_env_then_default(tmp_path, monkeypatch):
    write_dev_layout(locomo_like_records(), tmp_path / "d")
    monkeypatch.setenv("MEMGAS_DATA", str(tmp_path / "d"))
    assert data_dir() == tmp_path / "d"
    assert real_data_path("lme_sample") == tmp_path / "d" / "longmemeval_format_sample.json"
    assert real_data_path("locomo_flat") == tmp_path / "d" / "locomo" / "v2"
    monkeypatch.setenv("MEMGAS_DATA", str(tmp_path / "missing"))
    assert data_dir() is None and real_data_path("locomo_list") is None
    msg = how_to_get_real_data("locomo_list")
    assert f"MEMGAS_DATA={tmp_path / 'missing'}" in msg and "locomo/locomo_dev.json" in msg
    assert "locomo10.json" in msg and "snap-research/LoCoMo" in msg
    monkeypatch.delenv("MEMGAS_DATA")
    monkeypatch.setattr(paths, "default_data_dir", lambda: tmp_path / "d")
    assert data_dir() == tmp_path / "d"
    with pytest.raises(SystemExit, match="not found"):
        monkeypatch.setattr(paths, "default_data_dir", lambda: tmp_path / "none")
        paths.require_real_data("locomo_list")


def test_standin_shapes_and_planted_evidence(tmp_path):
    recs = locomo_like_records()
    assert locomo_like_records() == recs  # deterministic
    out = write_dev_layout(recs, tmp_path)
    ds = load_dataset(out / "locomo" / "locomo_dev.json")
    assert [c.id for c in ds] == ["conv-26", "conv-30", "conv-41"]
    c30 = ds.get("conv-30")
    assert (len(c30.sessions), len(c30.questions)) == (19, 105)
    flat = load_dataset(out / "locomo" / "v2")
    assert [[s.turns for s in c.sessions] for c in flat] == \
        [[s.turns for s in c.sessions] for c in ds]
    lme = load_dataset(out / "longmemeval_format_sample.json")
    assert len(lme) == 40 and len(lme.distinct_sessions()) == 19
    # single-hop questions: the answer is said in the evidence turn (read from raw JSON)
    n = 0
    for rec in recs:
        turns = {t["dia_id"]: t["text"] for k, v in rec["conversation"].items()
                 if isinstance(v, list) for t in v}
        for q in rec["qa"]:
            if q["category"] == 4:
                assert q["answer"] in turns[q["evidence"][0]], q
                n += 1
    assert n > 50


def test_prepare_needs_the_dev_conversations(tmp_path, capsys):
    src = tmp_path / "other.json"
    src.write_text(json.dumps([{"sample_id": "conv-1"}]))
    assert prepare_cli(["prepare", str(src), str(tmp_path / "out")]) == 2
    assert "no conversation conv-26, conv-30, conv-41" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.real_data
def test_prepare_rebuilds_the_real_dev_layout(tmp_path, locomo_list_path, locomo_flat_dir,
                                              lme_sample_path):
    """From the LoCoMo records alone, `prepare` writes the very files the tests use."""
    assert prepare_cli(["prepare", str(locomo_list_path), str(tmp_path)]) == 0
    assert (tmp_path / "longmemeval_format_sample.json").read_bytes() == \
        lme_sample_path.read_bytes()
    for name in ("26", "30", "41"):
        got = json.loads((tmp_path / "locomo" / "v2" / f"{name}.json").read_text())
        assert got == json.loads((locomo_flat_dir / f"{name}.json").read_text())
    assert json.loads((tmp_path / "locomo" / "locomo_dev.json").read_text()) == \
        json.loads(locomo_list_path.read_text())
