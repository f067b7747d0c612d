"""Synthetic LongMemEval-format data: realistic chat haystacks with planted evidence.

:func:`write_synthetic` streams a LongMemEval-format JSON file (see docs/algorithm.md
"Data") of any shape, up to and beyond LongMemEval-M (``SCALES["m"]``: 500 questions
x 500 sessions x ~1M tokens per haystack), deterministically for a seed.  Messages
come from a template grammar over topic vocabularies (:mod:`._text`,
:mod:`._vocab`); each question plants 1-3 evidence sentences whose wording overlaps
the question (:mod:`._facts`).
"""
from ._facts import QUESTION_TYPES
from ._writer import (
    DEFAULT_ABSTENTION_RATE,
    DEFAULT_DISTRACTOR_RATE,
    LIMITS,
    MAX_EVIDENCE,
    MAX_POOL_WORDS,
    MAX_TOTAL_WORDS,
    SCALES,
    SynthParamError,
    SynthSummary,
    format_date,
    validate_params,
    write_synthetic,
)

__all__ = [
    "DEFAULT_ABSTENTION_RATE",
    "DEFAULT_DISTRACTOR_RATE",
    "LIMITS",
    "MAX_EVIDENCE",
    "MAX_POOL_WORDS",
    "MAX_TOTAL_WORDS",
    "QUESTION_TYPES",
    "SCALES",
    "SynthParamError",
    "SynthSummary",
    "format_date",
    "validate_params",
    "write_synthetic",
]
