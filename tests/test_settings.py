"""One settings idiom: ReadParams, BuildParams, GraphParams and GamParams are frozen,
checked when made (SettingsError naming the field), copied with ``replace`` (unknown
names refused), recorded by describe() in the format eval outputs and index manifests
hold; the settings, the method presets and the command line's reading of them import
no torch; every error class is listed in memgas_gpu.errors."""
from __future__ import annotations

import ast
import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest

from memgas_gpu.errors import MemgasError
from memgas_gpu.gam.params import GamParams
from memgas_gpu.retrieve.params import BuildParams, GraphParams, ReadParams
from memgas_gpu.settings import SettingsError

ROOT = Path(__file__).resolve().parents[1]
CLASSES = (ReadParams, BuildParams, GraphParams, GamParams)
MAX = 1 << 20  # docs/index-format.md: m and topk from 1 to 2^20

# (class, field, a value it must refuse), one row per field and kind of mistake; the
# bounds are the documented ones (docstrings, docs/algorithm.md, docs/index-format.md)
BAD = [
    (ReadParams, "signals", ""), (ReadParams, "signals", ()), (ReadParams, "signals", 5),
    (ReadParams, "signals", ["dense_S", 3]), (ReadParams, "signals", "+"),
    (ReadParams, "norm", "l2"), (ReadParams, "norm", None),
    (ReadParams, "router", "softmax"), (ReadParams, "fusion", "max"),
    (ReadParams, "graph", "full"), (ReadParams, "bm25_method", "bm25+"),
    (ReadParams, "temperature", 0), (ReadParams, "temperature", -1.0),
    (ReadParams, "temperature", math.nan), (ReadParams, "temperature", "0.5"),
    (ReadParams, "temperature", True),
    (ReadParams, "damping", 1.5), (ReadParams, "damping", -0.1),
    (ReadParams, "damping", math.inf),
    (ReadParams, "alpha", 0), (ReadParams, "alpha", 2.5), (ReadParams, "alpha", True),
    (ReadParams, "alpha", MAX + 1), (ReadParams, "topk", 0), (ReadParams, "topk", MAX + 1),
    (ReadParams, "k1", -1.0), (ReadParams, "k1", 10 ** 400),
    (ReadParams, "b", 1.01), (ReadParams, "b", -0.01),
    (ReadParams, "speaker_gamma", -0.5), (ReadParams, "speaker_gamma", -math.inf),
    (ReadParams, "time_beta", math.nan),
    (ReadParams, "cues", {"recency": -1.0}), (ReadParams, "cues", {"": 1.0}),
    (ReadParams, "cues", "recency"), (ReadParams, "cues", {"recency": math.inf}),
    (BuildParams, "summaries", None), (BuildParams, "keywords", None),
    (BuildParams, "m", 0), (BuildParams, "m", MAX + 1), (BuildParams, "m", 2.5),
    (BuildParams, "skip_sessions", -1), (BuildParams, "skip_sessions", (1 << 31) + 1),
    (BuildParams, "concat", "yes"), (BuildParams, "lexical", 1),
    (BuildParams, "keep_turns", None), (BuildParams, "keep_text", 0),
    (GraphParams, "m", 0), (GraphParams, "skip_sessions", -1), (GraphParams, "rule", "knn"),
    (GraphParams, "topk", 0), (GraphParams, "topk", True),
    (GamParams, "segmentation", "windows"), (GamParams, "segmentation", "tokens0"),
    (GamParams, "window", 0), (GamParams, "theta", math.nan), (GamParams, "theta", -0.1),
    (GamParams, "theta", 2.5), (GamParams, "min_events", -1), (GamParams, "max_tokens", 0),
    (GamParams, "noise", 1.5), (GamParams, "noise_seed", -1), (GamParams, "epg_window", 0),
    (GamParams, "tan_m", 0), (GamParams, "tan_candidates", -1), (GamParams, "conf_min", -0.1),
    (GamParams, "min_earlier", 2.5), (GamParams, "alpha", math.inf), (GamParams, "anchors", 0),
    (GamParams, "gamma", math.nan), (GamParams, "eta", "0.6"), (GamParams, "beta_time", 0.0),
    (GamParams, "beta_role", -1.0), (GamParams, "beta_conf", 0), (GamParams, "tan", 1),
    (GamParams, "epg", "no"), (GamParams, "mfr", None),
]


