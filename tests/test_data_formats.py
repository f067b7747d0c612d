"""The dataset-format registry: a format defined in one file (here, this test) is
detected, loaded and named like the built-in ones."""
from __future__ import annotations

import json

import pytest

from memgas_gpu import DataFormatError, load_dataset
from memgas_gpu.data import FORMATS, detect_format
from memgas_gpu.data.formats import (DatasetFormat, dataset_format, format_names, json_records,
                                     register_format)
from memgas_gpu.data.model import Conversation, Question, Session, pair_messages

NAME = "test_dialogs"


def _parse(ctx, rec, path, opts):
    """``{"dialog_id", "turns": [[speaker, text], ...], "ask": question}``: one session."""
    if not isinstance(rec, dict):
        raise ctx.error(f"expected an object, got {type(rec).__name__}")
    cid = ctx.get(rec, "dialog_id", str)
    msgs = [f"[{who}]: {text}" for who, text in ctx.get(rec, "turns", list)]
    return Conversation(cid, [Session(f"{cid}_s0", "", pair_messages(msgs))],
                        [Question(f"{cid}_q0", ctx.get(rec, "ask", str))])


if NAME not in format_names():
    register_format(DatasetFormat(NAME, json_records(_parse), keys=("dialog_id",)))


def test_a_format_in_one_file_is_detected_and_loaded(tmp_path):
    recs = [{"dialog_id": "d1", "turns": [["ann", "hi"], ["bob", "hello"]], "ask": "who?"},
            {"dialog_id": "d2", "turns": [["ann", "bye"], ["bob", "see you"]], "ask": "when?"}]
    p = tmp_path / "dialogs.json"
    p.write_text(json.dumps(recs))
    assert detect_format(p) == NAME
    for fmt in ("auto", NAME):
        ds = load_dataset(p, format=fmt)
        assert ds.format == NAME and [c.id for c in ds] == ["d1", "d2"]
        assert ds[0].sessions[0].turns == ("[ann]: hi\n[bob]: hello",)
        assert ds[1].questions[0].text == "when?"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"dialog_id": 3, "turns": [], "ask": "x"}]))
    with pytest.raises(DataFormatError, match=r"bad.json.*dialog_id"):
        load_dataset(bad)


def test_the_registry_refuses_clashes_and_unknown_names():
    assert FORMATS == ("longmemeval", "locomo", "locomo_flat", "longmtbench")
    assert dataset_format("locomo").as_object == "locomo_flat"
    assert dataset_format("locomo_flat").family == "locomo"
    with pytest.raises(ValueError, match="taken"):
        register_format(DatasetFormat("locomo", json_records(_parse)))
    with pytest.raises(ValueError, match="already identify 'locomo'"):
        register_format(DatasetFormat("other", json_records(_parse), keys=("sample_id",)))
    with pytest.raises(DataFormatError, match="unknown format 'csv'.*supported: auto, "
                                              "longmemeval"):
        dataset_format("csv", "f.csv")


def test_a_locomo_record_as_one_object_is_the_flat_layout(locomo_list_path, tmp_path):
    """A file holding one LoCoMo record as an object (first key ``sample_id``, a key of
    the list layout) is read as the flat layout, as LoCoMo's per-conversation files."""
    rec = json.loads(locomo_list_path.read_text())[0]
    one = {"sample_id": rec["sample_id"], **rec["conversation"], "qa": rec["qa"]}
    p = tmp_path / "one.json"
    p.write_text(json.dumps(one))
    assert detect_format(p) == "locomo_flat"
    ds = load_dataset(p)
    assert ds.format == "locomo" and [c.id for c in ds] == [rec["sample_id"]]
