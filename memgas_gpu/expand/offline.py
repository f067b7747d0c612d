"""Offline (no-LLM) summaries and keywords.

* Keywords — RAKE-style candidate phrases (maximal runs of non-stopwords, 1–3
  words) scored by the sum of their words' TF-IDF weights (sublinear tf,
  ``1 + log tf``), where document frequencies come from the whole corpus of
  sessions being expanded and words found in more than ``max_df`` of the sessions
  (speaker names, greetings) weigh nothing; the top
  ``n_keywords`` distinct phrases, best first, joined ``"a; b; c"`` (the format the
  paper's LLM prompt produces).
* Summary — extractive: sentences of at least ``min_sentence_words`` words scored
  by their content words' TF-IDF weight over the square root of their count (a
  centroid score, as in Radev et al.'s centroid summariser), the best sentences up
  to ``summary_words`` words kept in their original order, one per line.

Both are deterministic and need nothing beyond the standard library.

Long texts are streamed: words and sentences are read one at a time, and only the
candidates that can still make the result are kept (the phrases that can be examined
before ``n_keywords`` are chosen, and per sentence length the best few sentences that
can fit in ``summary_words``), so a session's memory grows with its distinct words, not
with its length, and the result is the one of scoring every candidate.
"""
from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from itertools import chain
from typing import Optional, Sequence

from ..progress import Progress
from .text import STOPWORDS, iter_sentences, iter_words, role_end

__all__ = ["OfflineExtractor"]

_TOKEN = re.compile(r"\S+")


def _counts(text: str) -> Counter:
    """Content-word counts of one session text."""
    return Counter(w for w in iter_words(text, start=role_end(text))
                   if w not in STOPWORDS and len(w) > 1 and not w.isdigit())


def _n_tokens(text: str) -> int:
    """``len(text.split())`` without the list."""
    return sum(1 for _ in _TOKEN.finditer(text))


class OfflineExtractor:
    """TF-IDF keyword phrases and centroid extractive summaries for many sessions.

    Args:
        n_keywords: keyword phrases per session (default 10).
        max_phrase_words: longest candidate phrase (default 3).
        summary_words: approximate summary length in words (default 60).
        max_df: words in more than this share of the sessions get no weight
            (applied when there are at least 10 sessions; default 0.5).
        min_sentence_words: shorter sentences are not picked (default 6).
    """

    name = "offline"

    def __init__(self, n_keywords: int = 10, max_phrase_words: int = 3,
                 summary_words: int = 60, max_df: float = 0.5,
                 min_sentence_words: int = 6) -> None:
        self.n_keywords = n_keywords
        self.max_phrase_words = max_phrase_words
        self.summary_words = summary_words
        self.max_df = max_df
        self.min_sentence_words = min_sentence_words

    def config(self) -> dict:
        return {"method": self.name, "n_keywords": self.n_keywords,
                "max_phrase_words": self.max_phrase_words,
                "summary_words": self.summary_words, "max_df": self.max_df,
                "min_sentence_words": self.min_sentence_words}

    # --- corpus statistics ----------------------------------------------------------
    def _idf(self, counts: Sequence[Counter]) -> dict[str, float]:
        df: Counter = Counter()
        for c in counts:
            df.update(c.keys())
        n = len(counts)
        cut = self.max_df * n if n >= 10 else float("inf")
        return {w: (math.log((1 + n) / (1 + c)) + 1.0) if c <= cut else 0.0
                for w, c in df.items()}

    def _weights(self, texts: Sequence[str]):
        """Each text's content-word weights (sublinear tf × corpus IDF), one at a time
        (each text's counts become its weights in place: one table per text)."""
        counts = [_counts(t) for t in texts]
        idf = self._idf(counts)
        for tf in counts:
            for w, c in tf.items():
                tf[w] = (1.0 + math.log(c)) * idf.get(w, 1.0)
            yield tf

    def expand(self, texts: Sequence[str], progress: Optional[bool] = None
               ) -> tuple[list[str], list[str]]:
        """Summaries and keywords for each session text (IDF over ``texts``);
        ``progress`` as in :mod:`memgas_gpu.progress`."""
        summaries, keywords = [], []
        with Progress(len(texts), "expand (offline)", unit="session",
                      enabled=progress) as bar:
            for text, weight in zip(texts, self._weights(texts)):
                summary, kw = self._extract(text, weight, keywords=True)
                summaries.append(summary)
                keywords.append(kw)
                bar.update()
        return summaries, keywords

    def summaries(self, texts: Sequence[str]) -> list[str]:
        """Only the summaries of :meth:`expand` (the same text; keywords not computed)."""
        return [self._extract(t, w, keywords=False)[0]
                for t, w in zip(texts, self._weights(texts))]

    def _extract(self, text: str, weight: dict[str, float], keywords: bool
                 ) -> tuple[str, str]:
        """(summary, keywords) of one text in one pass over its sentences."""
        phrases = _Phrases(self, weight) if keywords else None
        summary = _Summary(self)
        for sent in iter_sentences(text):
            ws = list(iter_words(sent)) if len(sent) < 1 << 16 else None
            summary.add(sent, weight, ws)
            if phrases is not None:
                phrases.add(sent if ws is None else ws)
        return summary.result(), phrases.result() if phrases is not None else ""



