"""The paper's prompts: summaries, keywords, the relevance filter and the answer.

The wording is MemGAS's (the paper's prompts; docs/llm.md); every prompt is one user message,
temperature 0. ``dialogue`` is ``"user-ai"`` (LongMemEval, Long-MT-Bench+: a user
talking to an assistant) or ``"user-user"`` (LoCoMo: two people talking).
"""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

__all__ = ["DIALOGUE_STYLES", "SUMMARY_INSTRUCTION", "KEYWORDS_INSTRUCTION", "FILTER_PROMPT",
           "ANSWER_PROMPT", "expansion_prompt", "session_block", "filter_prompt",
           "answer_prompt", "prompts_fingerprint"]

#: how the instructions name the dialogue, by style
DIALOGUE_STYLES = {"user-ai": "user-AI assistant", "user-user": "user-user"}

SUMMARY_INSTRUCTION = (
    "Below is an {dialogue} dialogue memory. Please summarize the following dialogue as "
    "concisely as possible in a short paragraph, extracting the main themes and key "
    "information.\n")

KEYWORDS_INSTRUCTION = (
    "Below is an {dialogue} dialogue memory. Please extract the most relevant keywords, "
    "separated by semicolon.\n")

FILTER_PROMPT = """
You are an intelligent dialog bot. You will be shown History Dialogs and corresponding multi-granular information.
Filter the History Dialogs, summaries, and keywords to extract only the parts directly relevant to the Question. Preserve original tokens, do not paraphrase. Remove irrelevant turns, redundant info, and non-essential details.

History Dialogs: {history}

Question Date: {question_date}
Question: {question}
Answer:
"""

ANSWER_PROMPT = """
You are an intelligent dialog bot. You will be shown History Dialogs. Please read, memorize, and understand the given Dialogs, then generate one concise, coherent and helpful response for the Question.

History Dialogs: {history}

Question Date: {question_date}
Question: {question}
"""


def _style(dialogue: str) -> str:
    try:
        return DIALOGUE_STYLES[dialogue]
    except KeyError:
        raise ValueError(f"unknown dialogue style {dialogue!r}: use one of "
                         f"{sorted(DIALOGUE_STYLES)}") from None


def expansion_prompt(kind: str, turns: Sequence[str], dialogue: str = "user-ai") -> str:
    """The summary or keyword prompt for one session.

    Args:
        kind: ``"summary"`` or ``"keywords"``.
        turns: the session's turns; joined by blank lines as the reference does.
        dialogue: ``"user-ai"`` or ``"user-user"``.
    """
    if kind == "summary":
        instruction = SUMMARY_INSTRUCTION
    elif kind in ("keywords", "keyword"):
        instruction = KEYWORDS_INSTRUCTION
    else:
        raise ValueError(f"unknown expansion kind {kind!r}: use 'summary' or 'keywords'")
    body = "\n\n".join(turns)
    return f"{instruction.format(dialogue=_style(dialogue))}\n\n{body}\n\nYour answer:"


def session_block(date: str, text: str, summary: Optional[str] = None,
                  keywords: Optional[str] = None) -> str:
    """One retrieved session as the filter prompt shows it (date, content, then its
    summary and keywords when known)."""
    block = f"\n### Session Date: {date}\nSession Content:\n{text}\n"
    if summary is not None:
        block += f"\nSession Summary:\n{summary}\n"
    if keywords is not None:
        block += f"Session Keyword:\n{keywords}\n"
    return block


def filter_prompt(question: str, question_date: str, blocks: Sequence[str]) -> str:
    """The relevance filter over the top-k session blocks (:func:`session_block`)."""
    return FILTER_PROMPT.format(history="".join(blocks), question=question,
                                question_date=question_date)


def answer_prompt(question: str, question_date: str, history: str) -> str:
    """The answer prompt over the (filtered) history."""
    return ANSWER_PROMPT.format(history=history, question=question,
                                question_date=question_date)


def prompts_fingerprint() -> str:
    """A short hash of every prompt template (recorded in manifests)."""
    h = hashlib.sha256()
    for p in (SUMMARY_INSTRUCTION, KEYWORDS_INSTRUCTION, FILTER_PROMPT, ANSWER_PROMPT):
        h.update(p.encode())
    return h.hexdigest()[:12]
