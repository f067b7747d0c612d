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

* **Fair sharing** (in process, one event loop): tenant ``small`` asks one question at a
  time while tenant ``flood`` keeps large requests queued, through
  :meth:`~memgas_gpu.serve.Batcher.asearch_request` (as the server does), with the
  batcher's fairness on and off (``Batcher(fair=False)``), and ``small`` alone.
* **Batch add**: sessions added to a memory opened on a folder (durable, as served) with
  one ``MemoryIndex.add_sessions`` (one log record; each session encoded apart) against one
  ``add_session`` call each.

The memory is LongMemEval-shaped (:func:`~memgas_gpu.bench.online.haystack_index`);
every answer is compared with a direct ``search`` of the same question on the same
memory (session ids equal, scores within 1e-5): a mismatch is counted and reported.
"""
from __future__ import annotations

import asyncio
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional, Sequence

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
    # stderr to an unnamed file: a pipe nobody reads fills up and stalls the server
    err = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
    p = subprocess.Popen([sys.executable, "-m", "memgas_gpu.cli", "serve", folder, "--port",
                          "0", "--encoder", encoder, "--device", device, "--max-batch-size",
                          str(max_batch_size), "--max-wait-ms", "5", "--no-access-log", "-q"],
                         env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    p.err_file = err
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    line = p.stdout.readline().strip() if ready else ""
    if not line.startswith("http://"):
        p.kill()
        p.communicate()
        err.seek(0)
        msg = err.read()[-2000:]
        err.close()
        raise RuntimeError(f"memgas serve did not start: {msg}")
    return p, line


def _stop_server(p) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
    finally:
        p.err_file.close()


def serve_point(n_haystacks: int = 100, n_sessions: int = 50, pool: int = 1000,
                clients: Sequence[int] = (1, 8, 64), requests: int = 256,
                inprocess_threads: int = 64, distinct: int = 512, tmp: str = ".",
                device: str = "cpu", seed: int = 0, encoder: str = "tiny",
                flood: tuple = (2, 256), fair_clients: int = 2,
                fair_requests: Optional[int] = None, add_sessions: int = 32,
                add_rounds: int = 3, log: Callable[[str], None] = print) -> list[Record]:
    """The serving records (see the module docstring): ``"in-process batched"`` /
    ``"in-process direct"`` with ``inprocess_threads`` threads, and ``"http batched"`` /
    ``"http direct"`` at each of ``clients``; ``requests`` questions per point, drawn from
    ``distinct`` (conversation, question) pairs whose direct answers are the oracle.
    ``encoder``: ``"tiny"`` (a random 2-layer BERT: the read path dominates) or
    ``"minilm"`` (the bundled all-MiniLM-L6-v2: what a user's server encodes with).

    Fair sharing (:func:`fair_point`): ``"fairness alone"``, ``"fairness on"``,
    ``"fairness off"``: ``fair_clients`` clients of tenant ``small`` ask
    ``fair_requests`` one-question searches in all (default ``min(requests, 64)``)
    while ``flood[0]`` clients of tenant ``flood`` each keep a request of ``flood[1]``
    questions queued.  Batch add (:func:`add_point`): ``"add batched"`` / ``"add
    single"``, ``add_sessions`` sessions a round, ``add_rounds`` rounds."""
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

    # ---------------------------------------------------------------- fair sharing
    recs += fair_point(idx, pairs, oracle, size, flood, fair_clients,
                       min(requests, 64) if fair_requests is None else fair_requests,
                       seed + 5, log)
    recs += add_point(enc, add_sessions, add_rounds, dict(size), tmp, seed + 6, log)

    # ---------------------------------------------------------------- over HTTP
    for impl, mbs in (("http batched", 64), ("http direct", 1)):
        proc, url = _start_server(folder, path, mbs, threads, device)
        try:
            for c in clients:
                asyncio.run(_http_loop(url, pairs, c, min(requests, 4 * c), seed + 3))
                m0 = _batch_counts(httpx.get(url + "/metrics", timeout=120).text)
                wall, lat, answers = asyncio.run(_http_loop(url, pairs, c, requests, seed + 4))
                m1 = _batch_counts(httpx.get(url + "/metrics", timeout=120).text)
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


def fair_point(idx, pairs: Sequence, oracle: Sequence, size: dict, flood: tuple = (2, 256),
               clients: int = 2, requests: int = 64, seed: int = 0,
               log: Callable[[str], None] = print, max_batch_size: int = 64,
               max_wait_ms: float = 5.0) -> list[Record]:
    """Tenant ``small`` (``clients`` closed-loop clients, ``requests`` one-question
    searches in all) alone, then while tenant ``flood`` (``flood[0]`` clients, each
    asking requests of ``flood[1]`` questions back to back) floods the same
    :class:`~memgas_gpu.serve.Batcher`, with fairness on and off: records
    ``"fairness alone"`` / ``"fairness on"`` / ``"fairness off"`` (the small tenant's
    p50 / p99 latency, its answers checked against ``oracle``, and the flood's
    questions per second, and how many batches each small request waited for: the one
    in flight when it came and its own make 2, the bound of fair sharing)."""
    from ..serve import Batcher

    recs = []
    for how in ("alone", "on", "off"):
        batcher = Batcher(idx, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
                          fair=how != "off")
        try:
            wall, lat, answers, flooded, waits = asyncio.run(_fair_loop(
                batcher, pairs, flood if how != "alone" else (0, 0), clients, requests, seed))
        finally:
            batcher.close()
        bad = sum(not same_answer(a, oracle[j]) for j, a in answers)
        r = _record(f"fairness {how}", dict(size, clients=clients, flood_clients=flood[0],
                                            flood_questions=flood[1]), wall, lat, bad,
                    {"flood_qps": flooded / wall if wall > 0 else 0.0,
                     "max_batch_size": max_batch_size,
                     "batches_waited_mean": sum(waits) / len(waits) if waits else 0.0,
                     "batches_waited_max": max(waits, default=0)})
        r.note = ("one-question searches of one tenant while another floods the batcher; "
                  "times: the small tenant's loop")
        recs.append(r)
        log(f"  serve fairness {how:5s} small p50 {r.extra['p50_ms']:8.2f} ms  p99 "
            f"{r.extra['p99_ms']:8.2f} ms  batches waited {r.extra['batches_waited_mean']:5.1f}"
            f" (max {r.extra['batches_waited_max']})  flood {r.extra['flood_qps']:8.1f} q/s"
            f"  mismatches {bad}")
    return recs


async def _fair_loop(batcher, pairs: Sequence, flood: tuple, clients: int, requests: int,
                     seed: int):
    """``(wall seconds, small latencies, [(pair index, answer)], flood questions
    answered)`` of one fairness run (see :func:`fair_point`)."""
    rng = random.Random(seed)
    jobs = _jobs(len(pairs), requests, seed)
    lat, answers, flooded, waits = [], [], [0], []
    stop = asyncio.Event()

    async def flooder() -> None:
        while not stop.is_set():
            ask = [pairs[rng.randrange(len(pairs))] for _ in range(flood[1])]
            req = batcher.request([c for c, _ in ask], [q for _, q in ask], k=10)
            await batcher.asearch_request(req, tenant="flood")
            flooded[0] += len(ask)

    async def small(t: int) -> None:
        for j in jobs[t::clients]:
            c, q = pairs[j]
            req = batcher.request(c, [q], k=10)
            t0 = time.perf_counter()
            call = asyncio.ensure_future(batcher.asearch_request(req, tenant="small"))
            await asyncio.sleep(0)  # the call is checked and queued
            n0 = batcher.stats()["batches"]
            got = await call
            lat.append(time.perf_counter() - t0)
            waits.append(batcher.stats()["batches"] - n0)  # the one in flight, and its own
            answers.append((j, got[0]))

    floods = [asyncio.ensure_future(flooder()) for _ in range(flood[0])]
    while floods and batcher.stats()["batches"] < 2:  # the flood is under way
        await asyncio.sleep(0.005)
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*[small(t) for t in range(clients)])
        wall = time.perf_counter() - t0
    finally:
        stop.set()
        for f in floods:  # their queued pieces are dropped
            f.cancel()
        await asyncio.gather(*floods, return_exceptions=True)
    return wall, lat, answers, flooded[0], waits


