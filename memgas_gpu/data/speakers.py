"""Speakers of rendered messages, and the speakers a question names.

Every loader renders a message as ``[speaker]: text`` (LoCoMo's speaker names,
LongMemEval's ``user`` / ``assistant`` roles) and a turn as two such messages, one per
line; :data:`MESSAGE` is the one pattern that reads them back, at the start of any line.
GAM's events (one message each) and the engine's speaker cue (turns of two messages)
both parse speakers here, and both decide here which speakers a question names.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

__all__ = ["MESSAGE", "speaker_of", "split_messages", "named_speakers"]

#: a message's speaker prefix, ``[name]: ``, at the start of a line (``name`` non-empty,
#: without ``]`` or a newline; group 1)
MESSAGE = re.compile(r"^\[([^\]\n]+)\]: ", re.M)
_WORD = re.compile(r"[^\W\d_](?:[^\W\d_]|['-])*")
_POSSESSIVE = re.compile(r"'s?$")
_FIRST_PERSON = re.compile(r"\b(?:i|my|me|mine|i've|i'm)\b", re.I)


def speaker_of(message: str) -> str:
    """``"[Caroline]: hi"`` → ``"Caroline"`` (``""`` when the message has no prefix)."""
    m = MESSAGE.match(message)
    return m.group(1).strip() if m else ""


def split_messages(turn: str) -> list[tuple[str, str]]:
    """``"[A]: x\\n[B]: y"`` → ``[("A", "x"), ("B", "y")]`` (text before the first prefix,
    if any, belongs to speaker ``""``)."""
    marks = list(MESSAGE.finditer(turn))
    out = []
    if not marks or marks[0].start() > 0:
        head = turn[:marks[0].start() if marks else len(turn)].strip()
        if head:
            out.append(("", head))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(turn)
        out.append((m.group(1).strip(), turn[m.end():end].strip()))
    return out


def named_speakers(question: str, speakers: Sequence[str], *,
                   first_person: Optional[str] = None) -> list[bool]:
    """Which of ``speakers`` the question names.

    A speaker is named when a word of the question (letters, inner ``'`` and ``-``; a
    trailing ``'s`` dropped) equals the speaker's first name, any case; or, failing
    that, when a capitalised word of at least three letters is the prefix of exactly
    one speaker's first name ("Mel" for Melanie).  With ``first_person`` (e.g.
    ``"user"``, LongMemEval's role), a question in the first person ("I", "my", "me",
    ...) also names the speaker of that name.

    Returns:
        One bool per entry of ``speakers`` (empty names are never named).
    """
    firsts = [s.split()[0].lower() if s.split() else "" for s in speakers]
    hit = [False] * len(speakers)
    for w in _WORD.findall(question):
        w0 = _POSSESSIVE.sub("", w)
        lw = w0.lower()
        exact = [i for i, f in enumerate(firsts) if f and lw == f]
        if exact:
            for i in exact:
                hit[i] = True
            continue
        if len(lw) >= 3 and w0[0].isupper():
            pre = [i for i, f in enumerate(firsts) if f and f.startswith(lw)]
            if len(pre) == 1:
                hit[pre[0]] = True
    if first_person is not None and _FIRST_PERSON.search(question):
        who = first_person.lower()
        for i, s in enumerate(speakers):
            if s.strip().lower() == who:
                hit[i] = True
    return hit
