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
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Optional, Sequence

from ..progress import Progress
from .text import STOPWORDS, sentences, strip_role, words

__all__ = ["OfflineExtractor"]


def _content(ws: list[str]) -> list[str]:
    return [w for w in ws if w not in STOPWORDS and len(w) > 1 and not w.isdigit()]


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
    def _idf(self, docs: Sequence[list[str]]) -> dict[str, float]:
        df: Counter = Counter()
        for d in docs:
            df.update(set(d))
        n = len(docs)
        cut = self.max_df * n if n >= 10 else float("inf")
        return {w: (math.log((1 + n) / (1 + c)) + 1.0) if c <= cut else 0.0
                for w, c in df.items()}

    def expand(self, texts: Sequence[str], progress: Optional[bool] = None
               ) -> tuple[list[str], list[str]]:
        """Summaries and keywords for each session text (IDF over ``texts``);
        ``progress`` as in :mod:`memgas_gpu.progress`."""
        tokenised = [words(strip_role(t)) for t in texts]
        idf = self._idf([_content(ws) for ws in tokenised])
        summaries, keywords = [], []
        with Progress(len(texts), "expand (offline)", unit="session",
                      enabled=progress) as bar:
            for text, ws in zip(texts, tokenised):
                tf = Counter(_content(ws))
                weight = {w: (1.0 + math.log(c)) * idf.get(w, 1.0) for w, c in tf.items()}
                keywords.append(self._keywords(text, weight))
                summaries.append(self._summary(text, weight))
                bar.update()
        return summaries, keywords

    def summaries(self, texts: Sequence[str]) -> list[str]:
        """Only the summaries of :meth:`expand` (the same text; keywords not computed)."""
        tokenised = [words(strip_role(t)) for t in texts]
        idf = self._idf([_content(ws) for ws in tokenised])
        out = []
        for text, ws in zip(texts, tokenised):
            tf = Counter(_content(ws))
            out.append(self._summary(text, {w: (1.0 + math.log(c)) * idf.get(w, 1.0)
                                            for w, c in tf.items()}))
        return out

    def _keywords(self, text: str, weight: dict[str, float]) -> str:
        scores: dict[str, float] = {}
        for sent in sentences(text):
            run: list[str] = []
            for w in words(sent) + [""]:
                if w and w not in STOPWORDS and len(w) > 1 and not w.isdigit():
                    run.append(w)
                    continue
                for n in range(1, self.max_phrase_words + 1):
                    for i in range(len(run) - n + 1):
                        ph = run[i:i + n]
                        if len(set(ph)) < n:
                            continue
                        s = sum(weight.get(x, 0.0) for x in ph) / (1 + 0.5 * (n - 1))
                        if s <= 0.0:
                            continue
                        key = " ".join(ph)
                        scores[key] = max(scores.get(key, 0.0), s)
                run = []
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        chosen: list[str] = []
        covered: set[str] = set()
        for ph, _ in ranked:
            toks = set(ph.split())
            if toks <= covered:  # all its words already shown in better phrases
                continue
            chosen.append(ph)
            covered |= toks
            if len(chosen) == self.n_keywords:
                break
        return "; ".join(chosen)

    def _summary(self, text: str, weight: dict[str, float]) -> str:
        sents = sentences(text)
        if not sents:
            return ""
        scored = []
        for i, s in enumerate(sents):
            cw = _content(words(s))
            if not cw or len(s.split()) < self.min_sentence_words:
                continue
            scored.append((sum(weight.get(w, 0.0) for w in cw) / (len(cw) ** 0.5), i))
        if not scored:  # only short sentences: fall back to the longest one
            scored = [(0.0, max(range(len(sents)), key=lambda i: len(sents[i])))]
        scored.sort(key=lambda x: (-x[0], x[1]))
        keep, total = [], 0
        for _, i in scored:
            n = len(sents[i].split())
            if keep and total + n > self.summary_words:
                continue
            keep.append(i)
            total += n
            if total >= self.summary_words:
                break
        return "\n".join(sents[i] for i in sorted(keep))
