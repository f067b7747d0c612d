"""Search filters, ``search_many`` and graphs built on demand, each against an oracle
that does not ask the code under test for the answer it checks.

* Filters (``after=``, ``before=``, ``metadata=``): the unfiltered ranking of the whole
  conversation (``k`` = its number of sessions), filtered here in plain Python from the
  dates and metadata this module wrote (days as ``datetime.date`` written by hand, not
  parsed by the library), cut at ``k``: same ids, same scores.
* ``search_many``: a property-based test (Hypothesis, derandomized and bounded) over
  mixed batches; every query of every request gets what a single search of its own
  conversation and question returns, with the number of sessions this module counts
  itself.  Every batch holds two requests of one method with different settings, and
  a third read with one of them under its own k, evidence, filter and question date;
  explicit examples pin those cases, list and unknown ids and repeated questions.
* ``no_gmm`` reads a top-k graph that the memory builds on demand for the
  conversations of a view: per conversation, the edges equal those of a fresh build of
  that conversation alone, and a ``no_gmm`` search over several conversations ranks as
  each one's fresh build does.

Curated mutations these tests kill: ``tools/mutations_search.toml``.
"""
from __future__ import annotations

import random
from dataclasses import replace
from datetime import date

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("Stemmer")

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from memgas_gpu import Conversation, Dataset, Session  # noqa: E402
from memgas_gpu.granularity import N_GRAN  # noqa: E402
from memgas_gpu.retrieve import MemoryIndex  # noqa: E402
from memgas_gpu.retrieve.search import SearchRequest  # noqa: E402


# ---------------------------------------------------------------- the sessions
SPEAKERS = ["Ana", "Ben", "Clara"]
THINGS = {
    "pets": ["the puppy Rex", "the dog park", "a visit to the vet", "the cat Milo"],
    "music": ["the violin recital", "a piano lesson", "the jazz concert", "choir practice"],
    "food": ["sourdough bread", "a lemon cake", "pasta night", "the farmers market"],
    "outdoors": ["the Mount Tam hike", "the garden roses", "a walk on the beach",
                 "a long bike ride"],
}
TEMPLATES = ["I keep thinking about {x} from {when}.", "Did you hear about {x}?",
             "We planned {x} with my sister for {when}.", "{x} was the best part of {when}.",
             "Remind me to write about {x} before {when}.", "Honestly {x} made my week."]
WHENS = ["last Saturday", "the weekend", "early June", "the holidays", "next Friday"]

#: (date as written, its day as the user means it; None: no readable date).  The
#: filters below are after = 2023-06-01 and before = 2023-07-07: their own days appear
#: in several formats (with a time of day too), as do the days just outside them.
ADDED_DATES = [
    ("2023-05-31", date(2023, 5, 31)),
    ("2023-06-01", date(2023, 6, 1)),
    ("1:56 pm on 7 July, 2023", date(2023, 7, 7)),
    ("2023/06/15 (Thu) 02:21", date(2023, 6, 15)),
    ("10:15 am on 1 June, 2023", date(2023, 6, 1)),
    ("2023-07-08", date(2023, 7, 8)),
    ("", None),
    ("7 July, 2023", date(2023, 7, 7)),
    ("8 May, 2023", date(2023, 5, 8)),
    ("11:59 pm on 6 July, 2023", date(2023, 7, 6)),
    ("11:30 pm on 31 May, 2023", date(2023, 5, 31)),
]
#: dates of the sessions a dataset build holds first (a dataset may carry dates no
#: parser reads; ``add_session`` refuses those)
BUILT_DATES = [
    ("sometime in spring", None),
    ("2023-06-20", date(2023, 6, 20)),
    ("n/a", None),
    ("1 June, 2023", date(2023, 6, 1)),
]
#: metadata cycle of the added sessions: some hold one pair of a filter and not the
#: other, one holds a None value, one nothing
METADATA = [
    {"src": "chat", "topic": "pets", "n": 1},
    {"src": "chat", "topic": "music"},
    {"src": "mail", "topic": "pets", "n": 2},
    {"src": "chat"},
    {},
    {"src": None, "topic": "pets"},
    {"src": "chat", "topic": "pets", "n": 2},
]
CONVERSATIONS = {"u1": 18, "u2": 16, "u3": 15}  # sessions each (>= 15)
UNKNOWN = ["ghost", "u9"]

