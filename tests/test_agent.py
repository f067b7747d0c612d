"""The agent's memory: one import, an empty memory, messages in (``Session.from_messages``),
and the README's agent block, in this process and across processes, equal to a build of
the same sessions."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import memgas_gpu as mg
from memgas_gpu.data import load_dataset

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

MESSAGES = [{"role": "user", "content": "I started the violin; Mrs. Alvarez teaches me.\nOn Tuesdays."},
            {"role": "assistant", "content": "Lovely!"},
            {"role": "user", "content": "[not a role] still content"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "An odd message out."}]


# ------------------------------------------------------------ Session.from_messages
def _loaded_session(tmp_path, messages, date="2024/05/01 (Wed) 10:00"):
    """The oracle: the LongMemEval loader on a file holding ``messages``."""
    rec = {"question_id": "q1", "question_type": "single-session-user", "question": "x?",
           "answer": "y", "question_date": date, "haystack_session_ids": ["s1"],
           "haystack_dates": [date], "haystack_sessions": [messages],
           "answer_session_ids": ["s1"]}
    path = tmp_path / "one.json"
    path.write_text(json.dumps([rec]))
    return load_dataset(path)[0].sessions[0]


def test_from_messages_equals_the_loader(tmp_path):
    want = _loaded_session(tmp_path, MESSAGES)
    got = mg.Session.from_messages("s1", "2024/05/01 (Wed) 10:00", MESSAGES)
    assert (got.id, got.date, got.turns, got.first_lengths) == \
        (want.id, want.date, want.turns, want.first_lengths)
    assert got.messages == want.messages and len(got.messages) == 5
    # the rendered strings the loaders make (Session.messages) go back in unchanged
    again = mg.Session.from_messages("s1", want.date, list(want.messages))
    assert (again.turns, again.first_lengths) == (want.turns, want.first_lengths)
    mixed = mg.Session.from_messages("s1", want.date, [MESSAGES[0], *want.messages[1:]])
    assert mixed.turns == want.turns
    # a turn is the two messages joined by a newline, the odd one alone (by hand)
    assert got.turns[0] == "[user]: I started the violin; Mrs. Alvarez teaches me.\n" \
                           "On Tuesdays.\n[assistant]: Lovely!"
    assert got.turns[2] == "[user]: An odd message out."


def test_from_messages_dates():
    import datetime as dt

    assert mg.Session.from_messages("s", dt.date(2024, 5, 1), MESSAGES[:1]).date == "2024-05-01"
    assert mg.Session.from_messages("s", "", MESSAGES[:1]).date == ""


@pytest.mark.parametrize("args, kind, match", [
    (("s", "d", [{"role": "user"}]), TypeError, r"message 0: 'content' must be a string \(missing\)"),
    (("s", "d", [MESSAGES[0], {"role": 1, "content": "x"}]), TypeError, r"message 1: 'role'"),
    (("s", "d", [{"role": "a]b", "content": "x"}]), ValueError, r"role 'a\]b'"),
    (("s", "d", [{"role": " ", "content": "x"}]), ValueError, r"non-empty"),
    (("s", "d", ["no role here"]), ValueError, r"'\[role\]: content'"),
    (("s", "d", [42]), TypeError, r"message 0: expected"),
    (("s", "d", []), ValueError, r"no messages"),
    (("s", "d", "[user]: hi"), TypeError, r"list of messages"),
    (("s", "d", {"role": "user", "content": "x"}), TypeError, r"list of messages"),
    (("", "d", MESSAGES), TypeError, r"non-empty string"),
    ((None, "d", MESSAGES), TypeError, r"session id"),
    (("s", 20240501, MESSAGES), TypeError, r"date must be"),
])
def test_from_messages_refuses_bad_input_in_one_line(args, kind, match):
    with pytest.raises(kind, match=match) as e:
        mg.Session.from_messages(*args)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------ one import
def test_one_import_exposes_the_agent_api():
    from memgas_gpu.encode import Encoder
    from memgas_gpu.eval import evaluate
    from memgas_gpu.gam import GamIndex
    from memgas_gpu.retrieve import DEFAULT_METHOD, METHODS, MemoryIndex

    assert (mg.MemoryIndex, mg.Encoder, mg.evaluate, mg.GamIndex) == \
        (MemoryIndex, Encoder, evaluate, GamIndex)
    assert {"MemoryIndex", "Encoder", "Session", "Conversation", "Dataset", "load_dataset",
            "evaluate", "GamIndex"} <= set(mg.__all__) <= set(dir(mg))
    assert mg.DEFAULT_METHOD == DEFAULT_METHOD and DEFAULT_METHOD in METHODS
    with pytest.raises(AttributeError):
        mg.NoSuchThing  # noqa: B018


def test_import_and_help_do_not_import_torch():
    code = ("import sys, memgas_gpu\n"
            "from memgas_gpu.cli.main import cli\n"
            "for args in (['--help'], ['search', '--help'], ['eval', '--help'],\n"
            "             ['bench', '--help'], ['stats', '--help']):\n"
            "    try:\n"
            "        cli(args)\n"
            "    except SystemExit as e:\n"
            "        assert e.code == 0, (args, e.code)\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False"


# ------------------------------------------------------------ the README's agent block
def agent_block() -> str:
    text = README.read_text(encoding="utf-8")
    return re.search(r"^## Memory for an agent\n.*?^```python\n(.*?)^```", text,
                     re.S | re.M).group(1)


class PerSession:
    """Summaries and keywords as ``add_session`` makes them: the offline extractor on
    each session alone (the oracle build gets the same texts)."""

    name = "offline, per session"

    def config(self):  # extractive, as the offline source: signals="auto" picks alike
        return {"method": "offline"}

    def generate(self, kind, sessions, conversations):
        from memgas_gpu.expand.offline import OfflineExtractor

        out = []
        for s in sessions:
            u, k = OfflineExtractor().expand([s.text])
            out.append(u[0] if kind == "summary" else k[0])
        return out


def _build(sessions, encoder, conversation="user-1"):
    ds = mg.Dataset([mg.Conversation(conversation, list(sessions))])
    return mg.MemoryIndex.build(ds, encoder, summaries=PerSession(), keywords=PerSession(),
                                progress=False)


def _same_results(a, b, conversation, queries):
    ra, rb = a.search(conversation, queries, k=10), b.search(conversation, queries, k=10)
    for x, y in zip(ra, rb):
        assert x.session_ids == y.session_ids
        torch.testing.assert_close(torch.tensor(x.scores), torch.tensor(y.scores),
                                   rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    from memgas_gpu.encode.tiny import make_random_bert

    return mg.Encoder(make_random_bert(str(tmp_path_factory.mktemp("bert"))), device="cpu")


def test_the_agent_block_runs_and_equals_a_build(tmp_path, monkeypatch, tiny_encoder):
    """The README block as written (the tiny encoder in place of the bundled one), then
    its memory against a build of the same sessions."""
    import memgas_gpu.encode as enc_pkg
    import memgas_gpu.encode.encoder as enc_mod

    monkeypatch.setattr(enc_mod, "bundled_model_path", lambda: tiny_encoder.source)
    monkeypatch.setattr(enc_pkg, "bundled_model_path", lambda: tiny_encoder.source)
    made = []
    real = mg.Session.from_messages
    monkeypatch.setattr(mg.Session, "from_messages",
                        classmethod(lambda cls, *a: made.append(real(*a)) or made[-1]))
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(agent_block(), "README.md", "exec"), ns)
    assert (tmp_path / "mem.idx" / "manifest.json").exists()
    questions = ["Who teaches me the violin?", "Who visits from Lisbon?"]
    both = _build(made, tiny_encoder)
    hits = ns["hits"]  # asked with both sessions in memory
    ref = both.search("user-1", ["Who teaches me the violin?"], k=5)[0]
    assert hits[0].session_ids == ref.session_ids and len(hits[0].session_ids) == 2
    torch.testing.assert_close(torch.tensor(hits[0].scores), torch.tensor(ref.scores))
    one = _build(made[:1], tiny_encoder)  # s2 was removed, then saved and loaded
    _same_results(ns["mem"], one, "user-1", questions)


def test_reloaded_in_a_new_process_goes_on_adding(tmp_path, tiny_encoder):
    s1 = mg.Session.from_messages("s1", "2024-05-01", [
        {"role": "user", "content": "I started the violin; Mrs. Alvarez teaches me."},
        {"role": "assistant", "content": "Lovely! Practise a little every day."}])
    mem = mg.MemoryIndex.build(mg.Dataset([]), tiny_encoder)
    mem.add_session("user-1", s1)
    mem.save(tmp_path / "mem.idx")
    script = textwrap.dedent("""
        import sys
        import memgas_gpu as mg

        mem = mg.MemoryIndex.load(sys.argv[1])
        for i, (who, text) in enumerate([("user-1", "My sister Ana visits from Lisbon."),
                                         ("user-2", "I repaint the hallway on Sunday.")]):
            mem.add_session(who, mg.Session.from_messages(f"s{i + 2}", "2024-05-08", [
                {"role": "user", "content": text},
                {"role": "assistant", "content": "Noted."}]))
        mem.save(sys.argv[1])
    """)
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "mem.idx")],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    back = mg.MemoryIndex.load(tmp_path / "mem.idx")
    assert [c.id for c in back.conversations] == ["user-1", "user-2"]
    assert back.conversations[0].session_ids == ["s1", "s2"]
    s2 = mg.Session.from_messages("s2", "2024-05-08", [
        {"role": "user", "content": "My sister Ana visits from Lisbon."},
        {"role": "assistant", "content": "Noted."}])
    s3 = mg.Session.from_messages("s3", "2024-05-08", [
        {"role": "user", "content": "I repaint the hallway on Sunday."},
        {"role": "assistant", "content": "Noted."}])
    _same_results(back, _build([s1, s2], tiny_encoder), "user-1",
                  ["Who teaches me the violin?", "Who visits from Lisbon?"])
    _same_results(back, _build([s3], tiny_encoder, "user-2"), "user-2", ["hallway?"])


def test_a_conversation_without_sessions_searches_empty(tiny_encoder):
    mem = mg.MemoryIndex.build(mg.Dataset([mg.Conversation("empty", [])]), tiny_encoder)
    (res,) = mem.search("empty", ["anything?"], k=5)
    assert res.session_ids == [] and res.scores == [] and res.evidence == []


def test_one_default_method_everywhere(tmp_path, tiny_encoder):
    """retrieve, MemoryIndex.retrieve, search and MemoryIndex.search use DEFAULT_METHOD
    when no method is named (as memgas eval and memgas search do)."""
    from memgas_gpu.retrieve import DEFAULT_METHOD, retrieve, search
    from memgas_gpu.synth import write_synthetic

    write_synthetic(tmp_path / "d.json", questions=2, sessions=4, turns=2, words=8,
                    progress=False)
    idx = mg.MemoryIndex.build(load_dataset(tmp_path / "d.json"), tiny_encoder,
                               progress=False)
    want = idx.retrieve(method=DEFAULT_METHOD)
    for r in (retrieve(idx), idx.retrieve()):
        assert r.method == DEFAULT_METHOD and torch.equal(r.rankings, want.rankings)
    conv = idx.conversations[0].id
    named = idx.search(conv, ["violin?"], method=DEFAULT_METHOD)
    assert search(idx, conv, ["violin?"]) == idx.search(conv, ["violin?"]) == named
