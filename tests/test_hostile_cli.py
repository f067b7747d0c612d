"""Odd option values and huge texts (issue 17, items 3 and 5): NaN and inf are refused
before anything runs, JSON outputs are strict JSON, one huge message costs one window."""
from __future__ import annotations

import json
import math

import click
import pytest
from click.testing import CliRunner

from memgas_gpu.bench.timing import PeakMemory
from memgas_gpu.cli._common import FiniteFloat
from memgas_gpu.cli.main import cli
from memgas_gpu.cli.sweep import parse_grid


@pytest.mark.parametrize("value, kind, ok", [
    ("0.5", FiniteFloat(0, 1), True), ("0", FiniteFloat(0, 1), True),
    ("1", FiniteFloat(0, 1), True), ("nan", FiniteFloat(0, 1), False),
    ("NaN", FiniteFloat(), False), ("inf", FiniteFloat(), False),
    ("-inf", FiniteFloat(), False), ("1e999", FiniteFloat(), False),
    ("1.01", FiniteFloat(0, 1), False), ("-0.1", FiniteFloat(0, 1), False),
    ("0", FiniteFloat(0, min_open=True), False), ("1e-9", FiniteFloat(0, min_open=True), True),
    ("x", FiniteFloat(), False), ("1", FiniteFloat(0, 1, max_open=True), False),
])
def test_finite_float_against_math_isfinite_and_the_range(value, kind, ok):
    try:
        got = kind.convert(value, None, None)
    except click.BadParameter:
        assert not ok
    else:
        assert ok and math.isfinite(got) and got == float(value)


@pytest.mark.parametrize("args", [
    ["eval", "IDX", "--damping", "nan"], ["eval", "IDX", "--damping", "1.5"],
    ["eval", "IDX", "--temperature", "nan"], ["eval", "IDX", "--temperature", "0"],
    ["eval", "IDX", "--temperature", "-inf"], ["eval", "IDX", "--gpus-per-worker", "nan"],
    ["eval", "IDX", "--max-length", "0"], ["index", "DATA", "--out", "X", "--gpus-per-worker",
                                           "inf"],
    ["sweep", "IDX", "--grid", "b=0.75,nan"], ["sweep", "IDX", "--grid", "damping=inf"],
    ["sweep", "IDX", "--grid", "temperature=0"], ["sweep", "IDX", "--grid", "k1=-1"],
    ["synth", "--out", "X", "--abstention-rate", "nan"],
    ["bench", "--out", "X", "--budget", "inf"],
    ["expand", "DATA", "--out", "X", "--llm-model", "m", "--timeout", "nan"],
    ["expand", "DATA", "--out", "X", "--llm-model", "m", "--max-response-mb", "nan"],
])
def test_non_finite_and_out_of_range_options_exit_2_before_any_work(tmp_path, args):
    data = tmp_path / "d.json"
    data.write_text("[]")
    (tmp_path / "idx").mkdir()
    subst = {"IDX": str(tmp_path / "idx"), "DATA": str(data), "X": str(tmp_path / "out")}
    res = CliRunner().invoke(cli, [subst.get(a, a) for a in args])
    assert res.exit_code == 2, res.output
    assert "Invalid value" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


def test_grid_values_are_checked_per_key():
    assert parse_grid(["b=0,1", "k1=0.5", "damping=0,1", "alpha=1"]) == {
        "b": [0.0, 1.0], "k1": [0.5], "damping": [0.0, 1.0], "alpha": [1]}
    for bad in ("b=1.5", "alpha=0", "damping=-0.1", "temperature=nan", "k1=inf"):
        with pytest.raises(click.BadParameter):
            parse_grid([bad])


def test_metrics_json_is_strict_json_with_null_for_no_value(tmp_path, locomo_list_path):
    from memgas_gpu._io import nan_to_null

    doc = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": 2}
    assert nan_to_null(doc) == {"a": None, "b": [1.0, None, {"c": None}], "d": 2}
    json.dumps(nan_to_null(doc), allow_nan=False)


def test_one_huge_message_costs_one_window(tmp_path):
    from memgas_gpu.encode import Encoder
    from memgas_gpu.encode.tiny import make_random_bert

    enc = Encoder(make_random_bert(str(tmp_path / "bert")), device="cpu", max_length=32)
    words = ("alpha beta gamma delta " * 4_000_000)  # 96 MB of text
    with PeakMemory() as peak:
        tok = enc.tokenize([words, "short text"])
    assert peak.host < 64 << 20  # tokenising it whole took ~10 GB
    # the same window as tokenising the whole text and cutting at max_length (reference)
    ref = enc.tokenizer(words[:100_000], truncation=True, max_length=32)["input_ids"]
    assert tok.windows[0] == [ref] and len(tok.windows[1]) == 1
    # mostly whitespace: the cut grows until it holds max_length tokens
    sparse = "a" + " " * 20_000 + " b" * 40
    ref = enc.tokenizer(sparse, truncation=True, max_length=32)["input_ids"]
    assert enc.tokenize([sparse]).windows[0] == [ref]