QUESTIONS = ["What did Ana say about the puppy Rex?", "When is the violin recital?",
             "What did Clara bake in June 2023?", "Where did Ben go for the hike?",
             "What happened at the farmers market last week?",
             "Which lesson did I book on 7 July, 2023?",
             "What did Ben say about the dog park yesterday?"]


class _Texts:
    """An expansion source giving each session the summary / keywords written for it."""

    def __init__(self, kind: str, texts: dict) -> None:
        self.name = f"oracle-{kind}"
        self._by = {sid: t[0 if kind == "summary" else 1] for sid, t in texts.items()}

    def config(self) -> dict:
        return {}

    def generate(self, kind, sessions, conversations):
        return [self._by[s.id] for s in sessions]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """A tiny model's many small products run fastest on one thread (several threads
    on a shared machine spend their time waiting for each other); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def encoder(tiny_enc):
    """The test session's tiny random BERT (conftest)."""
    return tiny_enc


#: scores equal up to the float rounding of another batch or view
TOL = 1e-5


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= TOL * max(1.0, abs(y))


def same_ranking(a_ids, a_scores, b_ids, b_scores, what: str) -> None:
    """Two rankings are the same up to float rounding: the same number of sessions, the
    same scores position by position, and the same ids except where two sessions'
    scores tie within rounding (or at the last place, where the tie may be with the
    first session left out)."""
    assert len(a_ids) == len(b_ids), f"{what}: {a_ids} vs {b_ids}"
    for i, (x, y) in enumerate(zip(a_scores, b_scores)):
        assert _close(x, y), f"{what}: score {i}: {x} vs {y} ({a_ids} vs {b_ids})"
    for i, (s, t) in enumerate(zip(a_ids, b_ids)):
        if s != t:
            tied = [j for j in (i - 1, i + 1)
                    if 0 <= j < len(b_ids) and _close(b_scores[j], b_scores[i])]
            assert tied or i == len(b_ids) - 1, f"{what}: {a_ids} vs {b_ids}"


def make_session(rng: random.Random, sid: str, when: str) -> tuple:
    """A session of 2-4 turns, its summary and keywords (distinct texts per session)."""
    topic = rng.choice(sorted(THINGS))
    things = rng.sample(THINGS[topic], 2)
    turns = []
    for t in range(rng.randint(2, 4)):
        who = SPEAKERS[(t + rng.randrange(3)) % 3]
        text = rng.choice(TEMPLATES).format(x=things[t % 2], when=rng.choice(WHENS))
        turns.append(f"[{who}]: {text[0].upper()}{text[1:]}")
    turns[0] += f" (note {sid})"
    summary = f"{SPEAKERS[rng.randrange(3)]} talked about {things[0]} and {things[1]}."
    keywords = f"{topic}; {things[0]}; {things[1]}"
    return Session(sid, when, tuple(turns)), summary, keywords


@pytest.fixture(scope="module")
def filtered_memory(encoder):
    return make_filtered_memory(encoder)


def make_filtered_memory(enc):
    """Three conversations of 15-18 sessions: the first four of each from a dataset
    build (two without a readable date, no metadata), the rest added one by one with
    dates and metadata.  Returns the memory, the encoder, and per conversation the
    sessions as this module wrote them: ``[(id, day or None, metadata)]``."""
    rng = random.Random(7)
    table: dict = {}
    built, added, texts = [], [], {}
    for ci, (cid, n) in enumerate(CONVERSATIONS.items()):
        rows, first = [], []
        for j in range(n):
            sid = f"{cid}-s{j:02d}"
            if j < len(BUILT_DATES):
                written, day = BUILT_DATES[(j + ci) % len(BUILT_DATES)]
                meta = {}
            else:
                written, day = ADDED_DATES[(j + 3 * ci) % len(ADDED_DATES)]
                meta = METADATA[(j + ci) % len(METADATA)]
            s, u, kw = make_session(rng, sid, written)
            texts[sid] = (u, kw)
            rows.append((sid, day, dict(meta)))
            if j < len(BUILT_DATES):
                first.append(s)
            else:
                added.append((cid, s, u, kw, meta))
        built.append(Conversation(cid, first))
        table[cid] = rows
    mem = MemoryIndex.build(Dataset(built), enc, summaries=_Texts("summary", texts),
                            keywords=_Texts("keywords", texts), device="cpu",
                            progress=False)
    for cid, s, u, kw, meta in added:
        mem.add_session(cid, s, encoder=enc, summary=u, keywords=kw,
                        metadata=meta or None)
    assert [[s["id"] for s in mem.sessions(c)] for c in table] == \
        [[sid for sid, _, _ in rows] for rows in table.values()]
    return mem, enc, table


