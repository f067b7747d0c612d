"""Speaker and time cues: parsing on hand-written cases, the tensor ops on hand-computed
values, and the speaker signal against bm25s over the conversation's messages."""
from __future__ import annotations

import math
from datetime import date

import numpy as np
import pytest
import torch

from _views import question_signals
from memgas_gpu.ops.bm25f import field_weighted_counts
from memgas_gpu.ops.time_affinity import time_affinity
from memgas_gpu.retrieve.cues import (named_speakers, parse_date, question_interval,
                                      split_messages)

from _benchmarks import load_benchmark

_cues = load_benchmark("cue_stages")  # the dataset path of the cues (research code)
build_speaker_data, speaker_signal = _cues.build_speaker_data, _cues.speaker_signal
speaker_weights = _cues.speaker_weights

pytest.importorskip("dateutil")


def _day(y, m, d):
    return float((date(y, m, d) - date(1970, 1, 1)).days)


def test_split_messages_and_named_speakers():
    t = "[Caroline]: Hi Mel!\n[Melanie]: Hey.\n The image Caption: a dog"
    assert split_messages(t) == [("Caroline", "Hi Mel!"),
                                 ("Melanie", "Hey.\n The image Caption: a dog")]
    names = ["Caroline", "Melanie"]
    assert named_speakers("What did Caroline research?", names) == [True, False]
    assert named_speakers("What is Melanie's hobby?", names) == [False, True]
    assert named_speakers("What did Mel and her kids make?", names) == [False, True]
    assert named_speakers("What do Caroline and Melanie share?", names) == [True, True]
    assert named_speakers("what did mel do?", names) == [False, False]  # not capitalised
    assert named_speakers("Who went?", names) == [False, False]
    # an ambiguous prefix names nobody
    assert named_speakers("What did Jo do?", ["John", "Joanna"]) == [False, False]


def test_question_intervals():
    a = date(2023, 10, 22)
    assert question_interval("What did John do on 7 July, 2023?") == (_day(2023, 7, 7),) * 2
    assert question_interval("Who came on May 3, 2023?") == (_day(2023, 5, 3),) * 2
    assert question_interval("What happened in August 2023?") == (_day(2023, 8, 1),
                                                                  _day(2023, 8, 31))
    assert question_interval("How often in 2022?") == (_day(2022, 1, 1), _day(2022, 12, 31))
    # a month without a year: the latest one not after the anchor
    assert question_interval("When did she go camping in June?", anchor=a) == (
        _day(2023, 6, 1), _day(2023, 6, 30))
    assert question_interval("Camping in November?", anchor=a) == (_day(2022, 11, 1),
                                                                   _day(2022, 11, 30))
    assert question_interval("When did she go camping in June?") is None  # no anchor
    assert question_interval("What may she like?", anchor=a) is None  # the verb, not May
    # relative expressions need the question's date
    assert question_interval("What did I buy last week?") is None
    q = date(2023, 5, 20)
    assert question_interval("What did I buy last week?", question_date=q) == (
        _day(2023, 5, 6), _day(2023, 5, 20))
    assert question_interval("Where was I 2 weeks ago?", question_date=q) == (
        _day(2023, 5, 6) - 3, _day(2023, 5, 6) + 3)


def test_parse_session_dates_of_both_sources():
    assert parse_date("1:56 pm on 8 May, 2023") == date(2023, 5, 8)
    assert parse_date("2023/05/20 (Sat) 02:21") == date(2023, 5, 20)
    assert parse_date("") is None and parse_date("no date here") is None


def test_time_affinity_hand_values():
    start = torch.tensor([_day(2023, 7, 1), math.nan])
    end = torch.tensor([_day(2023, 7, 31), math.nan])
    d = torch.tensor([[_day(2023, 6, 30), _day(2023, 7, 15), _day(2023, 8, 3), math.nan],
                      [_day(2023, 7, 15)] * 4], dtype=torch.float64)
    valid = torch.tensor([[True, True, True, True], [True, True, True, False]])
    hard = time_affinity(start, end, d, valid)
    assert hard.tolist() == [[0, 1, 0, 0], [0, 0, 0, 0]]
    soft = time_affinity(start, end, d, valid, after=2.0, tau=7.0)
    # 1 day before, inside, 3 days after the end (1 beyond the 2 allowed)
    assert torch.allclose(soft[0, :3], torch.tensor([math.exp(-1 / 7), 1.0, math.exp(-1 / 7)]))
    assert soft[0, 3] == 0 and not soft[1].any()


def test_field_weighted_counts_hand_values():
    # doc 0 = parts with terms {1: 2} (w 1) and {1: 1, 3: 1} (w 3); doc 1 = {0: 1} (w 1)
    doc = torch.tensor([0, 0, 0, 1])
    term = torch.tensor([1, 1, 3, 0])
    tf = torch.tensor([2.0, 1.0, 1.0, 1.0])
    w = torch.tensor([1.0, 3.0, 3.0, 1.0])
    ip, ix, val = field_weighted_counts(doc, term, tf, w, 3)
    assert ip.tolist() == [0, 2, 3, 3]
    assert ix.tolist() == [1, 3, 0] and val.tolist() == [5.0, 3.0, 1.0]


