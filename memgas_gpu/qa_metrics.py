"""Answer-quality metrics: token F1, exact match, BLEU-4, ROUGE-1/2/L, LLM-judge accuracy.

* Token F1 and exact match use SQuAD normalisation (lower case, no punctuation, no
  articles, single spaces) — the reference's ``qa_f1_score``.
* BLEU-4 is corpus-level, sacreBLEU with the ``13a`` tokenizer and no smoothing, which
  is what the reference's Hugging Face ``evaluate`` BLEU computes.
* ROUGE-1/2/L are the mean F-measures of Google's ``rouge-score`` (no stemming).
* ``judge`` is the share of yes verdicts (:mod:`memgas_gpu.llm.judge`).

Every metric is a fraction in [0, 1]; :func:`format_qa_table` prints percentages.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["QAItem", "normalize_answer", "token_f1", "exact_match", "bleu4", "rouge",
           "qa_scores", "qa_report", "format_qa_table", "METRICS"]

#: metric names in report order
METRICS = ("f1", "em", "bleu4", "rouge1", "rouge2", "rougeL", "judge")

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, squeeze spaces."""
    s = "".join(ch for ch in str(s).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall after :func:`normalize_answer`.

    Two empty answers score 0 (the reference's convention).
    """
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised answers are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _need(module: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"QA metrics need the {package!r} package: pip install "
                          f"{package}") from None


def bleu4(predictions: Sequence[str], golds: Sequence[str]) -> float:
    """Corpus BLEU-4 (sacreBLEU, ``13a`` tokens, no smoothing, case-sensitive), in [0, 1]."""
    if not predictions:
        return 0.0
    sacrebleu = _need("sacrebleu", "sacrebleu")
    res = sacrebleu.corpus_bleu([str(p) for p in predictions], [[str(g) for g in golds]],
                                smooth_method="none", tokenize="13a")
    return res.score / 100.0


def rouge(predictions: Sequence[str], golds: Sequence[str]) -> dict:
    """Mean ROUGE-1/2/L F-measures (``rouge-score``, no stemming)."""
    if not predictions:
        return {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    rs = _need("rouge_score.rouge_scorer", "rouge-score")
    scorer = rs.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    tot = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for p, g in zip(predictions, golds):
        sc = scorer.score(str(g), str(p))  # (target, prediction)
        for k in tot:
            tot[k] += sc[k].fmeasure
    return {k: v / len(predictions) for k, v in tot.items()}


@dataclass(frozen=True)
class QAItem:
    """One scored answer.

    Attributes:
        question_id, question_type, is_abstention: from the dataset.
        prediction: the hypothesis; gold: the reference answer.
        verdict: the LLM judge's yes (True) / no (False), or None when not judged.
    """

    question_id: str
    question_type: str
    is_abstention: bool
    prediction: str
    gold: str
    verdict: Optional[bool] = None


def qa_scores(items: Sequence[QAItem]) -> dict:
    """Every metric over ``items`` (``judge`` only when all of them were judged)."""
    preds = [it.prediction for it in items]
    golds = [it.gold for it in items]
    n = len(items)
    out = {"n": n,
           "f1": sum(map(token_f1, preds, golds)) / n if n else 0.0,
           "em": sum(map(exact_match, preds, golds)) / n if n else 0.0,
           "bleu4": bleu4(preds, golds), **rouge(preds, golds)}
    if n and all(it.verdict is not None for it in items):
        out["judge"] = sum(bool(it.verdict) for it in items) / n
    return out


def qa_report(items: Sequence[QAItem]) -> dict:
    """Overall, per question type and abstention-only scores.

    Returns:
        ``{"overall": {...}, "by_type": {type: {...}}, "abstention": {...}}``; each
        ``{...}`` is :func:`qa_scores`.
    """
    types = sorted({it.question_type for it in items})
    abst = [it for it in items if it.is_abstention]
    return {"overall": qa_scores(items),
            "by_type": {t: qa_scores([it for it in items if it.question_type == t])
                        for t in types},
            "abstention": qa_scores(abst) if abst else {"n": 0}}


def format_qa_table(report: dict) -> str:
    """A plain-text table of :func:`qa_report` (percentages)."""
    cols = [m for m in METRICS if m in report["overall"]]
    rows = [("all", report["overall"])] + [(t or "(no type)", s)
                                          for t, s in report["by_type"].items()]
    if report["abstention"].get("n"):
        rows.append(("(abstention)", report["abstention"]))
    table = [["", "n"] + cols] + [[name, str(s["n"])] + [
        f"{100 * s[c]:.2f}" if c in s else "-" for c in cols] for name, s in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                       for i, c in enumerate(r)) for r in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