# ---------------------------------------------------------------- the filter oracle
def _wanted(rows, after=None, before=None, metadata=None) -> set:
    """The session ids a filter keeps, decided here from what this module wrote."""
    out = set()
    for sid, day, meta in rows:
        if (after is not None or before is not None) and day is None:
            continue
        if after is not None and day < after:
            continue
        if before is not None and day > before:
            continue
        if metadata and not all(k in meta and meta[k] == v for k, v in metadata.items()):
            continue
        out.add(sid)
    return out


#: (the filter as search takes it, the same filter as this module means it)
FILTERS = [
    (dict(after="2023-06-01"), dict(after=date(2023, 6, 1))),
    (dict(before="7 July, 2023"), dict(before=date(2023, 7, 7))),
    (dict(after="June 1, 2023", before="2023-07-07"),
     dict(after=date(2023, 6, 1), before=date(2023, 7, 7))),
    (dict(after="2023-07-07", before="2023-07-07"),
     dict(after=date(2023, 7, 7), before=date(2023, 7, 7))),
    (dict(metadata={"src": "chat", "topic": "pets"}),
     dict(metadata={"src": "chat", "topic": "pets"})),
    (dict(metadata={"src": "chat", "n": 2}), dict(metadata={"src": "chat", "n": 2})),
    (dict(metadata={"src": None}), dict(metadata={"src": None})),
    (dict(after="2023-06-01", metadata={"topic": "pets", "src": "chat"}),
     dict(after=date(2023, 6, 1), metadata={"topic": "pets", "src": "chat"})),
]


def _whole_ranking(mem, enc, cid, queries, method, n):
    got = mem.search(cid, queries, k=n, method=method, evidence=0, encoder=enc,
                     device="cpu")
    for r in got:  # the whole conversation, each session once
        assert len(r.session_ids) == n and len(set(r.session_ids)) == n
    return got


@pytest.mark.parametrize("method", [None, "memgas", "bm25"])
def test_filters_equal_a_brute_force_filter_of_the_whole_ranking(filtered_memory, method):
    """``after`` / ``before`` keep their own day (whatever the time of day or the date's
    format), sessions without a readable date are left out when either is given,
    ``metadata`` keeps only sessions holding every pair (a key with None is held only
    by a session that has the key), the filter comes before the top-k cut, and the
    scores are those of the unfiltered ranking."""
    mem, enc, table = filtered_memory
    cut = 0  # rankings where the top k hold sessions the filter drops, and more match
    for cid, rows in table.items():
        n = len(rows)
        whole = _whole_ranking(mem, enc, cid, QUESTIONS, method, n)
        for given_filter, meant in FILTERS:
            keep = _wanted(rows, **meant)
            assert keep and len(keep) < n, (cid, meant)  # each filter drops some
            for k in (3, n):  # fewer than the sessions the filter keeps; all of them
                got = mem.search(cid, QUESTIONS, k=k, method=method, evidence=0,
                                 encoder=enc, device="cpu", **given_filter)
                for q, a, w in zip(QUESTIONS, got, whole):
                    pairs = [(s, x) for s, x in zip(w.session_ids, w.scores) if s in keep][:k]
                    cut += len(keep) > k and not set(w.session_ids[:k]) <= keep
                    what = f"{cid} {method} {given_filter} k={k} {q!r}"
                    assert len(a.session_ids) == min(k, len(keep)), what
                    assert set(a.session_ids) <= keep, what
                    same_ranking(a.session_ids, a.scores, [s for s, _ in pairs],
                                 [x for _, x in pairs], what)
    assert cut >= 10, "too few rankings where filtering after the top-k cut would differ"


