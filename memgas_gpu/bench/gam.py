"""GAM write-path benchmark: online write of one utterance and the offline build, each
against the straightforward reference (a per-event Python loop), in the same run.

Encoding is excluded everywhere: event embeddings are computed first, and the summary
encoder is a lookup of embeddings computed in a warm-up build (:class:`CachedEncode`).

* ``online``: :meth:`GamWriter.add` per utterance over the whole stream (every write,
  including the ones that consolidate a topic), p50/p99/max.
* ``online reference``: :class:`ReferenceWriter`, the same rule written plainly: Python
  lists and per-event NumPy, one scikit-learn ``GaussianMixture`` per topic (the MemGAS
  reference's way).
* ``offline``: :meth:`GamIndex.build` of the dataset from its events; ``offline
  reference``: the reference writer over the stream.
* ``read``: :meth:`GamIndex.retrieve` of every question (question encoding excluded).
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional

import numpy as np
import torch

from ..gam import GamIndex, GamParams, GamWriter, build_events
from ..gam.boundary import parse_segmentation
from ..gam.topics import summarize

__all__ = ["CachedEncode", "ReferenceWriter", "bench_gam"]


class CachedEncode:
    """``encode(texts)`` answered from a dict (texts seen in the warm-up); anything else
    goes to ``encoder``. Also usable as an encoder object (``.encode``)."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.table: dict[str, torch.Tensor] = {}
        self.dim = getattr(encoder, "dim", None)

    def encode(self, texts, progress=None):
        missing = [t for t in dict.fromkeys(texts) if t not in self.table]
        if missing:
            for t, e in zip(missing, self.encoder.encode(missing)):
                self.table[t] = e
        return torch.stack([self.table[t] for t in texts]) if texts else torch.zeros(0, self.dim)

    __call__ = encode


class ReferenceWriter:
    """GAM's write rule as a straightforward per-event loop (the benchmark's reference)."""

    def __init__(self, encode, p: GamParams) -> None:
        from sklearn.mixture import GaussianMixture  # the reference's GMM, per topic

        self.GMM = GaussianMixture
        self.encode, self.p = encode, p
        self.kind, self.n = parse_segmentation(p.segmentation)
        self.conv = self.session = None
        self.recent: list = []
        self.buf: list = []
        self.buf_tokens = 0
        self.pos = 0
        self.keys: list = []
        self.edges: list = []
        self.n_topics = 0

    def add(self, conv: str, session: str, text: str, emb: np.ndarray, tokens: int) -> None:
        x = emb / np.linalg.norm(emb)
        new = conv != self.conv or session != self.session
        b = new or self.kind == "event" or (self.kind == "turns" and self.pos % self.n == 0)
        cap = self.n if self.kind == "tokens" else \
            (self.p.max_tokens if self.kind == "semantic" else math.inf)
        if not b and self.buf and self.buf_tokens + tokens > cap:
            b = True
        if not b and self.kind == "semantic" and len(self.buf) >= self.p.min_events:
            ctx = np.zeros_like(x)
            for r in self.recent[::-1][:self.p.window]:
                ctx = ctx + r
            nrm = np.linalg.norm(ctx)
            b = nrm > 0 and 1.0 - float(x @ ctx) / nrm > self.p.theta
        if b:
            self.flush()
        if conv != self.conv:
            self.keys = []
        if new:
            self.recent, self.pos = [], 0
        self.conv, self.session = conv, session
        self.buf.append((text, x))
        self.buf_tokens += tokens
        self.recent = (self.recent + [x])[-self.p.window:]
        self.pos += 1

    def flush(self) -> None:
        if not self.buf:
            return
        raw = sum(e for _, e in self.buf)
        raw = raw / np.linalg.norm(raw)
        summary = summarize(["\n".join(t for t, _ in self.buf)], self.p.summaries)[0]
        s = self.encode([summary])[0].numpy()
        s = s / np.linalg.norm(s)
        key = (raw + s) / np.linalg.norm(raw + s)
        sims = [(float(key @ k), j) for j, k in enumerate(self.keys)]
        sims.sort(key=lambda v: -v[0])
        sims = sims[:self.p.tan_m]
        if len(sims) >= self.p.min_earlier:
            v = np.array([[s_] for s_, _ in sims], dtype=np.float32)
            g = self.GMM(n_components=2, random_state=0).fit(v)
            hi = int(np.argmax(g.means_))
            post = g.predict_proba(v)[:, hi]
            for (s_, j), pr, lab in zip(sims[:self.p.tan_candidates], post, g.predict(v)):
                if lab == hi and pr >= self.p.conf_min:
                    self.edges.append((self.conv, len(self.keys), j))  # local ids
        self.keys.append(key)
        self.n_topics += 1
        self.buf, self.buf_tokens = [], 0


def _pct(ns: list) -> dict:
    a = np.array(ns, dtype=np.float64) / 1e6
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max()), "n": int(a.size)}


def bench_gam(dataset, encoder: Any, params: Optional[GamParams] = None, *, store: Any = None,
              repeats: int = 3) -> list[dict]:
    """Rows ``{"name", ...timings}`` for the four measurements of the module doc."""
    p = params or GamParams()
    ev = build_events(dataset, encoder, store=store)
    enc = CachedEncode(encoder)
    GamIndex.build(dataset, enc, p, events=ev)  # warm-up: fills the summary table
    rows = []
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        idx = GamIndex.build(dataset, enc, p, events=ev)
        best = min(best, time.perf_counter() - t)
    rows.append({"name": "offline build", "seconds": best, "events": len(ev),
                 "topics": len(idx.topics), "conversations": len(dataset)})
    idx.retrieve()  # question embeddings computed once, outside the timing
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        tr = idx.retrieve()
        best = min(best, time.perf_counter() - t)
    rows.append({"name": "read, every question", "seconds": best,
                 "questions": int(tr.question_index.numel()),
                 "ms_per_question": 1e3 * best / max(1, tr.question_index.numel())})
    stream = [(ev.conv_ids[int(c)], tid.rsplit(":", 1)[0], ev.texts[i], ev.emb[i],
               int(ev.tokens[i])) for i, (c, tid) in enumerate(zip(ev.conv, ev.turn_ids))]
    ns = []
    w = GamWriter(enc.encode, p)
    for item in stream:
        t = time.perf_counter_ns()
        w.add(*item)
        ns.append(time.perf_counter_ns() - t)
    w.flush()
    rows.append({"name": "online write", **_pct(ns),
                 "same_topics_as_offline": len(w.event_ptr) == len(idx.topics)})
    ns, t = [], time.perf_counter()
    ref = ReferenceWriter(enc.encode, p)
    for conv, sess, text, e, tok in stream:
        t1 = time.perf_counter_ns()
        ref.add(conv, sess, text, e.numpy(), tok)
        ns.append(time.perf_counter_ns() - t1)
    ref.flush()
    total = time.perf_counter() - t
    rows.append({"name": "online write, reference loop", **_pct(ns)})
    rows.append({"name": "offline build, reference loop", "seconds": total,
                 "topics": ref.n_topics, "edges": len(ref.edges),
                 "edges_offline": int(idx.topics.src.numel())})
    return rows
