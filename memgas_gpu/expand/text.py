"""Tokenisation helpers for the offline summary/keyword extractors."""
from __future__ import annotations

import re
from typing import Iterator, Optional

__all__ = ["STOPWORDS", "words", "iter_words", "sentences", "iter_sentences", "strip_role",
           "role_end"]

# A compact English stopword list (function words + chat filler).
STOPWORDS = frozenset("""
a about above after again against all also am an and any are aren't as at be because been
before being below between both but by can can't cannot could couldn't did didn't do does
doesn't doing don't down during each even ever every few for from further get got had hadn't
has hasn't have haven't having he he'd he'll he's her here here's hers herself him himself his
how how's i i'd i'll i'm i've if in into is isn't it it's its itself just let's like me might
more most much must mustn't my myself no nor not now of off oh ok okay on once one only or
other ought our ours ourselves out over own really same shan't she she'd she'll she's should
shouldn't so some such than that that's the their theirs them themselves then there there's
these they they'd they'll they're they've thing things this those though through to too
under until up upon us very was wasn't way we we'd we'll we're we've well were weren't what
what's when when's where where's which while who who's whom why why's will with won't would
wouldn't yeah yes yet you you'd you'll you're you've your yours yourself yourselves hey hi
hello thanks thank great good sure lot lots wow cool awesome glad know think going go gonna
want make made really still something anything everything maybe always never user assistant
""".split())

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’\-]*")
_NOT_WORD = re.compile(r"[^A-Za-z0-9'’\-]")
_SENT = re.compile(r"(?<=[.!?])\s+")
_LINE = re.compile(r"[^\n]+")
_ROLE = re.compile(r"\[[^\]\n]{1,64}\]:\s*")  # used with match(): at the start only
_SPACE = re.compile(r"\s*")


def role_end(text: str, pos: int = 0, endpos: Optional[int] = None) -> int:
    """Where the text starting at ``pos`` begins after a ``[role]: `` marker (``pos``
    when it has none)."""
    m = _ROLE.match(text, pos, len(text) if endpos is None else endpos)
    return m.end() if m else pos


def strip_role(line: str) -> str:
    """Drop a leading ``[role]: `` marker from a rendered message."""
    end = role_end(line)
    return line[end:] if end else line


def iter_words(text: str, chunk: int = 1 << 16, start: int = 0) -> Iterator[str]:
    """Lower-cased word tokens (apostrophes and hyphens kept inside words) of
    ``text[start:]``, read in pieces of about ``chunk`` characters cut between words:
    memory does not grow with the text."""
    n = len(text)
    while start < n:
        end = n
        if start + chunk < n:
            cut = _NOT_WORD.search(text, start + chunk)
            end = cut.start() if cut else n
        yield from [w.lower().replace("’", "'") for w in _WORD.findall(text, start, end)]
        start = end


def words(text: str) -> list[str]:
    """:func:`iter_words` as a list."""
    return list(iter_words(text))


def iter_sentences(text: str) -> Iterator[str]:
    """The sentences of rendered session text, without role markers, one at a time
    (lines are read in place: only the sentences are copied)."""
    caption = "The image Caption:"
    for line in _LINE.finditer(text):
        start, end = line.span()
        start = role_end(text, _SPACE.match(text, start, end).end(), end)
        if text.startswith(caption, start, end):
            start = _SPACE.match(text, start + len(caption), end).end()
        for cut in _SENT.finditer(text, start, end):
            s = text[start:cut.start()].strip()
            if s:
                yield s
            start = cut.end()
        s = text[start:end].strip()
        if s:
            yield s


def sentences(text: str) -> list[str]:
    """Split rendered session text into sentences, without role markers."""
    return list(iter_sentences(text))
