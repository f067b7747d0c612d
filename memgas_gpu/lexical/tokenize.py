"""Tokenizer for the lexical (BM25) signals: lowercase, regex split, stopwords, stemming.

The pipeline is the one of ``bm25s.tokenize`` so that scores can be checked against
``bm25s`` on the same tokens: ``text.lower()`` → ``re.findall(r"(?u)\\b\\w\\w+\\b")``
(words of two or more word characters) → drop stopwords (before stemming) → Snowball
stem (PyStemmer).  Every step is configurable.

Stopword lists: ``"en"`` (alias ``"english"``) is Lucene's 33-word English list, the
``bm25s`` default; ``"en_plus"`` the longer NLTK-style list (``bm25s``'s
``STOPWORDS_EN_PLUS``, 179 words with pronouns and auxiliaries); ``None`` keeps every
token; any iterable of strings is used as given.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence, Union

__all__ = ["Tokenizer", "STOPWORDS", "Vocabulary"]

_EN = ("a an and are as at be but by for if in into is it no not of on or such that the "
       "their then there these they this to was will with").split()
_EN_PLUS = (
    "a about above after again against ain all am an and any are aren aren't as at be "
    "because been before being below between both but by can couldn couldn't d did didn "
    "didn't do does doesn doesn't doing don don't down during each few for from further "
    "had hadn hadn't has hasn hasn't have haven haven't having he her here hers herself "
    "him himself his how i if in into is isn isn't it it's its itself just ll m ma me "
    "mightn mightn't more most mustn mustn't my myself needn needn't no nor not now o of "
    "off on once only or other our ours ourselves out over own re s same shan shan't she "
    "she's should should've shouldn shouldn't so some such t than that that'll the their "
    "theirs them themselves then there these they this those through to too under until "
    "up ve very was wasn wasn't we were weren weren't what when where which while who whom "
    "why will with won won't wouldn wouldn't y you you'd you'll you're you've your yours "
    "yourself yourselves").split()

#: named stopword lists
STOPWORDS = {"en": tuple(_EN), "english": tuple(_EN), "en_plus": tuple(_EN_PLUS)}


def _stemmer(name: Optional[str]):
    if name is None:
        return None
    try:
        import Stemmer  # PyStemmer
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(f"stemmer={name!r} needs PyStemmer: pip install PyStemmer "
                          "(or pass stemmer=None)") from None
    return Stemmer.Stemmer(name)


class Tokenizer:
    """Text → list of terms.

    Args:
        lower: lowercase first (default True).
        stopwords: ``"en"`` (default; Lucene's list, as ``bm25s``), ``"en_plus"``, a
            sequence of words, or ``None``.
        stemmer: a Snowball language for PyStemmer (default ``"english"``) or ``None``.
        token_pattern: the split regex (default ``r"(?u)\\b\\w\\w+\\b"``, as ``bm25s``).

    Example:
        >>> Tokenizer()("The cats were running!")
        ['cat', 'were', 'run']
    """

    def __init__(self, lower: bool = True, stopwords: Union[str, Sequence[str], None] = "en",
                 stemmer: Optional[str] = "english",
                 token_pattern: str = r"(?u)\b\w\w+\b") -> None:
        if isinstance(stopwords, str):
            if stopwords not in STOPWORDS:
                raise ValueError(f"unknown stopword list {stopwords!r}; choose from "
                                 f"{sorted(STOPWORDS)}, pass a list of words or None")
            self._stop_name: Union[str, list, None] = stopwords
            stop = STOPWORDS[stopwords]
        elif stopwords is None:
            self._stop_name, stop = None, ()
        else:
            stop = tuple(stopwords)
            self._stop_name = list(stop)
        self.lower = lower
        self.stopwords = frozenset(stop)
        self.stemmer_name = stemmer
        self.token_pattern = token_pattern
        self._split = re.compile(token_pattern).findall
        self._stem = _stemmer(stemmer)
        self._cache: dict[str, str] = {}

    def describe(self) -> dict:
        """JSON-able settings (stored in index manifests); :meth:`from_config` inverts it."""
        return {"lower": self.lower, "stopwords": self._stop_name,
                "stemmer": self.stemmer_name, "token_pattern": self.token_pattern}

    def __getstate__(self) -> dict:  # PyStemmer objects do not pickle (Ray, multiprocessing)
        return self.describe()

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @classmethod
    def from_config(cls, config: dict) -> "Tokenizer":
        return cls(**config)

    def _stem_all(self, words: list[str]) -> list[str]:
        if self._stem is None:
            return words
        cache = self._cache
        new = [w for w in dict.fromkeys(words) if w not in cache]
        if new:
            cache.update(zip(new, self._stem.stemWords(new)))
        return [cache[w] for w in words]

    def tokens(self, text: str) -> list[str]:
        """Terms of one text."""
        if self.lower:
            text = text.lower()
        stop = self.stopwords
        return self._stem_all([w for w in self._split(text) if w not in stop])

    def __call__(self, texts: Union[str, Iterable[str]]):
        """Terms of one text (``list[str]``) or of many (``list[list[str]]``)."""
        if isinstance(texts, str):
            return self.tokens(texts)
        return [self.tokens(t) for t in texts]


class Vocabulary:
    """Term ↔ id map that grows as documents are added."""

    def __init__(self, terms: Iterable[str] = ()) -> None:
        self.terms: list[str] = []
        self.ids: dict[str, int] = {}
        for t in terms:
            self.add(t)

    def __len__(self) -> int:
        return len(self.terms)

    def add(self, term: str) -> int:
        i = self.ids.get(term)
        if i is None:
            i = self.ids[term] = len(self.terms)
            self.terms.append(term)
        return i

    def encode(self, tokens: Sequence[str], grow: bool = True) -> list[int]:
        """Ids of ``tokens`` (unknown terms are added, or dropped when ``grow=False``)."""
        if grow:
            return [self.add(t) for t in tokens]
        ids = self.ids
        return [ids[t] for t in tokens if t in ids]
