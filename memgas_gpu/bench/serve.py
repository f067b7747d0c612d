"""Benchmark point of ``memgas serve``: many clients asking one question each, with
micro-batching on and off, in one run.

* **In process**: ``threads`` threads in a closed loop, each calling ``search`` through
  a :class:`~memgas_gpu.serve.Batcher`, against the same threads calling
  ``MemoryIndex.search`` directly.
* **Over HTTP**: the real server (``memgas serve`` in its own process, the memory
  opened on a folder) with ``--max-batch-size 64`` and ``--max-batch-size 1``; closed-loop
  clients at each concurrency (one connection each, httpx on one event loop: 64 client
  threads, or one httpx pool of 64 connections, cost this process more than the server
  takes to answer), single-question requests over random conversations.

The memory is LongMemEval-shaped (:func:`~memgas_gpu.bench.online.haystack_index`);
every answer is compared with a direct ``search`` of the same question on the same
memory (session ids equal, scores within 1e-5): a mismatch is counted and reported.
"""
from __future__ import annotations

import asyncio
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

import torch

from .timing import Record, percentile

__all__ = ["serve_point", "serve_rows", "GOAL_INPROCESS", "GOAL_HTTP", "GOAL_CLIENTS",
           "same_answer"]

#: the project's goals: batched / unbatched QPS with 64 threads in process, and over HTTP
#: at the highest concurrency (p99 no worse there)
GOAL_INPROCESS = 4.0
GOAL_HTTP = 2.5
GOAL_CLIENTS = 64


def same_answer(got, want, tol: float = 1e-5) -> bool:
    """One search result against the direct search's: same sessions, scores within
    ``tol``."""
    g = got if isinstance(got, dict) else got.to_dict()
    w = want.to_dict()
    return g["session_ids"] == w["session_ids"] and len(g["scores"]) == len(w["scores"]) \
        and all(abs(a - b) <= tol * max(1.0, abs(b)) for a, b in zip(g["scores"], w["scores"]))


#: who and when, to make each benchmark question a distinct text (a server's questions
#: rarely repeat; repeated texts would be encoded once per batch and flatter batching)
_WHO = ("", " with Anna", " with my brother", " at work", " with the neighbours",
        " with Sam", " for the kids", " with my mother")
_WHEN = ("", " in March", " last summer", " this week", " before the holidays",
         " on Sunday", " after the move", " in the spring")


def _pairs(n_haystacks: int, n: int, seed: int) -> list:
    """``n`` (conversation, question) pairs: random haystacks, each question a distinct
    text (the online stage's templates and topics, with who and when) while there are
    enough of them."""
    from .online import QUESTIONS, TOPICS

    rng = random.Random(seed)
    texts = [q.format(t + w + h) for q in QUESTIONS for t in TOPICS for w in _WHO
             for h in _WHEN]
    rng.shuffle(texts)
    return [(f"hay-{rng.randrange(n_haystacks)}", texts[i % len(texts)]) for i in range(n)]


def _jobs(n_pairs: int, requests: int, seed: int) -> list:
    """Which pair each request asks: every pair once, in random order, then again, so
    that requests close in time ask different questions."""
    rng = random.Random(seed)
    out = []
    while len(out) < requests:
        cycle = list(range(n_pairs))
        rng.shuffle(cycle)
        out += cycle
    return out[:requests]


