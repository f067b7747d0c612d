"""Shared pieces of the serving tests: a small memory of several conversations, a mix
of searches (methods, k, filters, unknown conversations, several questions), the
comparison of served answers with direct ``MemoryIndex.search`` (the oracle), and a
uvicorn server in a thread."""
from __future__ import annotations

import contextlib
import socket
import threading
import time

from memgas_gpu import Session

#: conversation id → [(session id, date, messages, metadata)]
TOPICS = [
    ("I adopted a puppy named Rex in May.", "Rex sounds adorable, what breed is he?"),
    ("Violin lessons with Mrs. Alvarez start next week.", "Practise a little every day."),
    ("My sister Clara visits from Lisbon in June.", "Show her the botanical garden!"),
    ("We hiked Mount Tam on Saturday morning.", "Was the trail muddy after the rain?"),
    ("Clara taught me to bake sourdough bread.", "Share a loaf with me sometime!"),
    ("The violin recital is on 7 July, 2023.", "I will bring flowers for Mrs. Alvarez."),
    ("My budget for the trip to Japan is tight.", "Try the rail pass, it saves money."),
    ("I started reading a novel about a lighthouse.", "Who wrote it? I love that genre."),
]
DATES = ["2023-05-08", "2023-06-01", "2023-06-20", "2023-07-07", "2023-08-15",
         "2023-09-02", "2023-10-11", "2023-11-30"]
CONVERSATIONS = ["ana", "ben", "clara", "dev", "eli", "fay"]
QUESTIONS = ["What breed is Rex, the puppy?", "When is the violin recital?",
             "Who visits from Lisbon?", "Was the trail muddy?",
             "Who taught me to bake bread?", "What about the trip budget?"]


def sessions_of(c: int) -> list:
    """The sessions of conversation number ``c``: ``[(Session, metadata)]`` (each
    conversation its own selection and order of the topics)."""
    out = []
    n = 4 + c % 4
    for j in range(n):
        t = TOPICS[(j * (c + 1) + c) % len(TOPICS)]
        s = Session.from_messages(f"s{j}", DATES[j % len(DATES)], [
            {"role": "user", "content": t[0]}, {"role": "assistant", "content": t[1]}])
        out.append((s, {"topic": ["pets", "music", "family", "travel"][j % 4],
                        "n": j}))
    return out


def populate(mem, conversations=CONVERSATIONS) -> None:
    """Add every conversation's sessions to ``mem`` (a memory or a client)."""
    for c, cid in enumerate(conversations):
        for s, md in sessions_of(c):
            mem.add_session(cid, s, metadata=md)


def search_mix() -> list:
    """``[(conversation_id, queries, kwargs)]``: methods, k, evidence, date and
    metadata filters, unknown conversations, several questions, one id per question."""
    mix = []
    methods = [None, "memgas", "bm25", "session", "memgas_hybrid"]
    for i in range(40):
        cid = CONVERSATIONS[i % len(CONVERSATIONS)]
        kw = {"k": 1 + i % 5}
        m = methods[i % len(methods)]
        if m is not None:
            kw["method"] = m
        if i % 7 == 3:
            kw["after"] = "2023-06-10"
        if i % 7 == 5:
            kw["before"] = "2023-08-01"
        if i % 9 == 4:
            kw["metadata"] = {"topic": "music"}
        if i % 6 == 2:
            kw["evidence"] = 1
        if i % 11 == 6:
            kw["question_date"] = "2023-12-01"
        qs = [QUESTIONS[i % len(QUESTIONS)]]
        if i % 8 == 7:
            qs.append(QUESTIONS[(i + 1) % len(QUESTIONS)])
        if i % 10 == 9:
            cid = "nobody-knows-me"
        if i % 13 == 12:
            cid = [CONVERSATIONS[i % 6], CONVERSATIONS[(i + 1) % 6]]
            qs = [QUESTIONS[0], QUESTIONS[1]]
        mix.append((cid, qs, kw))
    return mix


def assert_same(got: list, want: list, tol: float = 1e-5) -> None:
    """Served results against the direct search's: same conversations, session ids and
    evidence turns; scores equal up to ``tol`` (float rounding of another batch)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.conversation_id == w.conversation_id
        assert g.session_ids == w.session_ids, (g.session_ids, w.session_ids)
        assert len(g.scores) == len(w.scores)
        for a, b in zip(g.scores, w.scores):
            assert abs(a - b) <= tol * max(1.0, abs(b)), (g.scores, w.scores)
        assert [[t for t, _, _ in ev] for ev in g.evidence] == \
            [[t for t, _, _ in ev] for ev in w.evidence]
        assert [[x for _, x, _ in ev] for ev in g.evidence] == \
            [[x for _, x, _ in ev] for ev in w.evidence]


@contextlib.contextmanager
def running(app):
    """Serve the ASGI ``app`` with uvicorn on a free local port in a thread; yields its
    URL, stops it on exit."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(30)
        sock.close()
