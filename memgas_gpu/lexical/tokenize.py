"""Tokenizer for the lexical (BM25) signals: lowercase, regex split, stopwords, stemming.

The pipeline is the one of ``bm25s.tokenize`` so that scores can be checked against
``bm25s`` on the same tokens: ``text.lower()`` → ``re.findall(r"(?u)\\b\\w\\w+\\b")``
(words of two or more word characters) → drop stopwords (before stemming) → Snowball
stem (PyStemmer).  Every step is configurable.

Stopword lists: ``"en"`` (alias ``"english"``) is Lucene's 33-word English list, the
``bm25s`` default; ``"en_plus"`` the longer NLTK-style list (``bm25s``'s
``STOPWORDS_EN_PLUS``, 179 words with pronouns and auxiliaries); ``None`` keeps every
token; any iterable of strings is used as given.

Token patterns are known by name: an index manifest records the tokenizer's settings
(:meth:`Tokenizer.describe`, the pattern's text, which every release reads the same),
and :meth:`Tokenizer.from_config` accepts only a pattern of :data:`TOKEN_PATTERNS` (its
name, or exactly its text), so a tampered manifest cannot make every query run a
regular expression of its choosing.  A custom pattern is registered by name with
:func:`register_token_pattern`; indexes built with it then reopen.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence, Union

__all__ = ["Tokenizer", "STOPWORDS", "TOKEN_PATTERNS", "Vocabulary", "register_token_pattern"]

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

#: named token patterns (the split regex of :class:`Tokenizer`); ``"word2"``: words of
#: two or more word characters, as ``bm25s`` and scikit-learn split
TOKEN_PATTERNS = {"word2": r"(?u)\b\w\w+\b"}
_CONFIG_KEYS = ("lower", "stopwords", "stemmer", "token_pattern")
#: most stopwords a stored configuration may list
_MAX_STOPWORDS = 100_000


def register_token_pattern(name: str, pattern: str) -> None:
    """Make ``pattern`` (a regular expression) known as ``name``: tokenizers using it
    record the name, and indexes that record it (or the pattern's text) reopen.

    Raises:
        ValueError: ``name`` is taken by another pattern, or ``pattern`` does not compile.
    """
    if not isinstance(name, str) or not name or not isinstance(pattern, str):
        raise ValueError("register_token_pattern(name, pattern) takes two strings")
    if TOKEN_PATTERNS.get(name, pattern) != pattern:
        raise ValueError(f"token pattern name {name!r} is taken by {TOKEN_PATTERNS[name]!r}")
    re.compile(pattern)
    TOKEN_PATTERNS[name] = pattern


def _pattern_name(pattern: str) -> Optional[str]:
    if pattern in TOKEN_PATTERNS:
        return pattern
    return next((n for n, p in TOKEN_PATTERNS.items() if p == pattern), None)


def _stemmers() -> tuple:
    try:
        import Stemmer
    except ImportError:  # pragma: no cover - depends on the environment
        return ()
    return tuple(Stemmer.algorithms())


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
        token_pattern: a name of :data:`TOKEN_PATTERNS` (default ``"word2"``:
            ``r"(?u)\\b\\w\\w+\\b"``, as ``bm25s``) or a regex (an index built with an
            unregistered one reopens only after :func:`register_token_pattern`).

    Example:
        >>> Tokenizer()("The cats were running!")
        ['cat', 'were', 'run']
    """

    def __init__(self, lower: bool = True, stopwords: Union[str, Sequence[str], None] = "en",
                 stemmer: Optional[str] = "english",
                 token_pattern: str = "word2") -> None:
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
        #: the split regex (a name of :data:`TOKEN_PATTERNS` is resolved)
        self.token_pattern = TOKEN_PATTERNS.get(token_pattern, token_pattern)
        self._split = re.compile(self.token_pattern).findall
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

    @staticmethod
    def check_config(config) -> None:
        """Refuse stored settings this package would not write: unknown keys, a
        token pattern that is not registered, an unknown stopword list or stemmer.

        Raises:
            ValueError: ``"FIELD: what is wrong"``, one line.
        """
        if not isinstance(config, dict):
            raise ValueError(f"(tokenizer): expected an object, got {type(config).__name__}")
        for k in config:
            if k not in _CONFIG_KEYS:
                raise ValueError(f"{k}: unknown setting (known: {', '.join(_CONFIG_KEYS)})")
        lower, stop = config.get("lower", True), config.get("stopwords", "en")
        stem, pattern = config.get("stemmer", "english"), config.get("token_pattern", "word2")
        if not isinstance(lower, bool):
            raise ValueError(f"lower: expected true or false, got {type(lower).__name__}")
        if isinstance(stop, str):
            if stop not in STOPWORDS:
                raise ValueError(f"stopwords: unknown list {stop[:40]!r} (known: "
                                 f"{', '.join(STOPWORDS)})")
        elif stop is not None and not (isinstance(stop, list) and len(stop) <= _MAX_STOPWORDS
                                       and all(isinstance(w, str) for w in stop)):
            raise ValueError("stopwords: expected a list name, a list of at most "
                             f"{_MAX_STOPWORDS} strings or null")
        if stem is not None and (not isinstance(stem, str) or stem not in _stemmers()):
            raise ValueError(f"stemmer: {str(stem)[:40]!r} is not a Snowball stemmer of "
                             "PyStemmer (or PyStemmer is missing)")
        if not isinstance(pattern, str) or _pattern_name(pattern) is None:
            raise ValueError(f"token_pattern: {str(pattern)[:60]!r} is not a known token "
                             f"pattern (known: {', '.join(TOKEN_PATTERNS)}); an index built "
                             "with a custom one needs register_token_pattern(name, pattern)")

    @classmethod
    def from_config(cls, config: dict) -> "Tokenizer":
        """The tokenizer of stored settings (:meth:`describe`), after
        :meth:`check_config`: never a regular expression the settings bring along."""
        cls.check_config(config)
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

    def truncate(self, n: int) -> None:
        """Forget the terms added after the first ``n`` (a write that failed; readers
        of earlier snapshots never look past their own size)."""
        for t in self.terms[n:]:
            del self.ids[t]
        del self.terms[n:]

    def encode(self, tokens: Sequence[str], grow: bool = True) -> list[int]:
        """Ids of ``tokens`` (unknown terms are added, or dropped when ``grow=False``)."""
        if grow:
            return [self.add(t) for t in tokens]
        ids = self.ids
        return [ids[t] for t in tokens if t in ids]
