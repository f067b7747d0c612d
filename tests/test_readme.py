"""Every ``python`` and ``bash`` block of the README runs as written, in order, in one
temporary folder; so do the blocks of ``docs/*.md`` that need no GPU, LLM server or
downloaded data (each document in its own folder, with the README quick start's
``demo.json`` and ``demo.idx`` in it).

A block that is not meant to run says so in its fence info string: ``bash no-run: why``.
By default the blocks run in this process on a tiny scale (``memgas synth`` gets 3
questions x 4 sessions) with a tiny random encoder standing in for the bundled one;
under ``-m slow`` they run exactly as written, each in its own ``bash`` / ``python``
process, with the bundled MiniLM.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from memgas_gpu.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RUN_LANGS = ("python", "bash")
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    info: str  # the rest of the fence info string
    code: str

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGS and not self.info

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    out = []
    for m in _FENCE.finditer(text):
        info = m.group(1).strip()
        lang, _, rest = info.partition(" ")
        out.append(Block(path, text.count("\n", 0, m.start()) + 1, lang, rest.strip(),
                         m.group(2)))
    return out


def section(title: str) -> list[Block]:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    lo, hi = text.count("\n", 0, start) + 1, text.count("\n", 0, end if end > 0 else None)
    return [b for b in blocks(README) if lo <= b.line <= hi]


# --------------------------------------------------------------- the fence rules
@pytest.mark.parametrize("path", [README] + DOCS, ids=lambda p: p.name)
def test_every_code_block_runs_or_says_why_not(path):
    for b in blocks(path):
        if b.lang in RUN_LANGS and b.info:
            assert re.fullmatch(r"no-run: \S.*", b.info), \
                f"{b.name}: '```{b.lang} {b.info}': say 'no-run: <why>' or nothing"
        assert b.lang, f"{b.name}: a fence without a language (text, json, …)"


def test_readme_keeps_the_setup_commands_and_the_agent_block_first():
    setup = section("Set up and test")[0].code.splitlines()
    assert setup == ['pip install -e ".[dev]"', "python -m pytest -q --durations=20"]  # CI runs these
    first_python = next(b for b in blocks(README) if b.lang == "python")
    assert first_python.runs and "mg.MemoryIndex.build(mg.Dataset([]))" in first_python.code
    cmds = [c for b in section("Quick start") for c in bash_commands(b)]
    assert [c[1] for c in cmds[:2]] == ["synth", "eval"]  # data first, then the table


# --------------------------------------------------------------- the runner
def bash_commands(block: Block) -> list[list[str]]:
    """The command lines of a bash block, as argv lists (continuations joined)."""
    joined = re.sub(r"\\\n", " ", block.code)
    return [w for w in (shlex.split(line, comments=True) for line in joined.splitlines())
            if w]


class Runner:
    """Runs blocks in one folder and records, per block, None or the failure."""

    def __init__(self, folder: Path, fast: bool, tiny_model=None) -> None:
        self.folder, self.fast, self.tiny_model = folder, fast, tiny_model
        self.failures: dict[str, str] = {}
        self.outputs: dict[str, str] = {}

    def run(self, block: Block) -> None:
        try:
            self.outputs[block.name] = (self._fast if self.fast else self._slow)(block)
        except BaseException as e:  # noqa: BLE001 - recorded, asserted per block
            if isinstance(e, KeyboardInterrupt):
                raise
            self.failures[block.name] = "".join(traceback.format_exception(e))[-3000:]

    def _fast(self, block: Block) -> str:
        if block.lang == "python":
            import contextlib
            import io

            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile(block.code, block.name, "exec"), {"__name__": "__readme__"})
            return buf.getvalue()
        out = []
        for argv in bash_commands(block):
            assert argv[0] == "memgas", f"{block.name}: {argv}: only memgas commands run " \
                                        "in process (-m slow runs any)"
            args = argv[1:]
            if args[0] == "synth":
                args += ["--questions", "3", "--sessions", "4"]  # the last one wins
            r = CliRunner().invoke(cli, args)
            assert r.exit_code == 0, (argv, r.output[-3000:], r.exception)
            out.append(r.stdout)
        return "".join(out)

    def _slow(self, block: Block) -> str:
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}"
                                    f"{os.environ.get('PATH', '')}")
        cmd = ["bash", "-euo", "pipefail", "-c", block.code] if block.lang == "bash" else \
            [sys.executable, "-c", block.code]
        r = subprocess.run(cmd, cwd=self.folder, env=env, capture_output=True, text=True,
                           timeout=1800)
        assert r.returncode == 0, (block.name, r.stdout[-2000:], r.stderr[-3000:])
        return r.stdout


@pytest.fixture(scope="module")
def tiny_model(tiny_bert):
    return tiny_bert


@pytest.fixture(scope="module")
def tiny_bundled(tiny_model):
    """The tiny random encoder in place of the bundled MiniLM (``Encoder()``, the CLI's
    default, and the reload of an index that records the bundled encoder)."""
    import memgas_gpu.encode as enc_pkg
    import memgas_gpu.encode.encoder as enc_mod

    mp = pytest.MonkeyPatch()
    mp.setattr(enc_mod, "bundled_model_path", lambda: tiny_model)
    mp.setattr(enc_pkg, "bundled_model_path", lambda: tiny_model)
    yield tiny_model
    mp.undo()


def _run_all(folder: Path, docs: list[Path], fast: bool):
    old = os.getcwd()
    os.chdir(folder)
    try:
        readme = Runner(folder, fast)
        for b in blocks(README):
            if b.runs:
                readme.run(b)
        per_doc = {}
        for doc in docs:
            sub = folder / f"doc-{doc.stem}"
            sub.mkdir()
            for name in ("demo.json", "demo.idx"):
                if (folder / name).exists():
                    os.symlink(folder / name, sub / name)
            os.chdir(sub)
            per_doc[doc.name] = r = Runner(sub, fast)
            for b in blocks(doc):
                if b.runs:
                    r.run(b)
            os.chdir(folder)
        return readme, per_doc
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def ran(tmp_path_factory, tiny_bundled):
    """The README, then the docs, in one temporary folder (fast mode)."""
    folder = tmp_path_factory.mktemp("readme")
    readme, docs = _run_all(folder, DOCS, fast=True)
    return folder, readme, docs


README_BLOCKS = [b for b in blocks(README) if b.runs]
DOC_BLOCKS = [b for d in DOCS for b in blocks(d) if b.runs]


@pytest.mark.parametrize("block", README_BLOCKS, ids=lambda b: b.name)
def test_readme_block_runs(ran, block):
    _, readme, _ = ran
    assert block.name not in readme.failures, readme.failures[block.name]


@pytest.mark.parametrize("block", DOC_BLOCKS, ids=lambda b: b.name)
def test_docs_block_runs(ran, block):
    _, _, docs = ran
    fail = docs[block.path.name].failures
    assert block.name not in fail, fail[block.name]


def test_docs_have_runnable_blocks():
    # the docs test is not vacuous: some documents do show code a user can run here
    assert {b.path.name for b in DOC_BLOCKS} >= {"gam.md", "hybrid.md"}


def _check_quick_start(folder: Path, readme: Runner) -> None:
    from memgas_gpu.retrieve import METHODS

    data = json.loads((folder / "demo.json").read_text())
    n = len(data)  # questions in the file, counted from the raw JSON
    qs = section("Quick start")
    eval_cmd = bash_commands(qs[0])[1]
    methods = [eval_cmd[i + 1] for i, w in enumerate(eval_cmd) if w == "--method"]
    out = readme.outputs[qs[0].name]
    for m in methods:
        assert f"== {m} ({n} questions)" in out
        log = folder / f"demo.results.{m}.jsonl"  # several methods: one log each
        recs = [json.loads(x) for x in log.read_text().splitlines()]
        assert sorted(r["question_id"] for r in recs) == sorted(d["question_id"] for d in data)
    assert "recall_all@5" in out and "ndcg_any@10" in out
    metrics = json.loads((folder / "demo.results.metrics.json").read_text())
    assert set(metrics["methods"]) == set(methods)
    import memgas_gpu

    assert metrics["memgas_gpu"] == memgas_gpu.__version__
    out2 = readme.outputs[qs[1].name]
    assert (folder / "demo.idx" / "manifest.json").exists()
    assert len(re.findall(r"^== ", out2, re.M)) == len(METHODS)
    ids = [d["question_id"] for d in data]  # LongMemEval: one conversation per question
    assert all(i in out2 for i in ids)  # memgas stats demo.json / demo.idx list the ids


def test_quick_start_writes_what_the_readme_says(ran):
    folder, readme, _ = ran
    assert not {b.name for b in section("Quick start")} & set(readme.failures)
    _check_quick_start(folder, readme)


def test_online_memory_search_finds_the_planted_session(ran):
    folder, readme, _ = ran
    blocks_ = section("Online memory")
    assert not {b.name for b in blocks_} & set(readme.failures)
    data = json.loads((folder / "demo.json").read_text())
    bash = bash_commands(blocks_[1])
    conv = bash[1][bash[1].index("--conversation") + 1]
    assert conv == data[0]["question_id"]  # the id the README names is the data's first
    last = readme.outputs[blocks_[1].name].strip().splitlines()[-1]
    rec = json.loads(last)
    assert rec["conversation_id"] == conv and len(rec["session_ids"]) == len(
        data[0]["haystack_session_ids"])  # k=10 by default, 4 sessions here
    assert set(rec["session_ids"]) == {s.removeprefix("answer_")
                                       for s in data[0]["haystack_session_ids"]}


@pytest.mark.slow
def test_readme_and_docs_exactly_as_written(tmp_path):
    """The bundled MiniLM at the README's own scale, each block in its own process."""
    readme, docs = _run_all(tmp_path, DOCS, fast=False)
    failures = {**readme.failures, **{k: v for d in docs.values() for k, v in d.failures.items()}}
    assert not failures, failures
    _check_quick_start(tmp_path, readme)
