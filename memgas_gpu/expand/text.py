"""Tokenisation helpers for the offline summary/keyword extractors."""
from __future__ import annotations

import re

__all__ = ["STOPWORDS", "words", "sentences", "strip_role"]

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
_SENT = re.compile(r"(?<=[.!?])\s+|\n+")
_ROLE = re.compile(r"^\[[^\]\n]{1,64}\]:\s*")


def strip_role(line: str) -> str:
    """Drop a leading ``[role]: `` marker from a rendered message."""
    return _ROLE.sub("", line)


def words(text: str) -> list[str]:
    """Lower-cased word tokens (apostrophes and hyphens kept inside words)."""
    return [w.lower().replace("’", "'") for w in _WORD.findall(text)]


def sentences(text: str) -> list[str]:
    """Split rendered session text into sentences, without role markers."""
    out = []
    for line in text.split("\n"):
        line = strip_role(line.strip())
        if line.startswith("The image Caption:"):
            line = line[len("The image Caption:"):].strip()
        out += [s.strip() for s in _SENT.split(line) if s and s.strip()]
    return out
