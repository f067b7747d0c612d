"""QA metrics against hand-computed values."""
from __future__ import annotations

import math

import pytest

from memgas_gpu.llm.judge import judge_prompt, parse_verdict
from memgas_gpu.qa_metrics import (QAItem, bleu4, exact_match, format_qa_table,
                                   normalize_answer, qa_report, qa_scores, rouge, token_f1)


@pytest.mark.parametrize("text,expected", [
    ("The Cat, sat!", "cat sat"),
    ("  an   apple a day ", "apple day"),
    ("7 May 2023.", "7 may 2023"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize("pred,gold,expected", [
    ("The cat sat.", "a cat sat on the mat", 2 * 1.0 * 0.5 / 1.5),   # P=2/2, R=2/4
    ("cat cat dog", "cat dog dog", 2 / 3),                           # overlap {cat:1, dog:1}
    ("7 May 2023", "7 May 2023", 1.0),
    ("Paris", "London", 0.0),
    ("", "", 0.0),
    ("the", "a", 0.0),                                               # only articles
])
def test_token_f1(pred, gold, expected):
    assert token_f1(pred, gold) == pytest.approx(expected)


def test_exact_match():
    assert exact_match("The Louvre.", "louvre") == 1.0
    assert exact_match("Louvre museum", "louvre") == 0.0


def test_bleu4_hand_computed():
    # identical → 1
    assert bleu4(["a b c d e f"], ["a b c d e f"]) == pytest.approx(1.0)
    # one substitution at the end: p1..p4 = 5/6, 4/5, 3/4, 2/3; BP = 1
    assert bleu4(["a b c d e f"], ["a b c d e g"]) == pytest.approx((1 / 3) ** 0.25)
    # short hypothesis: all precisions 1, BP = exp(1 - 6/4)
    assert bleu4(["a b c d"], ["a b c d e f"]) == pytest.approx(math.exp(-0.5))
    # no 4-gram match anywhere: 0 (no smoothing, as the reference)
    assert bleu4(["a b c"], ["a b c"]) == 0.0
    # corpus level: counts are summed before the geometric mean
    got = bleu4(["a b c d e f", "a b c d e f"], ["a b c d e f", "a b c d e g"])
    p = [11 / 12, 9 / 10, 7 / 8, 5 / 6]
    assert got == pytest.approx(math.prod(p) ** 0.25)
    assert bleu4([], []) == 0.0


def test_rouge_hand_computed():
    r = rouge(["cat sat down"], ["cat sat up"])
    assert r["rouge1"] == pytest.approx(2 / 3)   # 2 of 3 unigrams each way
    assert r["rouge2"] == pytest.approx(1 / 2)   # {cat sat} of 2 bigrams each way
    assert r["rougeL"] == pytest.approx(2 / 3)   # LCS "cat sat"
    r = rouge(["a b c d", "x"], ["a c", "y"])
    # P=2/4 R=2/2 → F=2/3 for rouge1 and rougeL (LCS "a c"); rouge2: no shared bigram
    assert r["rouge1"] == pytest.approx((2 / 3 + 0) / 2)
    assert r["rougeL"] == pytest.approx((2 / 3 + 0) / 2)
    assert r["rouge2"] == pytest.approx(0.0)


def _items():
    return [
        QAItem("q1", "temporal", False, "7 May 2023", "7 May 2023", True),
        QAItem("q2", "temporal", False, "in June", "7 May 2023", False),
        QAItem("q3", "single-hop", False, "The cat sat.", "a cat sat on the mat", True),
        QAItem("q4_abs", "single-hop", True, "I don't know", "not mentioned", True),
    ]


def test_report_by_type_and_abstention():
    rep = qa_report(_items())
    assert rep["overall"]["n"] == 4
    assert rep["overall"]["f1"] == pytest.approx((1 + 0 + 2 / 3 + 0) / 4)
    assert rep["overall"]["judge"] == pytest.approx(3 / 4)
    assert rep["by_type"]["temporal"]["f1"] == pytest.approx(0.5)
    assert rep["by_type"]["temporal"]["judge"] == pytest.approx(0.5)
    assert rep["by_type"]["single-hop"]["n"] == 2
    assert rep["abstention"]["n"] == 1 and rep["abstention"]["judge"] == 1.0
    table = format_qa_table(rep)
    assert "temporal" in table and "(abstention)" in table and "75.00" in table


def test_scores_without_verdicts_have_no_judge():
    items = [QAItem("q", "t", False, "x", "x")]
    s = qa_scores(items)
    assert "judge" not in s and s["f1"] == 1.0 and s["em"] == 1.0


@pytest.mark.parametrize("reply,verdict", [
    ("yes", True), ("Yes.", True), ("no", False), ("No, it is not.", False),
    ("[[yes]]", True), ("[[no]]", False), ("[[yes]] or [[no]]", False),
    ("The answer is correct: yes", True), ("", False), ("maybe", False),
])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_judge_prompt_by_type():
    base = judge_prompt("Q?", "A", "R", "multi-session")
    assert "Question: Q?" in base and "Correct answer: A" in base and "off-by-one" not in base
    assert "off-by-one" in judge_prompt("Q?", "18 days", "19 days", "temporal-reasoning")
    assert "updated answer" in judge_prompt("Q?", "A", "R", "knowledge-update")
    assert "Rubric: A" in judge_prompt("Q?", "A", "R", "single-session-preference")
    assert "cannot be answered" in judge_prompt("Q?", "A", "R", "temporal-reasoning",
                                                is_abstention=True)