def test_filters_hold_for_each_query_of_several_conversations(filtered_memory):
    """One search over a list of conversation ids: each query's filter reads its own
    conversation's dates and metadata."""
    mem, enc, table = filtered_memory
    cids = ["u3", "u1", "u2", "u1", "u3"]
    qs = [QUESTIONS[i % len(QUESTIONS)] for i in range(len(cids))]
    wholes = {c: {r_q: r for r_q, r in zip(QUESTIONS, _whole_ranking(
        mem, enc, c, QUESTIONS, None, len(table[c])))} for c in set(cids)}
    for given_filter, meant in FILTERS:
        got = mem.search(cids, qs, k=3, evidence=0, encoder=enc, device="cpu",
                         **given_filter)
        for c, q, a in zip(cids, qs, got):
            keep = _wanted(table[c], **meant)
            w = wholes[c][q]
            pairs = [(s, x) for s, x in zip(w.session_ids, w.scores) if s in keep][:3]
            assert a.conversation_id == c
            assert set(a.session_ids) <= keep, (c, q, given_filter)
            same_ranking(a.session_ids, a.scores, [s for s, _ in pairs],
                         [x for _, x in pairs], f"{c} {q!r} {given_filter}")


# ---------------------------------------------------------------- search_many
#: per method, settings that change its scores (None: the default method)
METHOD_SETTINGS = {
    None: [{}, {"temperature": 0.3}, {"time_beta": 0.0, "speaker_gamma": 0.0}],
    "memgas_hybrid": [{}, {"temperature": 0.3}, {"speaker_gamma": 3.0}],
    "memgas": [{"damping": 0.1}, {"damping": 0.3}, {"alpha": 3}],
    "no_gmm": [{}, {"damping": 0.5}],
    "bm25": [{}, {"k1": 0.5}, {"b": 0.2}],
    "session": [{}, {"norm": "z"}],
}
#: (the filter as a request takes it, the same filter as this module means it)
REQUEST_FILTERS = [
    ({}, {}),
    ({"after": "2023-06-01"}, dict(after=date(2023, 6, 1))),
    ({"before": "2023-07-07"}, dict(before=date(2023, 7, 7))),
    ({"after": "2023-06-01", "before": "7 July, 2023"},
     dict(after=date(2023, 6, 1), before=date(2023, 7, 7))),
    ({"metadata": {"src": "chat", "topic": "pets"}},
     dict(metadata={"src": "chat", "topic": "pets"})),
    ({"metadata": {"src": None}}, dict(metadata={"src": None})),
]
IDS = [*CONVERSATIONS, *UNKNOWN]


@st.composite
def _request(draw, method=None, settings_=None):
    """A request and what its filter means: ``(SearchRequest, meant)``."""
    if settings_ is None:
        method = draw(st.sampled_from(list(METHOD_SETTINGS)))
        settings_ = draw(st.sampled_from(METHOD_SETTINGS[method]))
    n = draw(st.integers(1, 3))
    queries = draw(st.lists(st.sampled_from(QUESTIONS), min_size=n, max_size=n))
    if draw(st.booleans()):
        cid = draw(st.sampled_from(IDS))
    else:
        cid = draw(st.lists(st.sampled_from(IDS), min_size=n, max_size=n))
    given_filter, meant = draw(st.sampled_from(REQUEST_FILTERS))
    r = SearchRequest(cid, queries, k=draw(st.integers(1, 20)), method=method,
                      evidence=draw(st.integers(0, 2)),
                      question_date=draw(st.sampled_from([None, "2023-07-20"])),
                      settings=dict(settings_), **given_filter)
    return r, meant


@st.composite
def _batch(draw):
    """Random requests; two of one method with different settings, and a third with
    the method and settings of one of them (read together, each with its own k,
    evidence, filter, question date); in any order."""
    method = draw(st.sampled_from(list(METHOD_SETTINGS)))
    s1, s2 = draw(st.permutations(METHOD_SETTINGS[method]))[:2]
    reqs = draw(st.lists(_request(), min_size=0, max_size=3))
    reqs += [draw(_request(method, s1)), draw(_request(method, s2)),
             draw(_request(method, s1))]
    return draw(st.permutations(reqs))


