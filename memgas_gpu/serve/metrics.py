"""The counters of ``memgas serve`` in the Prometheus text format (``GET /metrics``).

Requests are counted by route *pattern* (``/v1/conversations/{cid}``), method and
status, never by the ids in the path; nothing here names a tenant or a key.
"""
from __future__ import annotations

import threading
from typing import Optional

__all__ = ["Metrics", "LATENCY_BUCKETS"]

#: upper bounds (seconds) of the request-latency histograms
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)


def _labels(**kv) -> str:
    def esc(v) -> str:
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kv.items()) + "}"


def _num(x: float) -> str:
    if x == float("inf"):
        return "+Inf"
    return repr(float(x)) if isinstance(x, float) else str(x)


class Metrics:
    """Request counts and latency histograms, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict = {}  # (method, route, status) -> count
        self._latency: dict = {}  # (method, route) -> [bucket counts..., sum, count]

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            k = (method, route, status)
            self._requests[k] = self._requests.get(k, 0) + 1
            h = self._latency.setdefault((method, route), [0] * len(LATENCY_BUCKETS) + [0.0, 0])
            for j, hi in enumerate(LATENCY_BUCKETS):
                if seconds <= hi:
                    h[j] += 1
            h[-2] += seconds
            h[-1] += 1

    def render(self, batch: Optional[dict] = None) -> str:
        """The text exposition: requests, latencies and, given the batcher's
        :meth:`~memgas_gpu.serve.Batcher.stats`, the batch counters."""
        with self._lock:
            reqs = dict(self._requests)
            lat = {k: list(v) for k, v in self._latency.items()}
        L = ["# HELP memgas_requests_total HTTP requests by route, method and status.",
             "# TYPE memgas_requests_total counter"]
        for (m, r, s), n in sorted(reqs.items()):
            L.append(f"memgas_requests_total{_labels(route=r, method=m, status=s)} {n}")
        L += ["# HELP memgas_request_seconds Time to answer a request, by route.",
              "# TYPE memgas_request_seconds histogram"]
        for (m, r), h in sorted(lat.items()):
            for hi, n in zip(LATENCY_BUCKETS, h):
                L.append(f"memgas_request_seconds_bucket{_labels(route=r, method=m, le=_num(hi))}"
                         f" {n}")
            L.append(f"memgas_request_seconds_bucket{_labels(route=r, method=m, le='+Inf')} "
                     f"{h[-1]}")
            L.append(f"memgas_request_seconds_sum{_labels(route=r, method=m)} {_num(h[-2])}")
            L.append(f"memgas_request_seconds_count{_labels(route=r, method=m)} {h[-1]}")
        if batch:
            L += _batch_lines(batch)
        return "\n".join(L) + "\n"


def _batch_lines(s: dict) -> list:
    """The batcher's counters; ``s`` may carry a ``shards`` list (Ray Serve: one dict
    per replica) instead of one set."""
    parts = s.get("shards") or [dict(s, shard=None)]
    L = []

    def lab(p, **kv):
        return _labels(**({"shard": p["shard"]} if p.get("shard") is not None else {}), **kv) \
            if (p.get("shard") is not None or kv) else ""

    for name, kind, key, what in (
            ("memgas_search_batches_total", "counter", "batches", "Batches of searches answered."),
            ("memgas_search_questions_total", "counter", "questions", "Questions answered."),
            ("memgas_search_requests_total", "counter", "requests", "Search calls answered."),
            ("memgas_search_errors_total", "counter", "errors", "Search calls answered with "
                                                               "an error."),
            ("memgas_search_queue_depth", "gauge", "queue_depth", "Search calls waiting for "
                                                                 "a batch."),
            ("memgas_search_mean_batch_size", "gauge", "mean_batch_size", "Questions per "
                                                                         "batch, on average."),
            ("memgas_search_max_batch_size", "gauge", "max_batch_size", "Questions per batch "
                                                                       "at most (1: off).")):
        L += [f"# HELP {name} {what}", f"# TYPE {name} {kind}"]
        for p in parts:
            if key in p:
                L.append(f"{name}{lab(p)} {_num(p[key])}")
    L += ["# HELP memgas_search_batch_size Questions per batch.",
          "# TYPE memgas_search_batch_size histogram"]
    for p in parts:
        sizes = p.get("batch_sizes") or {}
        for hi, n in sizes.items():
            L.append(f"memgas_search_batch_size_bucket{lab(p, le=_num(hi) if hi != '+Inf' else hi)}"
                     f" {n}")
        L.append(f"memgas_search_batch_size_sum{lab(p)} {p.get('questions', 0)}")
        L.append(f"memgas_search_batch_size_count{lab(p)} {p.get('batches', 0)}")
    if "conversations" in s:
        L += ["# HELP memgas_conversations Conversations the memory holds (all tenants).",
              "# TYPE memgas_conversations gauge", f"memgas_conversations {s['conversations']}"]
    return L
