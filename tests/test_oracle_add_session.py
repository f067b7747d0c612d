"""``add_session`` against a rebuild, for every method, with a question whose terms first
appear in the added session.

The grown index is queried with every method *before* the session is added (so every
cached graph, dense, top-k and lexical, exists and must be refreshed), then compared with
an index built from scratch on all sessions.
"""
from __future__ import annotations

import numpy as np
import pytest

from memgas_gpu.retrieve import METHODS, MemoryIndex

from _standin import QUESTIONS, SESSIONS, StandInEncoder, small_dataset

pytest.importorskip("Stemmer")

#: "ate" and "gone" occur only in the last session, which is the one added
NEW_TERMS_QUESTION = "Who ate the starter, and is Doug gone?"
LEXICAL = ("bm25", "memgas_hybrid")
GRAPH_SETTINGS = [dict(fusion="ppr", graph=g) for g in ("dense", "lexical", "both")]


@pytest.fixture(scope="module")
def grown_and_rebuilt():
    questions = list(QUESTIONS) + [NEW_TERMS_QUESTION]
    enc = StandInEncoder(dim=8)
    n = len(SESSIONS)
    kw = dict(device="cpu", progress=False, skip_sessions=2)
    ds_small, summ, keyw = small_dataset(n - 1, questions)
    grown = MemoryIndex.build(ds_small, enc, summaries=summ, keywords=keyw, **kw)
    ds_full, _, _ = small_dataset(n, questions)
    rebuilt = MemoryIndex.build(ds_full, enc, summaries=summ, keywords=keyw, **kw)
    for method in METHODS:  # fill every cache of the grown index first
        grown.retrieve(method=method, device="cpu")
    for s in GRAPH_SETTINGS:
        grown.retrieve(method="memgas_hybrid", device="cpu", **s)
    new = ds_full[0].sessions[-1]
    tok = grown.snapshot().lexical.tokenizer
    seen = {t for s in ds_small[0].sessions for t in tok(s.text)}
    assert {"ate", "gone"} <= set(tok(NEW_TERMS_QUESTION)) - seen
    assert {"ate", "gone"} <= set(tok(new.text))
    grown.add_session(ds_full[0].id, new, summary=summ.texts[new.id], keywords=keyw.texts[new.id])
    return grown, rebuilt, len(questions) - 1


def _same(a, b):
    np.testing.assert_allclose(a.scores.numpy(), b.scores.numpy(), atol=1e-5, rtol=1e-5)
    assert a.rankings.tolist() == b.rankings.tolist()


@pytest.mark.parametrize("method", METHODS)
def test_add_session_equals_rebuild_every_method(grown_and_rebuilt, method):
    grown, rebuilt, new_q = grown_and_rebuilt
    a = grown.retrieve(method=method, device="cpu")
    b = rebuilt.retrieve(method=method, device="cpu")
    _same(a, b)
    # the question about the new session finds it first (BM25 does, from its new terms)
    if method in LEXICAL:
        assert int(a.rankings[new_q, 0]) == len(SESSIONS) - 1


@pytest.mark.parametrize("settings", [{}] + GRAPH_SETTINGS, ids=["sum", "dense", "lexical",
                                                                 "both"])
def test_add_session_refreshes_lexical_scores_and_graphs(grown_and_rebuilt, settings):
    """The questions whose terms were all known at build: BM25 statistics and the cached
    lexical graphs follow the new session."""
    grown, rebuilt, new_q = grown_and_rebuilt
    old = list(range(new_q))
    for method in LEXICAL:
        kw = settings if method == "memgas_hybrid" else {}
        _same(grown.retrieve(old, method=method, device="cpu", **kw),
              rebuilt.retrieve(old, method=method, device="cpu", **kw))
