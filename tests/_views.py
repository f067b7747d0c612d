"""Reading an index's own questions through the view-level read functions."""
from __future__ import annotations

from memgas_gpu.lexical import lexical_signals
from memgas_gpu.retrieve.signals import lexical_specs


def question_signals(index, names, questions=None, **kw) -> dict:
    """BM25 signals ``names`` of the dataset's ``questions`` (default all) of ``index``."""
    view, batch, _ = index.question_view(questions)
    return lexical_signals(view, batch.q_terms, batch.q_conv, lexical_specs(list(names)), **kw)
