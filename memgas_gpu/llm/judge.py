"""LLM-as-judge: LongMemEval-style yes/no verdicts on generated answers.

The judge prompt depends on the question (in the spirit of LongMemEval's
``evaluate_qa.py``):

* abstention questions (``*_abs``, LoCoMo adversarial): yes when the response says the
  question cannot be answered from the history;
* ``single-session-preference``: the gold answer is a rubric; yes when the response
  uses the user's personal information as the rubric describes;
* temporal questions: off-by-one errors in counts of days/weeks/months are tolerated;
* ``knowledge-update``: yes when the response gives the updated answer, even if it
  also mentions older information;
* everything else: yes when the response contains or is equivalent to the answer.

A verdict is yes when the reply's first ``yes``/``no`` word (or ``[[yes]]``) is yes.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

from ..data.model import Dataset
from ..errors import DataFormatError
from ..qa_metrics import QAItem
from .client import ChatClient, ChatRequest

__all__ = ["judge_prompt", "parse_verdict", "judge_answers", "qa_items", "JUDGE_MAX_TOKENS"]

JUDGE_MAX_TOKENS = 10

_DEFAULT = (
    "You are grading an answer. Given a question, the correct answer and a model's "
    "response, reply yes if the response contains the correct answer or is equivalent to "
    "it; a response that shows all the intermediate steps leading to the correct answer "
    "also counts. Reply no if the response is wrong or gives only part of the information "
    "the answer requires.{extra}\n\n"
    "Question: {question}\n\nCorrect answer: {answer}\n\nModel response: {response}\n\n"
    "Is the model response correct? Reply with yes or no only.")

_TEMPORAL = (" Do not penalise off-by-one mistakes in counts of days, weeks, months or "
             "years: if the correct answer is 18 days and the response says 19 days, the "
             "response is still correct.")

_UPDATE = (" The user's information may have changed over time: if the response mentions "
           "earlier information together with the updated answer, it is correct as long as "
           "the updated answer matches the correct answer.")

_PREFERENCE = (
    "You are grading a personalised response. Given a question, a rubric describing the "
    "desired response and a model's response, reply yes if the response satisfies the "
    "rubric, otherwise no. The response does not need to cover every point of the rubric; "
    "it is correct as long as it recalls and uses the user's personal information "
    "correctly.\n\n"
    "Question: {question}\n\nRubric: {answer}\n\nModel response: {response}\n\n"
    "Does the model response satisfy the rubric? Reply with yes or no only.")

_ABSTENTION = (
    "You are grading a response to a question that cannot be answered from the "
    "conversation history. Given the question, an explanation of why it is unanswerable "
    "and a model's response, reply yes if the model recognises that it cannot answer: for "
    "example it says the information is missing or incomplete, or that related "
    "information was mentioned but not what was asked. Reply no if the model gives an "
    "answer as if it were known.\n\n"
    "Question: {question}\n\nExplanation: {answer}\n\nModel response: {response}\n\n"
    "Does the model correctly say that the question cannot be answered? Reply with yes or "
    "no only.")


def judge_prompt(question: str, answer: str, response: str, question_type: str = "",
                 is_abstention: bool = False) -> str:
    """The judge prompt for one answer (see the module doc for the rules by type)."""
    fields = {"question": question, "answer": answer, "response": response}
    qtype = question_type.lower()
    if is_abstention:
        return _ABSTENTION.format(**fields)
    if qtype == "single-session-preference":
        return _PREFERENCE.format(**fields)
    extra = _TEMPORAL if "temporal" in qtype else _UPDATE if qtype == "knowledge-update" \
        else ""
    return _DEFAULT.format(extra=extra, **fields)


_WORD = re.compile(r"\b(yes|no)\b")


def parse_verdict(reply: str) -> bool:
    """True when the judge said yes: ``[[yes]]``, or a first yes/no word that is yes."""
    t = reply.lower()
    if "[[yes]]" in t or "[[no]]" in t:
        return "[[yes]]" in t and "[[no]]" not in t
    m = _WORD.search(t)
    return bool(m) and m.group(1) == "yes"


def judge_answers(client: ChatClient, items: Sequence[dict]) -> list[bool]:
    """Verdicts for ``items``: dicts with ``question_id``, ``question``, ``answer``,
    ``hypothesis`` and optionally ``question_type``, ``is_abstention``."""
    reqs = [ChatRequest.user(
        judge_prompt(it["question"], it["answer"], it["hypothesis"],
                     it.get("question_type", ""), bool(it.get("is_abstention"))),
        f"judge of question {it['question_id']!r}", max_tokens=JUDGE_MAX_TOKENS)
        for it in items]
    return [parse_verdict(r) for r in client.map(reqs, desc="judge")]


def qa_items(ds: Dataset, hypotheses: dict, judge: Optional[ChatClient] = None,
             source: str = "hypotheses") -> list[QAItem]:
    """Pair hypotheses (``question_id → text``) with the dataset's questions and, when a
    judge client is given, add its verdicts.

    Questions without a hypothesis are skipped; a hypothesis for a question not in
    ``ds`` is an error (wrong dataset).

    Raises:
        DataFormatError: an unknown question id (names ``source``).
    """
    by_id = {q.id: q for q in ds.questions}
    unknown = [qid for qid in hypotheses if qid not in by_id]
    if unknown:
        raise DataFormatError(source, f"{len(unknown)} question id(s) not in the dataset, "
                              f"e.g. {unknown[0]!r} (wrong DATA?)")
    qs = [q for q in ds.questions if q.id in hypotheses]
    verdicts: list = [None] * len(qs)
    if judge is not None:
        verdicts = judge_answers(judge, [
            {"question_id": q.id, "question": q.text, "answer": q.answer,
             "hypothesis": hypotheses[q.id], "question_type": q.type,
             "is_abstention": q.is_abstention} for q in qs])
    return [QAItem(q.id, q.type, q.is_abstention, hypotheses[q.id], q.answer, v)
            for q, v in zip(qs, verdicts)]