@pytest.mark.parametrize("cls, field, value", BAD,
                         ids=[f"{c.__name__}.{f}={v!r}" for c, f, v in BAD])
def test_a_bad_value_is_refused_naming_the_field(cls, field, value):
    with pytest.raises(SettingsError) as made:
        cls(**{field: value})
    assert field in str(made.value).split(" ")[:3], str(made.value)
    with pytest.raises(SettingsError) as copied:  # replace checks like the constructor
        cls().replace(**{field: value})
    assert str(copied.value) == str(made.value)


def test_every_field_of_every_class_is_refused_somewhere_above():
    """The table covers each field (a new field gets its row)."""
    covered = {(c, f) for c, f, _ in BAD}
    for cls in CLASSES:
        for f in dataclasses.fields(cls):
            kind = cls.specs()[f.name].kind
            assert kind == "any" or (cls, f.name) in covered, f"{cls.__name__}.{f.name}"


def test_edge_values_are_accepted_and_numbers_normalised():
    p = ReadParams(temperature=1e-9, damping=1, alpha=MAX, topk=1, b=0, k1=0)
    assert (p.damping, p.b, p.alpha, p.topk) == (1.0, 0.0, MAX, 1)
    assert type(p.damping) is float and type(p.k1) is float  # describe() writes 1.0, 0.0
    assert ReadParams(damping=0).damping == 0.0
    q = ReadParams(alpha=np.int64(7), temperature=np.float32(0.5))
    assert type(q.alpha) is int and q.alpha == 7 and type(q.temperature) is float
    assert BuildParams(m=1, skip_sessions=0).m == 1
    g = GamParams(theta=0, noise=1, anchors=1, beta_time=1e-6, window=np.int32(2))
    assert (g.theta, g.noise, g.anchors, g.window) == (0.0, 1.0, 1, 2)
    assert GamParams(theta=2.0).theta == 2.0
    assert GraphParams(rule="topk", topk=MAX).key() == f"topk{MAX}"


