"""The signal registry is the only home of a signal: a dense and a lexical signal with a
text of their own, each registered in one call, are stored by ``build`` and
``add_session``, kept by ``save`` / ``load``, listed by ``available``, and retrieved with.

Oracles: the encoder's own embedding of the signal's text (dense: ``<q, x>``) and bm25s
over the conversation's documents of that text (lexical).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from memgas_gpu import Conversation, Dataset, Session, load_dataset
from memgas_gpu.retrieve import SIGNALS, MemoryIndex, retrieve
from memgas_gpu.retrieve.signals import available, register

pytest.importorskip("Stemmer")


def first_turn(session, summary, keywords):
    return session.turns[0] if session.turns else ""


@pytest.fixture
def signals():
    """Two signals registered for the test, removed afterwards."""
    register("dense_first", "T", "dense", text=first_turn,
             description="<q, embedding of the first turn>")
    register("bm25_first", "T", "lexical", text=first_turn,
             description="BM25 against the first turn")
    yield ("dense_first", "bm25_first")
    for name in ("dense_first", "bm25_first"):
        SIGNALS.pop(name, None)


@pytest.fixture(scope="module")
def conv(locomo_list_path):
    c = load_dataset(locomo_list_path)[0]
    return Conversation(c.id, c.sessions[:7], c.questions[:15], c.source_summaries)


def _flat(idx, name, questions=None):
    return retrieve(idx, questions, method="session", device="cpu", signals=(name,)).scores


def _oracle(idx, conv, minilm, sessions):
    """``[Q, N]`` scores of the two signals the reference way."""
    bm25s = pytest.importorskip("bm25s")
    texts = [first_turn(s, "", "") for s in sessions]
    x = minilm.encode(texts).float()
    dense = idx.q_emb.float() @ x.T
    tok = idx.snapshot().lexical.tokenizer
    r = bm25s.BM25()
    r.index([tok(t) for t in texts], show_progress=False)
    lex = []
    for q in idx.questions:
        qt = [t for t in tok(q.text) if t in r.vocab_dict]
        lex.append(r.get_scores(qt) if qt else np.zeros(len(texts)))
    return dense, torch.tensor(np.array(lex), dtype=torch.float32)


def test_registered_signals_live_through_build_add_save_load(signals, conv, minilm, tmp_path):
    head = Conversation(conv.id, conv.sessions[:-1], conv.questions, conv.source_summaries)
    idx = MemoryIndex.build(Dataset([head]), minilm, summaries="source", device="cpu",
                            progress=False)
    assert set(signals) <= set(available(idx.snapshot()))
    last = conv.sessions[-1]
    idx.add_session(conv.id, last, summary=conv.source_summaries.get(last.id, ""))
    dense, lex = _oracle(idx, conv, minilm, conv.sessions)
    torch.testing.assert_close(_flat(idx, "dense_first"), dense, atol=1e-4, rtol=0)
    torch.testing.assert_close(_flat(idx, "bm25_first"), lex, atol=1e-4, rtol=1e-4)
    idx.save(tmp_path / "ix")
    back = MemoryIndex.load(tmp_path / "ix")
    assert set(signals) <= set(available(back.snapshot()))
    for name in signals:
        torch.testing.assert_close(_flat(back, name), _flat(idx, name), atol=1e-6, rtol=0)
    r = retrieve(back, method="memgas_hybrid", device="cpu",
                 signals=("bm25_S", "dense_first", "bm25_first"))
    assert torch.isfinite(r.scores[r.rankings >= 0]).all()
    # the loaded index grows the signals' data too
    extra = Session("extra", last.date, last.turns[::-1])
    back.add_session(conv.id, extra, summary="", keywords="")
    q = back.search(conv.id, [extra.turns[0]], method="session", signals=("dense_first",),
                    encoder=minilm, k=1)
    assert q[0].session_ids == ["extra"]


def test_an_index_without_the_signal_says_so(conv, minilm, signals):
    SIGNALS.pop("dense_first")
    SIGNALS.pop("bm25_first")
    idx = MemoryIndex.build(Dataset([conv]), minilm, summaries="source", device="cpu",
                            progress=False)
    register("dense_first", "T", "dense", text=first_turn)
    register("bm25_first", "T", "lexical", text=first_turn)
    assert "dense_first" not in available(idx.snapshot()) and "bm25_first" not in available(idx.snapshot())
    with pytest.raises(ValueError, match="does not store"):
        _flat(idx, "dense_first")
    with pytest.raises(ValueError, match="no lexical documents"):
        _flat(idx, "bm25_first")


def test_malformed_declarations_are_refused():
    for bad in (dict(name="a+b", node="S", kind="dense", text=first_turn),
                dict(name="x", node="Z", kind="dense", text=first_turn),
                dict(name="x", node="S", kind="sparse", text=first_turn),
                dict(name="x", node="S", kind="dense"),
                dict(name="x", node="S", kind="lexical"),
                dict(name="x", node="S", kind="lexical", docs="S", reduce="median"),
                dict(name="gran", node="S", kind="dense", text=first_turn)):
        with pytest.raises((ValueError, KeyError)):
            register(**bad)
        assert "x" not in SIGNALS and "a+b" not in SIGNALS


def test_a_cue_is_one_register_call_and_survives_a_load_elsewhere(conv, tmp_path):
    """A recency cue written outside the package (tests/_recency_cue.py: one register
    call, no edit of the engine) adds its weight to exactly the latest session of each
    conversation; a save records its module, and a load in a new process that never
    imported it finds it again and scores the same (by hand: scores without the cue,
    plus the weight on the last session)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from memgas_gpu.encode import Encoder
    from memgas_gpu.encode.tiny import make_random_bert

    import _recency_cue  # noqa: F401  registers "recency"

    try:
        enc = Encoder(make_random_bert(str(tmp_path / "bert")), device="cpu", max_length=64)
        idx = MemoryIndex.build(Dataset([conv]), enc, summaries="source", device="cpu",
                                progress=False)
        qs = [q.text for q in conv.questions[:4]]
        last = conv.sessions[-1].id
        plain = idx.search(conv.id, qs, k=7, method="memgas_hybrid", device="cpu")
        cued = idx.search(conv.id, qs, k=7, method="memgas_hybrid", device="cpu",
                          cues={"recency": 0.75})
        for a, b in zip(plain, cued):
            want = {s: v + (0.75 if s == last else 0.0) for s, v in zip(a.session_ids, a.scores)}
            assert dict(zip(b.session_ids, b.scores)) == pytest.approx(want, abs=1e-6)
        with pytest.raises(ValueError, match="unknown cue"):
            idx.search(conv.id, qs, cues={"nope": 1.0})
        idx.save(tmp_path / "ix")
        import _format4 as f4

        assert f4.root(tmp_path / "ix")["signal_modules"]["recency"] == "_recency_cue"
    finally:
        SIGNALS.pop("recency", None)
        sys.modules.pop("_recency_cue", None)
    code = (
        "import json, sys\n"
        "from memgas_gpu.retrieve import MemoryIndex\n"
        "from memgas_gpu.retrieve.signals import SIGNALS\n"
        "assert 'recency' not in SIGNALS\n"
        f"idx = MemoryIndex.load({str(tmp_path / 'ix')!r})\n"
        f"r = idx.search({conv.id!r}, json.loads(sys.argv[1]), k=7, method='memgas_hybrid',"
        " device='cpu', cues={'recency': 0.75})\n"
        "print(json.dumps([[x.session_ids, x.scores] for x in r]))\n")
    tests = str(Path(__file__).parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tests, str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code, json.dumps(qs)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for (ids, scores), b in zip(got, cued):
        assert ids == b.session_ids and scores == pytest.approx(b.scores, abs=1e-6)
    env["MEMGAS_IMPORT_SIGNALS"] = "0"  # a folder from someone else: nothing imported
    out = subprocess.run([sys.executable, "-c", code, json.dumps(qs)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode != 0 and "MEMGAS_IMPORT_SIGNALS=0" in out.stderr
