"""Odd but valid inputs that crashed or cost too much (round 3 of the hostile-input
issue): dates near year 1 (item 8) and one huge message through the offline
summary/keyword stage (item 17)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from datetime import date

import pytest

from memgas_gpu.retrieve.cues import question_interval

from _hostile import ROOT, build_small_index, run_cli

_EPOCH = date(1970, 1, 1)


def _days(d: date) -> float:
    return float((d - _EPOCH).days)


# ---- item 8: dates near year 1 ------------------------------------------------------------
@pytest.mark.parametrize("text", ["what did we do last year", "what happened 3 days ago",
                                  "and yesterday?", "last week", "in March", "on May 5th",
                                  "1 day ago", "99999999999 days ago", "on February 29"])
@pytest.mark.parametrize("when", ["question_date_year_1", "anchor_year_1",
                                  "question_date_9999"])
def test_time_expressions_near_the_ends_of_the_calendar(text, when):
    """An interval that would start before year 1 (or end after 9999) is no interval;
    a year-less date after a year-1 anchor has no year before it."""
    q = {"question_date_year_1": date(1, 1, 10), "question_date_9999": date(9999, 12, 31)}
    got = question_interval(text, anchor=date(1, 1, 10) if when == "anchor_year_1" else None,
                            question_date=q.get(when))
    if text == "what happened 3 days ago" and when == "question_date_year_1":
        # hand-computed: 3 days back with a slack of 2 days each side
        assert got == (_days(date(1, 1, 5)), _days(date(1, 1, 9)))
    if text in ("in March", "on May 5th") and when != "question_date_9999":
        assert got is None  # the anchor's year (1) would put it after the anchor
    if text == "what did we do last year" and when == "question_date_year_1":
        assert got is None


def test_search_and_retrieve_with_year_1_dates(tmp_path, locomo_list_path):
    """`memgas search --date 0001/01/01` and a year-1 dataset with memgas_hybrid
    overflowed (OverflowError / ValueError tracebacks)."""
    from memgas_gpu.retrieve import retrieve

    idx = build_small_index(locomo_list_path, tmp_path)
    meta = idx.conversations[0]
    meta.session_dates = [f"0001/01/0{i + 1}" for i in range(len(meta.session_dates))]
    out = idx.save(tmp_path / "idx")
    res = run_cli("search", out, "what did we do last year", "and in March?",
                  "--conversation", meta.id, "--date", "0001/01/01", "--device", "cpu")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert [ln for ln in res.stdout.splitlines() if ln.startswith("? ")] == [
        "? what did we do last year", "? and in March?"]
    r = retrieve(idx, method="memgas_hybrid", device="cpu")
    assert r.rankings.shape[0] == len(idx.questions)
    (hit,) = idx.search(meta.id, ["what happened in March"], method="memgas_hybrid",
                        device="cpu")
    assert sorted(hit.session_ids) == sorted(meta.session_ids)  # k=10: all six


# ---- item 17: one huge message through the offline summary/keyword stage --------------
# The reference: the extractor as first written, holding every word, sentence and phrase
# of a text (it cost 1.45 GB for one 20 MB message).  The streaming one must give the
# same texts.
_R_WORD = __import__("re").compile(r"[A-Za-z0-9][A-Za-z0-9'’\-]*")
_R_SENT = __import__("re").compile(r"(?<=[.!?])\s+|\n+")
_R_ROLE = __import__("re").compile(r"^\[[^\]\n]{1,64}\]:\s*")


def _ref_words(text):
    return [w.lower().replace("’", "'") for w in _R_WORD.findall(text)]


def _ref_sentences(text):
    out = []
    for line in text.split("\n"):
        line = _R_ROLE.sub("", line.strip())
        if line.startswith("The image Caption:"):
            line = line[len("The image Caption:"):].strip()
        out += [s.strip() for s in _R_SENT.split(line) if s and s.strip()]
    return out


def _ref_expand(texts, n_keywords=10, max_phrase_words=3, summary_words=60, max_df=0.5,
                min_sentence_words=6):
    from memgas_gpu.expand.text import STOPWORDS

    def content(ws):
        return [w for w in ws if w not in STOPWORDS and len(w) > 1 and not w.isdigit()]

    docs = [content(_ref_words(_R_ROLE.sub("", t))) for t in texts]
    df = Counter(w for d in docs for w in set(d))
    n = len(docs)
    cut = max_df * n if n >= 10 else float("inf")
    idf = {w: (math.log((1 + n) / (1 + c)) + 1.0) if c <= cut else 0.0 for w, c in df.items()}
    summaries, keywords = [], []
    for text, d in zip(texts, docs):
        weight = {w: (1.0 + math.log(c)) * idf.get(w, 1.0) for w, c in Counter(d).items()}
        scores = {}
        for sent in _ref_sentences(text):
            run = []
            for w in _ref_words(sent) + [""]:
                if w and w not in STOPWORDS and len(w) > 1 and not w.isdigit():
                    run.append(w)
                    continue
                for k in range(1, max_phrase_words + 1):
                    for i in range(len(run) - k + 1):
                        ph = run[i:i + k]
                        s = sum(weight.get(x, 0.0) for x in ph) / (1 + 0.5 * (k - 1))
                        if len(set(ph)) == k and s > 0.0:
                            scores[" ".join(ph)] = max(scores.get(" ".join(ph), 0.0), s)
                run = []
        chosen, covered = [], set()
        for ph, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0])):
            if set(ph.split()) <= covered:
                continue
            chosen.append(ph)
            covered |= set(ph.split())
            if len(chosen) == n_keywords:
                break
        keywords.append("; ".join(chosen))
        sents = _ref_sentences(text)
        scored = [(sum(weight.get(w, 0.0) for w in cw) / len(cw) ** 0.5, i)
                  for i, s in enumerate(sents) for cw in [content(_ref_words(s))]
                  if cw and len(s.split()) >= min_sentence_words]
        if sents and not scored:
            scored = [(0.0, max(range(len(sents)), key=lambda i: len(sents[i])))]
        keep, total = [], 0
        for _, i in sorted(scored, key=lambda x: (-x[0], x[1])):
            k = len(sents[i].split())
            if keep and total + k > summary_words:
                continue
            keep.append(i)
            total += k
            if total >= summary_words:
                break
        summaries.append("\n".join(sents[i] for i in sorted(keep)))
    return summaries, keywords


def _random_texts(rng, n):
    vocab = ("the a cat dog ran sat on mat big red fox jump over lazy and of to violin "
             "music play 42 it's K İ [user]: The image Caption: \n \r").split(" ")
    return [rng.choice(["", "[user]: ", " [a]:"]) + " ".join(
        " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 12)))
        + rng.choice([".", "!", "?", "", "\n"]) for _ in range(rng.randint(0, 40)))
        for _ in range(n)]


def test_the_streaming_extractor_gives_the_reference_texts(locomo_list_path, lme_sample_path):
    import random

    from memgas_gpu.data import load_dataset
    from memgas_gpu.expand.offline import OfflineExtractor

    texts = list(dict.fromkeys(s.text for p in (locomo_list_path, lme_sample_path)
                               for c in load_dataset(p) for s in c.sessions))
    assert OfflineExtractor().expand(texts) == _ref_expand(texts)
    rng = random.Random(5)
    for _ in range(150):  # small settings: the phrase and sentence bounds are reached
        kw = {"n_keywords": rng.randint(1, 4), "max_phrase_words": rng.randint(1, 3),
              "summary_words": rng.randint(3, 30), "min_sentence_words": rng.randint(1, 6)}
        batch = _random_texts(rng, rng.randint(1, 4))
        assert OfflineExtractor(**kw).expand(batch) == _ref_expand(batch, **kw), (kw, batch)
        assert OfflineExtractor(**kw).summaries(batch) == _ref_expand(batch, **kw)[0]


_TRACE = """
import sys, tracemalloc
from memgas_gpu.data import load_dataset
from memgas_gpu.expand.offline import OfflineExtractor
turns = [t for c in load_dataset(sys.argv[1]) for s in c.sessions for t in s.turns]
text = "\\n".join(turns * 20)[:1_000_000]  # one 1 MB message of real sentences
tracemalloc.start()
OfflineExtractor().expand([text, "A short session about violins."])
print(tracemalloc.get_traced_memory()[1])
"""


def test_one_huge_message_is_streamed_in_bounded_memory(locomo_list_path):
    """Python allocations while expanding a 1 MB message (the first writing held every
    word, sentence and phrase: about 24 MiB per MB of text)."""
    res = subprocess.run([sys.executable, "-c", _TRACE, str(locomo_list_path)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr[-2000:]
    peak = int(res.stdout.split()[-1])
    assert peak < 6 << 20, peak