def _closed_loop(call: Callable, pairs: Sequence, clients: int, requests: int,
                 seed: int) -> tuple[float, list, list]:
    """``clients`` threads asking ``requests`` questions in all, each the next as soon
    as it has its answer; ``(wall seconds, latencies, [(pair index, answer)])``."""
    jobs = _jobs(len(pairs), requests, seed)
    lat, answers, lock = [], [], threading.Lock()
    start = threading.Barrier(clients + 1)

    def work(t: int, state: dict) -> None:
        start.wait()
        for j in jobs[t::clients]:
            t0 = time.perf_counter()
            got = call(state, *pairs[j])
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                answers.append((j, got))

    states = [{} for _ in range(clients)]
    ts = [threading.Thread(target=work, args=(t, states[t]), daemon=True)
          for t in range(clients)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    for s in states:
        if "close" in s:
            s["close"]()
    return wall, lat, answers


def _record(impl: str, size: dict, wall: float, lat: list, mismatches: int,
            extra: dict) -> Record:
    n = len(lat)
    return Record("serve", impl, dict(size), [wall], float(n), "queries", "",
                  "closed loop, one question per request; times: the whole loop", None, None,
                  {"qps": n / wall if wall > 0 else float("nan"), "requests": n,
                   "p50_ms": 1e3 * percentile(lat, 50), "p99_ms": 1e3 * percentile(lat, 99),
                   "mismatches": mismatches, "wall_s": wall, **extra})


def _start_server(folder: str, encoder: str, max_batch_size: int, threads: int,
                  device: str = "cpu", timeout: float = 300.0):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    p = subprocess.Popen([sys.executable, "-m", "memgas_gpu.cli", "serve", folder, "--port",
                          "0", "--encoder", encoder, "--device", device, "--max-batch-size",
                          str(max_batch_size), "--max-wait-ms", "5", "-q"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    line = p.stdout.readline().strip() if ready else ""
    if not line.startswith("http://"):
        p.kill()
        raise RuntimeError(f"memgas serve did not start: {p.communicate()[1][-2000:]}")
    return p, line


def _stop_server(p) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()


def serve_point(n_haystacks: int = 100, n_sessions: int = 50, pool: int = 1000,
                clients: Sequence[int] = (1, 8, 64), requests: int = 256,
                inprocess_threads: int = 64, distinct: int = 512, tmp: str = ".",
                device: str = "cpu", seed: int = 0, encoder: str = "tiny",
                log: Callable[[str], None] = print) -> list[Record]:
    """The serving records (see the module docstring): ``"in-process batched"`` /
    ``"in-process direct"`` with ``inprocess_threads`` threads, and ``"http batched"`` /
    ``"http direct"`` at each of ``clients``; ``requests`` questions per point, drawn from
    ``distinct`` (conversation, question) pairs whose direct answers are the oracle.
    ``encoder``: ``"tiny"`` (a random 2-layer BERT: the read path dominates) or
    ``"minilm"`` (the bundled all-MiniLM-L6-v2: what a user's server encodes with)."""
    import httpx

    from ..encode import Encoder, bundled_model_path
    from ..encode.tiny import make_random_bert
    from ..serve import Batcher
    from .online import haystack_index

    if encoder == "minilm":
        path = bundled_model_path()
    elif encoder == "tiny":
        path = make_random_bert(os.path.join(tmp, "serve_bert"))
    else:
        raise ValueError(f"unknown encoder {encoder!r} (tiny, minilm)")
    enc = Encoder(path, device=device)
    idx, _ = haystack_index(n_haystacks, n_sessions, pool, enc, seed)
    idx.use_encoder(enc)
    folder = os.path.join(tmp, "serve_memory")
    idx.save(folder)
    pairs = _pairs(n_haystacks, distinct, seed)
    oracle = [idx.search(c, [q], k=10)[0] for c, q in pairs]
    threads = torch.get_num_threads()
    size = {"haystacks": n_haystacks, "sessions": n_sessions, "pool": pool,
            "threads": threads, "encoder": encoder}
    recs = []

    # ---------------------------------------------------------------- in process
    batcher = Batcher(idx, max_batch_size=64, max_wait_ms=5)
    for impl, fn in (("in-process batched", lambda s, c, q: batcher.search(c, [q], k=10)[0]),
                     ("in-process direct", lambda s, c, q: idx.search(c, [q], k=10)[0])):
        _closed_loop(fn, pairs, inprocess_threads, min(requests, 2 * inprocess_threads),
                     seed + 1)  # warm-up: views, caches
        b0 = batcher.stats()
        wall, lat, answers = _closed_loop(fn, pairs, inprocess_threads, requests, seed + 2)
        b1 = batcher.stats()
        bad = sum(not same_answer(a, oracle[j]) for j, a in answers)
        nb = b1["batches"] - b0["batches"]
        mean = (b1["questions"] - b0["questions"]) / nb if nb else 1.0
        recs.append(_record(impl, dict(size, clients=inprocess_threads), wall, lat, bad,
                            {"mean_batch_size": mean if "batched" in impl else 1.0}))
        log(f"  serve {impl:20s} {inprocess_threads:3d} threads  "
            f"{recs[-1].extra['qps']:8.1f} q/s  p50 {recs[-1].extra['p50_ms']:8.2f} ms  "
            f"p99 {recs[-1].extra['p99_ms']:8.2f} ms  mismatches {bad}")
    batcher.close()

    # ---------------------------------------------------------------- over HTTP
    for impl, mbs in (("http batched", 64), ("http direct", 1)):
        proc, url = _start_server(folder, path, mbs, threads, device)
        try:
            for c in clients:
                asyncio.run(_http_loop(url, pairs, c, min(requests, 4 * c), seed + 3))
                m0 = _batch_counts(httpx.get(url + "/metrics").text)
                wall, lat, answers = asyncio.run(_http_loop(url, pairs, c, requests, seed + 4))
                m1 = _batch_counts(httpx.get(url + "/metrics").text)
                bad = sum(not same_answer(a, oracle[j]) for j, a in answers)
                nb = m1[0] - m0[0]
                mean = (m1[1] - m0[1]) / nb if nb else float("nan")
                recs.append(_record(impl, dict(size, clients=c), wall, lat, bad,
                                    {"mean_batch_size": mean}))
                log(f"  serve {impl:20s} {c:3d} clients  {recs[-1].extra['qps']:8.1f} q/s  "
                    f"p50 {recs[-1].extra['p50_ms']:8.2f} ms  p99 "
                    f"{recs[-1].extra['p99_ms']:8.2f} ms  mean batch {mean:5.1f}  "
                    f"mismatches {bad}")
        finally:
            _stop_server(proc)
    return recs


async def _http_loop(url: str, pairs: Sequence, clients: int, requests: int, seed: int):
    """``clients`` closed-loop HTTP clients (one connection each: one ``httpx.AsyncClient``
    per client, as a shared pool of many connections costs the client more than the
    server answers) asking ``requests`` questions in all; ``(wall seconds, latencies,
    [(pair index, answer)])``."""
    import httpx

    jobs = iter(_jobs(len(pairs), requests, seed))
    lat, answers = [], []
    conns = [httpx.AsyncClient(base_url=url, timeout=600.0) for _ in range(clients)]

    async def client(http) -> None:
        for j in jobs:
            c, q = pairs[j]
            t0 = time.perf_counter()
            r = await http.post("/v1/search", json={"conversation_id": c, "questions": [q],
                                                    "k": 10})
            dt = time.perf_counter() - t0
            r.raise_for_status()
            lat.append(dt)
            answers.append((j, r.json()["results"][0]))

    try:
        await asyncio.gather(*[h.get("/healthz") for h in conns])  # connected
        t0 = time.perf_counter()
        await asyncio.gather(*[client(h) for h in conns])
        wall = time.perf_counter() - t0
    finally:
        await asyncio.gather(*[h.aclose() for h in conns])
    return wall, lat, answers


def _batch_counts(text: str) -> tuple[float, float]:
    """``(batches, questions)`` from the server's /metrics."""
    got = {}
    for line in text.splitlines():
        for name in ("memgas_search_batches_total", "memgas_search_questions_total"):
            if line.startswith(name + " "):
                got[name] = float(line.split()[-1])
    return got.get("memgas_search_batches_total", 0.0), \
        got.get("memgas_search_questions_total", 0.0)


def serve_rows(records) -> list[str]:
    """Markdown rows of the serve stage: QPS, p50 / p99 and mean batch size per
    concurrency, batching on and off, their ratio, and the goals."""
    recs = [r for r in records if r.stage == "serve"]
    if not recs:
        return []
    by = {(r.impl, r.size["clients"]): r for r in recs}
    sz = recs[0].size
    L = [f"LongMemEval shape ({sz['haystacks']} haystacks x {sz['sessions']} sessions from "
         f"{sz['pool']} distinct), one question per request, {sz['threads']} torch "
         f"thread(s), encoder {sz.get('encoder', 'tiny')}:", "",
         "| where | clients | batching | QPS | p50 | p99 | mean batch | answers equal |",
         "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in recs:
        where, _, how = r.impl.partition(" ")
        e = r.extra
        L.append(f"| {where} | {r.size['clients']} | {'on' if how == 'batched' else 'off'} | "
                 f"{e['qps']:.1f} | {e['p50_ms']:.3g} ms | {e['p99_ms']:.3g} ms | "
                 f"{e['mean_batch_size']:.1f} | "
                 f"{'yes' if e['mismatches'] == 0 else 'NO: %d differ' % e['mismatches']} |")
    L += [""]
    for where, goal in (("in-process", GOAL_INPROCESS), ("http", GOAL_HTTP)):
        cs = sorted(c for (i, c) in by if i == f"{where} batched" and (f"{where} direct", c) in by)
        if not cs:
            continue
        c = cs[-1]
        on, off = by[(f"{where} batched", c)], by[(f"{where} direct", c)]
        x = on.extra["qps"] / off.extra["qps"] if off.extra["qps"] else float("nan")
        p99 = on.extra["p99_ms"] <= off.extra["p99_ms"]
        met = x >= goal and (p99 or where == "in-process")
        verdict = ("met" if met else "not met") if c == GOAL_CLIENTS else \
            f"the goal is stated at {GOAL_CLIENTS} clients, not measured here"
        L.append(f"- {where}, {c} clients: batching gives {x:.2f}x the QPS "
                 f"(goal >= {goal:g}x{', p99 no worse' if where == 'http' else ''}): "
                 f"{verdict}; p99 {on.extra['p99_ms']:.3g} ms batched vs "
                 f"{off.extra['p99_ms']:.3g} ms direct.")
    return L