class _Phrases:
    """Keyword phrases (RAKE-style runs of content words, 1 to ``max_phrase_words``
    words) scored by their words' weights; only the best ``cap`` distinct phrases are
    kept, which are all the ones :meth:`result` can examine."""

    def __init__(self, ex: "OfflineExtractor", weight: dict[str, float]) -> None:
        self.n_keywords, self.longest = ex.n_keywords, ex.max_phrase_words
        # the chosen phrases, plus every phrase skipped because its words are covered,
        # i.e. made of the at most n_keywords * max_phrase_words chosen words
        covered = self.n_keywords * self.longest
        self.cap = self.n_keywords + sum(math.perm(covered, n)
                                         for n in range(1, self.longest + 1))
        self.weight = weight
        self.scores: dict[str, float] = {}

    @staticmethod
    def _rank(kv):
        return -kv[1], kv[0]  # best first, then by text

    def add(self, sent) -> None:
        """Score the phrases of one sentence (its text, or its words)."""
        wget, scores, longest = self.weight.get, self.scores, self.longest
        run: list[str] = []  # the last words of the current run of content words
        words = iter_words(sent) if isinstance(sent, str) else sent
        for w in chain(words, [""]):
            if not w or w in STOPWORDS or len(w) < 2 or w.isdigit():
                run = []
                continue
            run = run[1 - longest:] + [w] if longest > 1 else [w]
            for n in range(1, len(run) + 1):  # the phrases ending at this word
                ph = run[-n:]
                if n > 1 and len(set(ph)) < n:
                    continue
                s = sum(wget(x, 0.0) for x in ph) / (1 + 0.5 * (n - 1))
                if s > 0.0:
                    scores[" ".join(ph)] = s  # a phrase's score is the same everywhere
            if len(scores) > 4 * self.cap:  # keep the ones that can be examined
                self.scores = scores = dict(heapq.nsmallest(self.cap, scores.items(),
                                                            key=self._rank))

    def result(self) -> str:
        chosen: list[str] = []
        covered: set[str] = set()
        for ph, _ in sorted(self.scores.items(), key=self._rank):
            toks = set(ph.split())
            if toks <= covered:  # all its words already shown in better phrases
                continue
            chosen.append(ph)
            covered |= toks
            if len(chosen) == self.n_keywords:
                break
        return "; ".join(chosen)


class _Summary:
    """The best sentences, greedily, up to ``summary_words`` words, in text order.

    The first sentence kept is the best of all; after it, sentences of ``n`` words are
    kept best first while they fit, so at most ``summary_words // n`` of each length
    can be: only those candidates (and the longest sentence, the fallback when every
    sentence is short) are held."""

    def __init__(self, ex: "OfflineExtractor") -> None:
        self.limit, self.min_words = ex.summary_words, ex.min_sentence_words
        self.best = None  # (-score, index, sentence)
        self.by_len: dict[int, list] = {}  # n -> heap of (score, -index, sentence)
        self.longest = (-1, 0, "")  # (characters, -index, sentence)
        self.i = -1

    def add(self, sent: str, weight: dict[str, float], ws=None) -> None:
        self.i += 1
        i, limit = self.i, self.limit
        if len(sent) > self.longest[0]:
            self.longest = (len(sent), -i, sent)
        n = _n_tokens(sent)
        if n < self.min_words:
            return
        total, cnt = 0.0, 0
        for w in (iter_words(sent) if ws is None else ws):
            if w not in STOPWORDS and len(w) > 1 and not w.isdigit():
                total += weight.get(w, 0.0)
                cnt += 1
        if not cnt:
            return
        score = total / (cnt ** 0.5)
        if self.best is None or (-score, i) < self.best[:2]:
            self.best = (-score, i, sent)
        if n <= limit:
            heap = self.by_len.setdefault(n, [])
            item = (score, -i, sent)
            if len(heap) <= limit // n:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)

    def result(self) -> str:
        if self.i < 0:
            return ""
        if self.best is None:  # only short sentences: fall back to the longest one
            return self.longest[2]
        cands = {self.best[1]: (self.best[0], self.best[2])}
        for heap in self.by_len.values():
            cands.update({-mi: (-sc, s) for sc, mi, s in heap})
        keep, total = [], 0
        for i in sorted(cands, key=lambda j: (cands[j][0], j)):
            n = _n_tokens(cands[i][1])
            if keep and total + n > self.limit:
                continue
            keep.append(i)
            total += n
            if total >= self.limit:
                break
        return "\n".join(cands[i][1] for i in sorted(keep))