def add_point(enc, n: int = 32, rounds: int = 3, size: Optional[dict] = None,
              tmp: str = ".", seed: int = 0,
              log: Callable[[str], None] = print) -> list[Record]:
    """``n`` LongMemEval-shaped sessions added to a memory opened on a folder (durable,
    as ``memgas serve`` holds it) with one ``add_sessions`` call (``"add batched"``)
    and with ``n`` ``add_session`` calls (``"add single"``), each round into new
    conversations, the order alternating; times per round, work: sessions.  Every add
    has sessions of its own (a session the memory holds already is shared, not
    encoded again)."""
    from ..retrieve import MemoryIndex
    from .online import synthetic_conversation

    pool = synthetic_conversation(2 * n * (rounds + 1), seed, turns=4, words=20)[0].sessions
    folder = os.path.join(tmp, "serve_add")
    size = dict(size or {}, sessions_per_add=n)
    times = {"add batched": [], "add single": []}
    mem = MemoryIndex.open(folder, encoder=enc)
    try:
        for r in range(-1, rounds):  # round -1: the warm-up (kernels, the log's files)
            for k, how in enumerate(("add batched", "add single") if r % 2 == 0 else
                                    ("add single", "add batched")):
                at = 2 * n * (r + 1) + k * n
                sessions = pool[at:at + n]
                t0 = time.perf_counter()
                if how == "add batched":
                    mem.add_sessions(f"batched{r}", sessions)
                else:
                    for one in sessions:
                        mem.add_session(f"single{r}", one)
                if r >= 0:
                    times[how].append(time.perf_counter() - t0)
    finally:
        mem.close()
        shutil.rmtree(folder, ignore_errors=True)
    recs = []
    for how, ts in times.items():
        per = sorted(ts)[len(ts) // 2] / n
        recs.append(Record("serve", how, size, ts, float(n), "sessions", "",
                           "sessions added to a memory opened on a folder; times: one "
                           "round of n sessions", None, None,
                           {"per_session_ms": 1e3 * per, "rounds": rounds}))
        log(f"  serve {how:20s} {n:3d} sessions  {1e3 * per:8.2f} ms per session")
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
    recs = [r for r in records if r.stage == "serve"
            and r.impl.startswith(("in-process ", "http "))]
    if not recs:
        return _fair_rows(records) + _add_rows(records)
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
    return L + _fair_rows(records) + _add_rows(records)


def _fair_rows(records) -> list[str]:
    by = {r.impl: r for r in records if r.stage == "serve" and r.impl.startswith("fairness ")}
    if not by:
        return []
    sz = next(iter(by.values())).size
    L = ["", f"Fair sharing (in process, one Batcher, max batch "
             f"{next(iter(by.values())).extra['max_batch_size']}): tenant small asks one "
             f"question per request ({sz['clients']} clients) while tenant flood keeps "
             f"{sz['flood_clients']} requests of {sz['flood_questions']} questions queued:",
         "", "| fairness | small p50 | small p99 | batches waited (mean, max) | small requests "
             "| flood q/s | answers equal |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for how in ("alone", "on", "off"):
        r = by.get(f"fairness {how}")
        if r is None:
            continue
        e = r.extra
        L.append(f"| {'no flood' if how == 'alone' else how} | {e['p50_ms']:.3g} ms | "
                 f"{e['p99_ms']:.3g} ms | {e['batches_waited_mean']:.1f}, "
                 f"{e['batches_waited_max']} | {e['requests']} | "
                 f"{e['flood_qps']:.1f} | "
                 f"{'yes' if e['mismatches'] == 0 else 'NO: %d differ' % e['mismatches']} |")
    on, off = by.get("fairness on"), by.get("fairness off")
    if on is not None and off is not None and on.extra["p99_ms"] > 0:
        L += ["", f"- the small tenant's p99 with fairness: {on.extra['p99_ms']:.3g} ms "
                  f"against {off.extra['p99_ms']:.3g} ms without "
                  f"({off.extra['p99_ms'] / on.extra['p99_ms']:.1f}x lower)."]
    return L


def _add_rows(records) -> list[str]:
    by = {r.impl: r for r in records if r.stage == "serve" and r.impl.startswith("add ")}
    one, each = by.get("add batched"), by.get("add single")
    if one is None or each is None:
        return []
    n = one.size["sessions_per_add"]
    x = each.extra["per_session_ms"] / one.extra["per_session_ms"]
    return ["", f"Adding {n} sessions to a memory opened on a folder (median of "
                f"{one.extra['rounds']} rounds): one add_sessions "
                f"{one.extra['per_session_ms']:.3g} ms per session, {n} add_session calls "
                f"{each.extra['per_session_ms']:.3g} ms per session ({x:.1f}x)."]