def test_speaker_signal_is_bm25_with_the_named_speakers_messages_repeated(locomo_index):
    """gamma = 0 is exactly bm25_Tmax / bm25_S; gamma = 1 equals bm25s over turns in
    which the named speaker's message tokens appear twice."""
    bm25s = pytest.importorskip("bm25s")
    ds, idx = locomo_index
    conv = ds[0]
    data = build_speaker_data(idx, ds)
    assert sorted(data.speakers[0]) == ["Gina", "Jon"]
    qi = torch.arange(len(idx.questions))
    plain = question_signals(idx, ("bm25_S", "bm25_Tmax"), qi, device="cpu")
    for g, name in (("T", "bm25_Tmax"), ("S", "bm25_S")):
        got = speaker_signal(idx, data, qi, speaker_weights(idx, data, 0.0, g, device="cpu"))
        assert torch.allclose(got, plain[name], rtol=1e-5, atol=1e-5)
    tok = idx.snapshot().lexical.tokenizer
    names = data.speakers[0]
    got = speaker_signal(idx, data, qi, speaker_weights(idx, data, 1.0, "T", device="cpu"))
    owner = np.repeat(np.arange(len(conv.sessions)), [len(s.turns) for s in conv.sessions])
    checked = 0
    for i in range(40):
        named = named_speakers(conv.questions[i].text, names)
        if sum(named) != 1:
            continue
        best = _bm25s_best_turn(bm25s, tok, conv, conv.questions[i].text,
                                names[named.index(True)], 2, owner)
        np.testing.assert_allclose(got[i, :len(conv.sessions)].numpy(), best, rtol=1e-4,
                                   atol=1e-4)
        checked += 1
    assert checked >= 20


def test_engine_speaker_cue_equals_bm25s_with_the_named_speaker_repeated(locomo_index):
    """The read path's ``speaker_gamma`` (read from the index's own turn texts, no dataset)
    gives bm25_Tmax for questions naming no single speaker, and BM25 over turns with the
    named speaker's messages counted 1 + gamma times otherwise (bm25s oracle)."""
    bm25s = pytest.importorskip("bm25s")
    from memgas_gpu.retrieve import retrieve

    ds, idx = locomo_index
    conv = ds[0]
    raw = dict(signals=("bm25_Tmax",), norm="none", router="uniform", fusion="sum",
               time_beta=0.0)
    plain = retrieve(idx, method="memgas_hybrid", device="cpu", speaker_gamma=0.0, **raw)
    tok = idx.snapshot().lexical.tokenizer
    names = ["Gina", "Jon"]
    owner = np.repeat(np.arange(len(conv.sessions)), [len(s.turns) for s in conv.sessions])
    n = len(conv.sessions)
    for gamma in (2.0, 3.0):  # the second runs on the same index (its cached weights)
        cue = retrieve(idx, method="memgas_hybrid", device="cpu", speaker_gamma=gamma, **raw)
        named_any = 0
        for i, q in enumerate(conv.questions[:40]):
            named = named_speakers(q.text, names)
            if sum(named) != 1:
                assert torch.equal(cue.scores[i], plain.scores[i])
                continue
            best = _bm25s_best_turn(bm25s, tok, conv, q.text, names[named.index(True)],
                                    1 + int(gamma), owner)
            np.testing.assert_allclose(cue.scores[i, :n].numpy(), best, rtol=1e-4,
                                       atol=1e-4)
            named_any += 1
        assert named_any >= 20


def _bm25s_best_turn(bm25s, tok, conv, question, who_named, times, owner):
    """The oracle: bm25s over the conversation's turns in which ``who_named``'s message
    tokens appear ``times`` times; the best turn of each session."""
    docs = [[x for who, text in split_messages(t)
             for x in tok(f"{who} {text}") * (times if who == who_named else 1)]
            for s in conv.sessions for t in s.turns]
    r = bm25s.BM25()
    r.index(docs, show_progress=False)
    qt = [x for x in tok(question) if x in r.vocab_dict]
    best = np.zeros(len(conv.sessions))
    np.maximum.at(best, owner, r.get_scores(qt) if qt else np.zeros(len(docs)))
    return best


def test_speaker_cue_bench_kept_weights_equal_rebuilt_ones(locomo_list_path):
    """benchmarks/speaker_cue.py: the search with the speaker weights kept with the view
    returns what the search with them rebuilt per question returns (the bench checks it
    for every question), on questions naming one speaker."""
    r = load_benchmark("speaker_cue").run(str(locomo_list_path), rounds=1, max_questions=6)
    assert r["questions"] == 6 and r["kept"][0] > 0 and r["rebuilt"][0] > 0