@pytest.mark.parametrize("cls", CLASSES)
def test_replace_refuses_unknown_names_listing_the_known_ones(cls):
    p = cls()
    with pytest.raises(SettingsError, match=r"unknown setting\(s\) \['bogus', 'zeta'\]") as e:
        p.replace(bogus=1, zeta=2)
    names = [f.name for f in dataclasses.fields(cls)]
    assert str(e.value).endswith("settings are " + ", ".join(sorted(names)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(p, names[0], getattr(p, names[0]))
    field = {ReadParams: "alpha", BuildParams: "m", GraphParams: "topk",
             GamParams: "anchors"}[cls]
    q = p.replace(**{field: 3})
    assert getattr(q, field) == 3 and getattr(p, field) != 3 and type(q) is cls


def test_one_error_class_for_every_setting():
    import memgas_gpu.retrieve as retrieve
    from memgas_gpu.retrieve import engine

    assert retrieve.SettingsError is engine.SettingsError is SettingsError
    assert issubclass(SettingsError, MemgasError) and issubclass(SettingsError, ValueError)
    from memgas_gpu.gam.params import parse_segmentation

    with pytest.raises(SettingsError, match="unknown segmentation"):
        parse_segmentation("tokens")


@pytest.mark.parametrize("given, kept", [
    ("dense_S+bm25_S", ("dense_S", "bm25_S")), ("dense_S++bm25_S+", ("dense_S", "bm25_S")),
    (["dense_T"], ("dense_T",)), (("bm25_U", "dense_U"), ("bm25_U", "dense_U")),
    ("auto", "auto"), ("dense_X", ("dense_X",))])
def test_signals_are_normalised_when_made(given, kept):
    p = ReadParams(signals=given)
    assert p.signals == kept
    assert p.describe()["signals"] == (kept if kept == "auto" else "+".join(kept))


def test_signal_names_are_checked_against_the_registry_when_resolved():
    from memgas_gpu.retrieve import resolve

    p = ReadParams(signals="dense_S+dense_X")  # made without the registry (no torch)
    with pytest.raises(SettingsError, match=r"unknown signal\(s\) \['dense_X'\]"):
        p.check()
    with pytest.raises(SettingsError, match=r"unknown signal\(s\) \['dense_X'\]"):
        resolve(None, "memgas", signals="dense_X")
    assert ReadParams(signals="bm25_S+dense_Tmax").check().signals == ("bm25_S", "dense_Tmax")


def test_describe_records_are_the_stored_format_and_read_back():
    """The records eval outputs and index manifests hold (an explicit literal: a change
    of format is a change of every stored file)."""
    assert ReadParams().describe() == {
        "signals": "dense_S+dense_T+dense_U+dense_K", "norm": "none", "router": "inverse",
        "temperature": 0.2, "fusion": "ppr", "alpha": 15, "damping": 0.1, "graph": "dense",
        "topk": 5, "k1": 1.5, "b": 0.75, "bm25_method": "lucene", "speaker_gamma": 0.0,
        "time_beta": 0.0}
    assert BuildParams().describe() == {
        "summaries": "offline", "keywords": "offline", "m": 30, "skip_sessions": 5,
        "concat": True, "lexical": True, "keep_turns": True, "keep_text": True,
        "tokenizer": None}
    r = ReadParams(signals=["bm25_S", "dense_Tmax"], norm="z", temperature=1, alpha=3)
    assert ReadParams(**r.describe()) == r
    assert r.describe()["temperature"] == 1.0 and isinstance(r.describe()["temperature"], float)
    b = BuildParams(summaries="source", m=12, skip_sessions=2, concat=False, keep_text=False)
    rec = b.describe()
    assert BuildParams.from_record(rec) == b
    assert BuildParams.from_record({**rec, "written_by_a_newer_version": 1}) == b
    assert BuildParams.from_record(None) == BuildParams()
    with pytest.raises(SettingsError, match="m must be"):
        BuildParams.from_record({**rec, "m": 0})

    class Source:
        name = "llm:gpt"

    assert BuildParams(summaries=Source()).describe()["summaries"] == "llm:gpt"
    assert dataclasses.asdict(GraphParams.from_key("topk7", GraphParams(m=9))) == {
        "m": 9, "skip_sessions": 5, "rule": "topk", "topk": 7}


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_settings_presets_and_choices_import_without_torch():
    out = _run("import sys\n"
               "import memgas_gpu.retrieve.presets as p, memgas_gpu.retrieve.params as rp\n"
               "import memgas_gpu.settings, memgas_gpu.choices, memgas_gpu.gam.params as gp\n"
               "rp.ReadParams(signals='bm25_S+dense_T').replace(alpha=3)\n"
               "rp.BuildParams(m=1); rp.GraphParams(rule='topk'); gp.GamParams(theta=0.5)\n"
               "from memgas_gpu.retrieve import PRESETS, METHODS, DEFAULT_METHOD, "
               "ReadParams, BuildParams, GraphParams, SettingsError\n"
               "assert DEFAULT_METHOD in METHODS == tuple(PRESETS) == p.METHODS\n"
               "print('torch' in sys.modules)")
    assert out == "False"


def test_every_name_retrieve_exported_is_importable_and_search_is_the_function():
    names = ["SessionTable", "embed_sessions", "encode_unique", "DEFAULT_METHOD",
             "HYBRID_SIGNALS", "HYBRID_EXTRACTIVE_SIGNALS", "METHODS", "PRESETS",
             "NonFiniteScoresError", "ReadParams", "SettingsError", "resolve",
             "EncoderMismatchError", "BuildParams", "GraphParams", "MemoryIndex",
             "IndexConflictError", "IndexFormatError", "IndexLockError", "Retrieval",
             "SearchResult", "retrieve", "search", "SIGNALS", "QueryBatch"]
    out = _run("import sys, memgas_gpu.retrieve.search\n"  # the submodule first
               "mod = sys.modules['memgas_gpu.retrieve.search']\n"
               "import memgas_gpu.retrieve as r\n"
               f"missing = [n for n in {names!r} if not hasattr(r, n)]\n"
               "from memgas_gpu.retrieve import search\n"
               "print(missing, search is mod.search, callable(r.search), "
               f"set({names!r}) <= set(r.__all__) <= set(dir(r)))")
    assert out == "[] True True True"
    with pytest.raises(AttributeError):
        import memgas_gpu.retrieve as r
        r.NoSuchName  # noqa: B018


def _context(command: str, args: list):
    from memgas_gpu.cli.main import cli

    return cli.commands[command].make_context(command, args)


def test_command_line_bounds_and_defaults_come_from_the_settings(tmp_path):
    data = tmp_path / "d.json"
    data.write_text("[]")
    ctx = _context("index", [str(data), "--out", str(tmp_path / "ix")])
    assert (ctx.params["m"], ctx.params["skip_sessions"]) == (30, 5)
    assert (ctx.params["summaries"], ctx.params["keywords"]) == ("offline", "offline")
    assert _context("index", [str(data), "--out", "x", "--m", "1"]).params["m"] == 1
    for bad in (["--m", "0"], ["--m", str(MAX + 1)], ["--skip-sessions", "-1"]):
        with pytest.raises(click.BadParameter):
            _context("index", [str(data), "--out", "x", *bad])
    for bad in (["--alpha", str(MAX + 1)], ["--temperature", "0"], ["--damping", "nan"],
                ["--router", "softmax"]):
        with pytest.raises(click.BadParameter):
            _context("eval", [str(data), *bad])
    assert _context("eval", [str(data), "--alpha", str(MAX)]).params["alpha"] == MAX
    g = _context("gam", [str(data)]).params
    assert (g["segmentation"], g["noise"], g["seed"], g["summaries"]) == \
        ("semantic", 0.0, 0, "offline")
    for bad in (["--anchors", "0"], ["--seed", "-1"], ["--theta", "2.5"], ["--noise", "inf"]):
        with pytest.raises(click.BadParameter):
            _context("gam", [str(data), *bad])
    from memgas_gpu.cli._common import build_params, parse_settings
    from memgas_gpu.cli.sweep import parse_grid

    got = parse_settings(["alpha=3", "temperature=1", "signals=bm25_S+dense_T"])
    assert got == {"alpha": 3, "temperature": 1.0, "signals": "bm25_S+dense_T"}
    assert (type(got["alpha"]), type(got["temperature"])) == (int, float)
    with pytest.raises(click.BadParameter, match="alpha"):
        parse_grid([f"alpha=1,{MAX + 1}"])
    assert build_params(no_concat=True, m=7) == BuildParams(concat=False, m=7)
    with pytest.raises(SettingsError, match="unknown setting"):
        build_params(mm=7)


def test_every_error_class_is_listed_in_errors_with_its_module():
    """memgas_gpu.errors' docstring names each error class and the module defining it."""
    import memgas_gpu.errors as errors

    doc = errors.__doc__
    pkg = ROOT / "memgas_gpu"
    found = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                mod = ".".join(path.relative_to(pkg).with_suffix("").parts)
                found.append((node.name, mod))
    assert len(found) >= 18
    rows = {ln.split()[0].strip("`"): ln.split()[1].strip("`") for ln in doc.splitlines()
            if ln.startswith("``") and ln.split()[0].endswith("Error``")}
    assert rows == dict(found)