def _pinned(r: SearchRequest):
    """A request of an explicit example, with what its filter means."""
    f = {"after": r.after, "before": r.before, "metadata": r.metadata}
    for given_filter, meant in REQUEST_FILTERS:
        if {**{"after": None, "before": None, "metadata": None}, **given_filter} == f:
            return r, meant
    raise AssertionError(f"not one of REQUEST_FILTERS: {f}")


LAST_WEEK = "What happened at the farmers market last week?"


@pytest.fixture(scope="module")
def single_searches() -> dict:
    """The oracle's answers, by arguments (the memory is never written)."""
    return {}


def _single(memo, mem, enc, r, c, queries):
    """The oracle: one search of conversation ``c`` alone (a string id) for the
    request's queries asked of it, with the request's other arguments."""
    key = (c, tuple(queries), r.k, r.method, r.evidence, r.question_date, r.after,
           r.before, repr(r.metadata), repr(sorted(r.settings.items())))
    if key not in memo:
        memo[key] = dict(zip(queries, mem.search(
            c, list(queries), k=r.k, method=r.method, evidence=r.evidence,
            question_date=r.question_date, after=r.after, before=r.before,
            metadata=r.metadata, encoder=enc, device="cpu", **r.settings)))
    return memo[key]


@settings(derandomize=True, max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=_batch())
# explicit batches: one method under two settings; one read-path call for requests of
# other question dates, k, evidence and filters; list ids, unknown ids, repeats
@example(batch=[_pinned(SearchRequest("u1", [LAST_WEEK], k=5, method="memgas",
                                      settings={"damping": 0.1})),
                _pinned(SearchRequest("u1", [LAST_WEEK], k=5, method="memgas",
                                      settings={"damping": 0.3}))])
@example(batch=[_pinned(SearchRequest("u2", [LAST_WEEK, QUESTIONS[0]], k=4, evidence=0)),
                _pinned(SearchRequest(["u1", "u2"], [LAST_WEEK, LAST_WEEK], k=7,
                                      question_date="2023-07-20", after="2023-06-01")),
                _pinned(SearchRequest("u3", [QUESTIONS[1], LAST_WEEK], k=2, evidence=1,
                                      question_date="2023-07-20",
                                      metadata={"src": "chat", "topic": "pets"}))])
@example(batch=[_pinned(SearchRequest(["u3", "ghost", "u1"], QUESTIONS[2:5], k=3,
                                      method="bm25")),
                _pinned(SearchRequest(["u2", "u2", "u9"], QUESTIONS[4:1:-1], k=20,
                                      method="bm25", before="2023-07-07"))])
def test_search_many_answers_every_request_as_single_searches(filtered_memory,
                                                              single_searches, batch):
    """Each query of each request of a mixed batch (methods, settings, k, evidence,
    filters, question dates, string and list ids, unknown ids, repeated questions) gets
    what a search of its own conversation alone returns for it, and as many sessions
    as its filter keeps (counted here) up to its k."""
    mem, enc, table = filtered_memory
    reqs = [r for r, _ in batch]
    got = mem.search_many(reqs, encoder=enc, device="cpu")
    assert len(got) == len(reqs)
    for (r, meant), answers in zip(batch, got):
        cids = [r.conversation_id] * len(r.queries) if isinstance(r.conversation_id, str) \
            else list(r.conversation_id)
        assert len(answers) == len(r.queries)
        for c, q, a in zip(cids, r.queries, answers):
            what = f"{c} {q!r} {r.method} {r.settings} k={r.k} {meant}"
            assert a.conversation_id == c, what
            want = len(_wanted(table[c], **meant)) if c in table else 0
            assert len(a.session_ids) == min(r.k, want), what
            b = _single(single_searches, mem, enc, r, c, dict.fromkeys(
                qq for cc, qq in zip(cids, r.queries) if cc == c))[q]
            same_ranking(a.session_ids, a.scores, b.session_ids, b.scores, what)
            assert all(len(ev) <= r.evidence for ev in a.evidence), what
            ev_b = dict(zip(b.session_ids, b.evidence))
            for sid, ev in zip(a.session_ids, a.evidence):
                if sid in ev_b:
                    assert [t for t, _, _ in ev] == [t for t, _, _ in ev_b[sid]], what


