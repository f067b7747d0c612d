"""Turn-level evaluation: messages and evidence turns in the data model, the metrics,
and the session → turn ranking rule of the MemGAS-family methods."""
from __future__ import annotations

import json
import math

import pytest
import torch

import memgas_gpu as mg
from memgas_gpu.data.model import Session, first_lengths, pair_messages
from memgas_gpu.eval.turns import (conversation_turn_ids, evaluate_turns,
                                   session_turn_rankings, turn_metrics)


def test_messages_are_recovered_from_the_turns():
    msgs = ["[a]: one\n The image Caption: a cat", "[b]: two", "", "[b]: x\ny", "[a]: last"]
    s = Session("s", "", pair_messages(msgs), first_lengths(msgs))
    assert s.turns == pair_messages(msgs)  # the turns are unchanged
    assert s.messages == tuple(msgs)
    assert Session("s", "", ("t1", "t2")).messages == ("t1", "t2")  # no structure known


def test_locomo_evidence_turns(locomo_list_path, tmp_path):
    ds = mg.load_dataset(locomo_list_path)
    raw = json.loads(locomo_list_path.read_text())
    c, r = ds[0], raw[0]
    pos = {d["dia_id"]: (k, j, d["text"]) for k, v in r["conversation"].items()
           if k.startswith("session_") and isinstance(v, list) for j, d in enumerate(v)}
    sessions = {s.id: s for s in c.sessions}
    n = 0
    for q, rq in zip(c.questions, r["qa"]):
        refs = [x.strip() for e in rq.get("evidence", []) for x in e.split(";")]
        want = list(dict.fromkeys(f"{pos[x][0]}:{pos[x][1]}" for x in refs if x in pos))
        assert [t for t in q.evidence_turn_ids if t in want] == want
        for x in refs:
            if x in pos:
                sid, j, text = pos[x]
                assert text in sessions[sid].messages[j]
                n += 1
    assert n >= len(c.questions) // 2  # most questions have evidence that was checked
    # an entry holding two references gives both turns (the session list skips it)
    rec = {"sample_id": "x", "conversation": {
        "speaker_a": "A", "speaker_b": "B",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"},
                      {"speaker": "B", "dia_id": "D1:2", "text": "yo"}],
        "session_2": [{"speaker": "A", "dia_id": "D2:1", "text": "again"}]},
        "qa": [{"question": "q", "answer": "a", "evidence": ["D1:2; D2:1", "D2:7"]}]}
    p = tmp_path / "l.json"
    p.write_text(json.dumps([rec]))
    q = mg.load_dataset(p)[0].questions[0]
    # D2:7 names no message: position 7 - 1 (it can never be recalled)
    assert q.evidence_turn_ids == ("session_1:1", "session_2:0", "session_2:6")
    assert q.evidence_session_ids == ("session_2",)


def test_longmemeval_has_answer_turns(lme_sample_path):
    raw = json.loads(lme_sample_path.read_text())
    ds = mg.load_dataset(lme_sample_path)
    for inst, c in zip(raw[:10], ds):
        want = [f"{sid.removeprefix('answer_')}:{j}"
                for sid, sess in zip(inst["haystack_session_ids"], inst["haystack_sessions"])
                for j, m in enumerate(sess) if m.get("has_answer")]
        assert list(c.questions[0].evidence_turn_ids) == want
        content = {f"{sid.removeprefix('answer_')}:{j}": f"[{m['role']}]: {m['content']}"
                   for sid, sess in zip(inst["haystack_session_ids"], inst["haystack_sessions"])
                   for j, m in enumerate(sess)}
        sessions = {s.id: s for s in c.sessions}
        for t in want:
            sid, j = t.rsplit(":", 1)
            assert sessions[sid].messages[int(j)] == content[t]


def test_turn_metrics_by_hand():
    ids = [["s1:0", "s1:1", "s2:0", "s2:1"]] * 3
    gold = [("s1:1", "s2:1"), ("s2:0",), ()]
    rankings = torch.tensor([[1, 0, 2, 3], [3, 1, 2, 0], [0, 1, 2, 3]])
    m = turn_metrics(rankings, ids, gold, ks=(1, 3))
    assert m["recall_any@1"][:2].tolist() == [1.0, 0.0]
    assert m["recall_all@3"][:2].tolist() == [0.0, 1.0]
    assert math.isnan(float(m["recall_all@3"][2]))  # no evidence: skipped
    avg = evaluate_turns(rankings, ids, gold, ks=(3,))
    assert avg["n"] == 2 and avg["recall_all@3"] == 0.5


def test_session_turn_rankings_by_hand():
    # 3 sessions with 2, 1, 2 messages; ranking: session 2, then 0, then 1
    msess = torch.tensor([[0, 0, 1, 2, 2, -1]])
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.2, 0.7, 0.0]])
    got = session_turn_rankings(torch.tensor([[2, 0, 1]]), msess, scores)
    assert got.tolist() == [[4, 3, 1, 0, 2, -1]]
    # a session missing from the ranking comes last; padding of the session ranking
    got = session_turn_rankings(torch.tensor([[1, -1, -1]]), msess, scores)
    assert got.tolist()[0][:1] == [2] and sorted(got.tolist()[0][1:5]) == [0, 1, 3, 4]


def test_conversation_turn_ids(locomo_list_path):
    c = mg.load_dataset(locomo_list_path)[1]
    ids = conversation_turn_ids(c)
    assert len(ids) == sum(len(s.messages) for s in c.sessions)
    n_msg = {s.id: len(s.messages) for s in c.sessions}
    # evidence naming a message the session has (a dia_id missing from the data maps past
    # the session's end by the documented rule, and can never be recalled)
    real = [t for q in c.questions for t in q.evidence_turn_ids
            if int(t.rsplit(":", 1)[1]) < n_msg.get(t.rsplit(":", 1)[0], 0)]
    assert len(real) >= len(c.questions) // 2
    assert all(t in ids for t in real)


def test_session_turns_of_a_session_retrieval():
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from memgas_gpu.data.model import Conversation, Dataset, Question
    from memgas_gpu.gam import GamIndex, GamParams

    sys.path.insert(0, str(Path(__file__).parent))
    from _gam_fake import FakeEncoder

    m0 = ["[a]: apples and pears", "[b]: pears are sweet", "[a]: rain today"]
    m1 = ["[a]: pears in the market", "[b]: cheap pears and apples"]
    ds = Dataset([Conversation("c", [Session("s0", "", pair_messages(m0), first_lengths(m0)),
                                     Session("s1", "", pair_messages(m1), first_lengths(m1))],
                               [Question("q", "apples and pears", evidence_turn_ids=("s1:1",))])])
    idx = GamIndex.build(ds, FakeEncoder(), GamParams(segmentation="session"))
    r = SimpleNamespace(method="memgas", question_index=torch.tensor([0]),
                        rankings=torch.tensor([[1, 0]]))
    tr = idx.session_turns(r)
    own = idx.retrieve(method="flat_fusion").scores[0]
    first = sorted([3, 4], key=lambda i: -float(own[i]))
    rest = sorted([0, 1, 2], key=lambda i: -float(own[i]))
    assert tr.rankings[0].tolist() == first + rest
    assert tr.method == "memgas+turns" and tr.turn_ids[0][3] == "s1:0"
    with pytest.raises(ValueError, match="another dataset"):
        idx.session_turns(SimpleNamespace(method="x", question_index=torch.tensor([5]),
                                          rankings=torch.tensor([[0, 1]])))
