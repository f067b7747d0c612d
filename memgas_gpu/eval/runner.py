"""Evaluate retrievals: per-question metrics, aggregates, LongMemEval-style logs."""
from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence, Union

import torch

from .._display import safe_text
from .._io import atomic_write
from .metrics import KS, gold_mask, metric_names, retrieval_metrics

__all__ = ["evaluate", "Evaluation", "format_table", "write_logs"]


class Evaluation:
    """Per-question metrics of one retrieval and their averages.

    ``summary["all"]`` averages over the non-abstention questions exactly as the
    reference does (a question without gold counts recall_all = 1);
    ``summary["strict"]`` skips questions without gold (the LongMemEval harness);
    ``summary["by_type"][t]`` is the parity average per question type.
    """

    def __init__(self, index, retrieval, per_question: dict, ks: Sequence[int]) -> None:
        self.index = index
        self.retrieval = retrieval
        self.per_question = per_question
        self.ks = tuple(ks)
        self.summary = self._summarise()

    def _mean(self, mask: torch.Tensor) -> dict:
        n = int(mask.sum())
        out = {"n": n}
        for name in metric_names(self.ks):
            v = self.per_question[name][mask]
            out[name] = float(v.mean()) if n else math.nan
        return out

    def _summarise(self) -> dict:
        qs = [self.index.questions[i] for i in self.retrieval.question_index.tolist()]
        scored = torch.tensor([not q.is_abstention for q in qs], dtype=torch.bool)
        has_gold = torch.tensor([bool(q.evidence_session_ids) for q in qs], dtype=torch.bool)
        by_type = {}
        types = sorted({q.type or "(none)" for q in qs})
        for t in types:
            m = scored & torch.tensor([(q.type or "(none)") == t for q in qs])
            if m.any():
                by_type[t] = self._mean(m)
        return {"all": self._mean(scored), "strict": self._mean(scored & has_gold),
                "by_type": by_type, "abstentions_skipped": int((~scored).sum())}


def evaluate(index, retrieval, ks: Sequence[int] = KS) -> Evaluation:
    """Metrics of ``retrieval`` against the gold sessions of its questions."""
    qi = retrieval.question_index.tolist()
    corpus, gold = [], []
    for i in qi:
        q = index.questions[i]
        conv = index.conversations[int(index.q_conv[i])]
        corpus.append(conv.session_ids)
        gold.append(q.evidence_session_ids)
    rel, n_gold = gold_mask(corpus, gold, retrieval.rankings.shape[1])
    per_q = retrieval_metrics(retrieval.rankings, rel, n_gold, ks=ks)
    return Evaluation(index, retrieval, per_q, ks)


def format_table(ev: Evaluation, metrics: Sequence[str] = ("recall_all", "ndcg_any"),
                 ks: Sequence[int] = (3, 5, 10)) -> str:
    """A plain-text table: overall (parity and strict) and per question type, in %."""
    cols = [f"{m}@{k}" for m in metrics for k in ks if k in ev.ks]
    head = ["", "n"] + cols
    rows = [["all (parity)", ev.summary["all"]], ["all (strict)", ev.summary["strict"]]]
    rows += [[safe_text(t), s] for t, s in ev.summary["by_type"].items()]  # types: data
    table = [head] + [[name, str(s["n"])] + [f"{100 * s[c]:.2f}" if s["n"] else "-"
                                             for c in cols] for name, s in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                       for i, c in enumerate(r)) for r in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def write_logs(ev: Evaluation, path: Union[str, os.PathLike], max_items: Optional[int] = None,
               session_texts: Optional[dict] = None,
               turn_metrics: Optional[dict] = None) -> None:
    """LongMemEval-harness retrieval logs: one JSON line per question.

    Each line holds the question's fields and ``retrieval_results: {query,
    ranked_items: [{corpus_id, text, timestamp}], metrics: {session: {...}, turn: {...}}}``
    (``turn_metrics``: per-question evidence-turn metrics ``{name: [Q]}`` in the
    retrieval's question order, e.g. :func:`memgas_gpu.eval.turns.turn_metrics`; NaN —
    a question without evidence turns — is left out).  Written atomically (temporary
    file, then rename).
    """
    idx, r = ev.index, ev.retrieval
    with atomic_write(path, "w", encoding="utf-8") as f:
        for row, i in enumerate(r.question_index.tolist()):
            q = idx.questions[i]
            conv = idx.conversations[int(idx.q_conv[i])]
            ranks = [p for p in r.rankings[row].tolist() if p >= 0]
            if max_items is not None:
                ranks = ranks[:max_items]
            items = []
            for p in ranks:
                item = {"corpus_id": conv.session_ids[p]}
                if session_texts is not None:
                    item["text"] = session_texts.get((conv.id, conv.session_ids[p]), "")
                item["timestamp"] = conv.session_dates[p]
                items.append(item)
            rec = {
                "question_id": q.id, "question_type": q.type, "question": q.text,
                "answer": q.answer, "question_date": q.date, "conversation_id": conv.id,
                "answer_session_ids": list(q.evidence_session_ids),
                "retrieval_results": {
                    "query": q.text, "ranked_items": items,
                    "metrics": {"session": {name: float(ev.per_question[name][row])
                                            for name in metric_names(ev.ks)},
                                "turn": {name: float(v[row]) for name, v in
                                         (turn_metrics or {}).items()
                                         if not math.isnan(float(v[row]))}},
                },
            }
            f.write(json.dumps(rec, ensure_ascii=False, allow_nan=False) + "\n")