# ---------------------------------------------------------------- graphs built on demand
#: a, b and d of one size: a graph of the wrong conversation fits and must be noticed
#: by its edges, not by an index error
GRAPH_CONVERSATIONS = {"a": 10, "b": 10, "c": 8, "d": 10, "e": 9}


def _edges(indptr, indices, lo: int, hi: int) -> set:
    """The edges of the CSR rows [lo, hi), numbered from lo."""
    out = set()
    for r in range(lo, hi):
        for c in indices[int(indptr[r]):int(indptr[r + 1])].tolist():
            assert lo <= c < hi, f"edge {r} -> {c} leaves its conversation"
            out.add((r - lo, c - lo))
    return out


@pytest.fixture(scope="module")
def graph_memories(encoder):
    """A memory of five conversations built together (it holds the GMM graph only), and
    a fresh build of each conversation alone with the same sessions and texts."""
    rng = random.Random(11)
    convs, texts = {}, {}
    for cid, n in GRAPH_CONVERSATIONS.items():
        made = [make_session(rng, f"{cid}{j}", ADDED_DATES[j % len(ADDED_DATES)][0])
                for j in range(n)]
        convs[cid] = [s for s, _, _ in made]
        texts.update({s.id: (u, kw) for s, u, kw in made})

    def build(cids):
        return MemoryIndex.build(Dataset([Conversation(c, convs[c]) for c in cids]),
                                 encoder, summaries=_Texts("summary", texts),
                                 keywords=_Texts("keywords", texts), device="cpu",
                                 progress=False)

    mem = build(list(convs))
    assert "topk5" not in mem.graph_keys_of(mem.state())
    return mem, encoder, {c: build([c]) for c in convs}


def _check_view_graph(mem, refs, cids, topk):
    """Each conversation's block of the view's top-k graph against its fresh build's."""
    view = mem.view(cids)
    ip, ix = view.graph(replace(mem.params, rule="topk", topk=topk), device="cpu")
    lo = 0
    for cid in sorted(cids, key=list(GRAPH_CONVERSATIONS).index):  # index order
        ref = refs[cid]
        n = GRAPH_CONVERSATIONS[cid] * N_GRAN
        rip, rix = ref.view().graph(replace(ref.params, rule="topk", topk=topk),
                                    device="cpu")
        want = _edges(rip, rix, 0, n)
        assert want, f"{cid}: the fresh build's top-{topk} graph has no edges"
        assert _edges(ip, ix, lo, lo + n) == want, f"{cid}'s top-{topk} graph in view {cids}"
        lo += n
    assert int(ip.numel()) == lo + 1


def test_a_missing_graph_is_built_from_the_conversations_of_the_view(graph_memories):
    """``no_gmm`` over conversations b and d (neither first in the memory) builds their
    top-5 graph; later searches over e, a, b and c, d, e build it for the conversations
    still missing it (a, e, then c) next to those that hold it.  Each conversation's
    edges equal those of its fresh build alone, and ``no_gmm`` ranks as the fresh
    builds do."""
    mem, enc, refs = graph_memories
    qs = QUESTIONS[:3]
    for cids in (["b", "d"], ["e", "a", "b"], ["c", "d", "e"]):
        ids = [c for c in cids for _ in qs]
        got = mem.search(ids, qs * len(cids), k=6, method="no_gmm", evidence=0,
                         encoder=enc, device="cpu")
        for i, c in enumerate(cids):
            want = refs[c].search(c, qs, k=6, method="no_gmm", evidence=0, encoder=enc,
                                  device="cpu")
            for q, a, b in zip(qs, got[i * len(qs):(i + 1) * len(qs)], want):
                same_ranking(a.session_ids, a.scores, b.session_ids, b.scores,
                             f"no_gmm over {cids}: {c} {q!r}")
        _check_view_graph(mem, refs, cids, 5)
    _check_view_graph(mem, refs, ["d", "a"], 3)  # another setting, from a plain view
