"""The benchmark suite: scaling sweeps and headline points, ours vs reference, one run.

Scales (:data:`SCALES`):

* ``tiny``: seconds; a smoke test of every code path (tests, ``gpu_suite --dry-run``).
* ``s`` (default): 2 CPU cores in a few minutes: sessions per haystack 50 -> 2,000,
  haystacks 1 -> 64 (500 sessions each), MiniLM encoding, a small end-to-end index.
* ``m``: LongMemEval-M (for an H200): sessions 50 -> 500 -> 5,000, haystacks 1 -> 500
  of 500 sessions (d = 768, Contriever's size), BERT-base encoding, an M-shaped index
  slice extrapolated to 500 haystacks.

Stages other than encoding and the end-to-end index use random LongMemEval-shaped
embeddings (:mod:`memgas_gpu.bench.data`), so sweeps stay fast.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

import torch

from .data import make_haystacks, make_queries, make_terms, synthetic_texts
from .stages import bm25_point, graph_point, query_point
from .stages_io import encode_point, index_point, io_point, make_encoder
from .bandwidth import measure_bandwidth
from .timing import Deadline

__all__ = ["SuiteScale", "SCALES", "STAGES", "SuiteResult", "run_suite", "machine_info"]

STAGES = ("graph", "query", "bm25", "encode", "io", "index", "search", "online", "gam",
          "durable", "serve", "scale")


@dataclass(frozen=True)
class SuiteScale:
    """Sizes of one suite run (see the module docstring)."""

    dim: int
    sessions: tuple  # sweep: sessions of one haystack
    sweep_queries: int  # questions against that haystack
    haystacks: tuple  # sweep: haystacks of `haystack_sessions` sessions, one question each
    haystack_sessions: int
    ref_nodes: int  # nodes timed per reference graph point (then extrapolated)
    ref_queries: int  # questions timed per reference read-path / BM25 point
    latency_calls: int  # single-question calls for p50/p99
    rounds: int
    encoder: str  # "tiny" | "minilm" | "base"
    encode_texts: int
    text_shape: tuple  # (messages per session, words per message) of encoded texts
    io_shape: tuple  # (haystacks, sessions)
    index_shape: dict  # write_synthetic arguments
    index_encoder: str
    index_ref_questions: int
    index_full_haystacks: Optional[int] = None
    doc_len: int = 200  # BM25 terms per session
    search_sessions: int = 500  # sessions of the conversation of the online search point
    # memory service: add / remove / search against the conversations the index holds
    online_conversations: tuple = (10, 40, 160, 320, 1000)
    online_sessions: int = 50
    online_calls: int = 30
    online_haystacks: tuple = (500, 500, 10000)  # haystacks, sessions each, distinct pool
    online_encoder: str = "tiny"
    # durable memory: checkpoint cost at these conversation counts; recovery of these logs
    batch_shape: tuple = (200, 100, 2000, 64)  # haystacks, sessions, pool, batch
    durable_conversations: tuple = (10, 100, 1000)
    durable_records: tuple = (100, 1000)
    # a memory of many conversations on disk: open, RSS, cold/warm search, checkpoint
    scale_conversations: tuple = (1000, 10000, 100000)
    # memgas serve: (haystacks, sessions each, distinct pool), concurrent clients over
    # HTTP, questions per point, in-process threads, distinct (conversation, question)
    serve_shape: tuple = (100, 50, 1000)
    serve_clients: tuple = (1, 8, 64)
    serve_requests: int = 512
    serve_threads: int = 64
    serve_distinct: int = 512  # as many as the requests: no question repeats in a point
    serve_encoder: str = "minilm"  # what a user's server encodes questions with


SCALES = {
    "tiny": SuiteScale(dim=32, sessions=(20, 40, 80), sweep_queries=8, haystacks=(1, 2, 4),
                       haystack_sessions=20, ref_nodes=12, ref_queries=4, latency_calls=5,
                       rounds=2, encoder="tiny", encode_texts=24, text_shape=(4, 20),
                       io_shape=(4, 20), index_shape=dict(questions=2, sessions=8, turns=4,
                                                          words=15),
                       index_encoder="tiny", index_ref_questions=1, doc_len=30,
                       search_sessions=20, online_conversations=(2, 4, 8), online_sessions=10,
                       online_calls=4, online_haystacks=(4, 20, 60),
                       durable_conversations=(2, 8), durable_records=(5, 20),
                       scale_conversations=(50, 200),
                       batch_shape=(12, 10, 40, 8),
                       serve_shape=(6, 10, 40), serve_clients=(1, 4), serve_requests=16,
                       serve_threads=4, serve_distinct=12, serve_encoder="tiny"),
    "s": SuiteScale(dim=384, sessions=(50, 100, 200, 500, 1000, 2000), sweep_queries=32,
                    haystacks=(1, 4, 16, 64), haystack_sessions=500, ref_nodes=100,
                    ref_queries=32, latency_calls=100, rounds=3, encoder="minilm",
                    encode_texts=240, text_shape=(6, 40), io_shape=(16, 500),
                    index_shape=dict(questions=8, sessions=50, turns=6, words=40),
                    index_encoder="tiny", index_ref_questions=8),
    "m": SuiteScale(dim=768, sessions=(50, 150, 500, 1500, 5000), sweep_queries=100,
                    haystacks=(1, 10, 100, 500), haystack_sessions=500, ref_nodes=100,
                    ref_queries=50, latency_calls=200, rounds=5, encoder="base",
                    encode_texts=20000, text_shape=(10, 180), io_shape=(100, 500),
                    index_shape=dict(questions=10, sessions=500, turns=10, words=180,
                                     pool=10000),
                    index_encoder="base", index_ref_questions=1, index_full_haystacks=500,
                    serve_shape=(500, 500, 10000), serve_requests=2048,
                    serve_distinct=2048),
}


@dataclass
class SuiteResult:
    records: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)


def machine_info(device: torch.device) -> dict:
    """Where the numbers come from (also the pytest-benchmark ``machine_info``)."""
    info = {
        "node": platform.node(), "processor": platform.processor() or platform.machine(),
        "machine": platform.machine(), "python_implementation": platform.python_implementation(),
        "python_version": platform.python_version(), "python_compiler": platform.python_compiler(),
        "release": platform.release(), "system": platform.system(),
        "cpu": {"count": os.cpu_count(), "brand_raw": _cpu_brand()},
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    try:  # which kernels `auto` runs (the native extension is optional)
        from ..ops.selfcheck import backend

        info["ops_backend"] = backend(device)
    except Exception:  # older trees without memgas_gpu._native
        info["ops_backend"] = "torch"
    try:
        info["load_average"] = list(os.getloadavg())
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def _cpu_brand() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def run_suite(scale: str | SuiteScale = "s", device=None,
              stages: Sequence[str] = STAGES[:-1],
              threads: Optional[int] = None, budget_s: Optional[float] = None,
              reference: bool = True, log: Callable[[str], None] = print) -> SuiteResult:
    """Run the benchmark suite.

    Args:
        scale: a key of :data:`SCALES` or a :class:`SuiteScale`.
        device: ``"cpu"``, ``"cuda"``… (default: CUDA if available).
        stages: subset of :data:`STAGES`.
        threads: torch intra-op threads (default: 1 on CPU, as the single-threaded
            reference; on a shared 2-core machine 2 OpenMP threads were 20-60x slower).
        budget_s: wall-clock budget; sweep points that would start after it are skipped
            (and listed in ``result.skipped``).
        reference: also time the reference way (default True).
        log: progress lines.
    """
    cfg = SCALES[scale] if isinstance(scale, str) else scale
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
    old_threads = torch.get_num_threads()
    if threads or dev.type == "cpu":
        torch.set_num_threads(threads or 1)
    res = SuiteResult()
    deadline = Deadline(budget_s)
    cache: dict = {}  # reference graph seconds per haystack shape
    res.meta = {"scale": scale if isinstance(scale, str) else "custom",
                "machine_info": machine_info(dev), "config": _asdict(cfg),
                "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        if {"query", "bm25"} & set(stages):  # the memory-bandwidth floor, same threads
            bw = measure_bandwidth(dev, nbytes=(1 << 24) if scale == "tiny" else (1 << 28))
            res.meta["bandwidth"] = bw
            log(f"memory bandwidth ({bw['threads']} thread(s)): copy {bw['copy'] / 1e9:.3g} "
                f"GB/s, triad {bw['triad'] / 1e9:.3g} GB/s")
        with tempfile.TemporaryDirectory(prefix="memgas_bench_") as tmp:
            # goal-bearing work first, so a time budget cuts the least useful points
            _sweep("haystacks", cfg, dev, stages, reference, deadline, res, log, cache)
            _headlines(("encode", "index"), cfg, dev, stages, reference, deadline, res, tmp,
                       log)
            _sweep("sessions", cfg, dev, stages, reference, deadline, res, log, cache)
            _headlines(("io", "search", "online", "gam", "durable", "serve", "scale"), cfg,
                       dev,
                       stages, reference,
                       deadline, res, tmp, log)
    finally:
        torch.set_num_threads(old_threads)
    res.meta["seconds"] = deadline.elapsed
    return res


def _asdict(cfg: SuiteScale) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}


def _add(res: SuiteResult, recs: list, log, headline: bool = False) -> None:
    for r in recs:
        if headline:
            r.extra["headline"] = True
        res.records.append(r)
        log(f"  {r.stage:8s} {r.impl:9s} {r.size_key():32s} {r.seconds:10.4g} s  "
            f"{r.rate:12.4g} {r.unit}/s  {r.note}")


def _sweep(axis, cfg, dev, stages, reference, deadline, res, log, cache) -> None:
    if axis == "sessions":
        points = [("sessions", 1, n, cfg.sweep_queries) for n in cfg.sessions]
    else:
        points = [("haystacks", c, cfg.haystack_sessions, 1) for c in cfg.haystacks]
    last_hay = cfg.haystacks[-1] if cfg.haystacks else None
    for axis, C, N, per in points:
        if not {"graph", "query", "bm25"} & set(stages):
            return
        if deadline.expired():
            res.skipped.append(f"{axis} sweep point {C} x {N}: time budget spent")
            log(f"skip {axis} point {C} x {N}: time budget spent")
            continue
        headline = axis == "haystacks" and C == last_hay
        log(f"{axis} sweep: {C} haystack(s) x {N} sessions, {per} question(s) each")
        t0 = time.perf_counter()
        h = make_haystacks(C, N, cfg.dim, device=dev)
        graph = None
        if "graph" in stages or "query" in stages:
            recs, graph = graph_point(h, rounds=cfg.rounds, ref_nodes=cfg.ref_nodes, sweep=axis,
                                      reference=reference and "graph" in stages,
                                      ref_cache=cache, log=log)
            if "graph" in stages:
                _add(res, recs, log, headline)
        if "query" in stages:
            q, qc = make_queries(h, per_conv=per)
            _add(res, query_point(h, graph, q, qc, rounds=cfg.rounds,
                                  latency_calls=cfg.latency_calls if headline or axis == "sessions"
                                  else 0, ref_queries=cfg.ref_queries, sweep=axis,
                                  reference=reference, log=log), log, headline)
        del h, graph
        if "bm25" in stages:
            terms = make_terms(C, N, doc_len=cfg.doc_len, per_conv=per)
            _add(res, bm25_point(terms, N, device=dev, rounds=cfg.rounds,
                                 ref_queries=cfg.ref_queries, sweep=axis, reference=reference,
                                 log=log), log, headline)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        log(f"  ({time.perf_counter() - t0:.1f} s)")


def _headlines(which, cfg, dev, stages, reference, deadline, res, tmp, log) -> None:
    for stage in which:
        if stage not in stages:
            continue
        if deadline.expired():
            res.skipped.append(f"{stage}: time budget spent")
            log(f"skip {stage}: time budget spent")
            continue
        t0 = time.perf_counter()
        log(f"{stage}:")
        if stage == "encode":
            enc = make_encoder(cfg.encoder, dev, tmp)
            words = cfg.text_shape[1]
            texts = synthetic_texts(cfg.encode_texts, turns=cfg.text_shape[0], words=words)
            recs = encode_point(enc, texts, rounds=max(1, cfg.rounds // 3),
                                reference=reference, log=log)
            del enc
        elif stage == "io":
            recs = io_point(*cfg.io_shape, cfg.dim, tmp, rounds=cfg.rounds,
                            reference=reference, log=log)
        elif stage == "gam":
            recs = _gam_point(cfg, dev, tmp, log)
        elif stage == "search":
            from .stages_online import search_point

            enc = make_encoder(cfg.encoder, dev, tmp)
            recs = search_point(enc, cfg.search_sessions, calls=cfg.latency_calls, log=log)
            del enc
        elif stage == "online":
            recs = _online(cfg, dev, tmp, log)
        elif stage == "durable":
            recs = _durable(cfg, dev, tmp, log)
        elif stage == "scale":
            from ..encode.tiny import make_random_bert
            from .scale import scale_points

            recs = scale_points(cfg.scale_conversations, tmp,
                                make_random_bert(os.path.join(tmp, "scale_bert")), log=log)
        elif stage == "serve":
            from .serve import serve_point

            recs = serve_point(*cfg.serve_shape, clients=cfg.serve_clients,
                               requests=cfg.serve_requests,
                               inprocess_threads=cfg.serve_threads,
                               distinct=cfg.serve_distinct, encoder=cfg.serve_encoder,
                               tmp=tmp, device=str(dev), log=log)
        else:
            from ..synth import write_synthetic

            path = os.path.join(tmp, "index_data.json")
            write_synthetic(path, **cfg.index_shape, progress=False)
            enc = make_encoder(cfg.index_encoder, dev, tmp)
            recs = index_point(path, enc, device=dev, ref_questions=cfg.index_ref_questions,
                               full_haystacks=cfg.index_full_haystacks, reference=reference,
                               log=log)
            recs[0].extra["encoder"] = cfg.index_encoder
            os.unlink(path)
        _add(res, recs, log, headline=True)
        log(f"  ({time.perf_counter() - t0:.1f} s)")


def _durable(cfg: SuiteScale, dev, tmp: str, log) -> list:
    """The durable memory's points: write latency, checkpoint cost against the
    conversations held and at the LongMemEval shape, recovery against the log."""
    from .durable import checkpoint_point, durable_point, recovery_point
    from .online import haystack_index, online_index

    enc = make_encoder(cfg.online_encoder, dev, tmp)
    recs = durable_point(enc, cfg.online_conversations[1], cfg.online_sessions,
                         calls=cfg.online_calls, tmp=tmp, log=log)
    for c in cfg.durable_conversations:
        idx, conv = online_index(c, cfg.online_sessions, enc)
        recs.append(checkpoint_point(idx, enc, conv.sessions[0], tmp,
                                     {"conversations": c, "sessions": cfg.online_sessions},
                                     log=log))
    h, n, pool = cfg.online_haystacks
    idx, sessions = haystack_index(h, n, pool, enc)
    recs.append(checkpoint_point(idx, enc, sessions[0], tmp,
                                 {"haystacks": h, "sessions": n, "pool": pool}, log=log))
    _, conv = online_index(1, cfg.online_sessions, enc)
    for r in cfg.durable_records:
        recs.append(recovery_point(enc, conv, r, tmp, log=log))
    return recs


def _online(cfg: SuiteScale, dev, tmp: str, log) -> list:
    """The memory-service points: one per index size, then the LongMemEval-shaped one."""
    from .online import haystack_point, online_point

    enc = make_encoder(cfg.online_encoder, dev, tmp)
    recs = []
    for c in cfg.online_conversations:
        recs += online_point(enc, c, cfg.online_sessions, calls=cfg.online_calls,
                             device=str(dev), log=log)
    h, n, pool = cfg.online_haystacks
    recs += haystack_point(enc, h, n, pool, calls=cfg.online_calls, device=str(dev), log=log)
    from .online import batch_point

    bh, bn, bp, bb = cfg.batch_shape
    recs += batch_point(enc, bh, bn, bp, batch=bb, device=str(dev), log=log)
    return recs


def scale_with(scale: str, **changes) -> SuiteScale:
    """A copy of ``SCALES[scale]`` with some fields replaced."""
    return replace(SCALES[scale], **changes)


def _gam_point(cfg, dev, tmp, log) -> list:
    """GAM's write and read points (encoding excluded) on a synthetic dataset of the
    index point's shape, against the per-event reference loop, in one run."""
    from ..data import load_dataset
    from ..synth import write_synthetic
    from .gam import bench_gam
    from .timing import Record

    path = os.path.join(tmp, "gam_data.json")
    write_synthetic(path, **cfg.index_shape, progress=False)
    ds = load_dataset(path)
    os.unlink(path)
    enc = make_encoder(cfg.index_encoder, dev, tmp)
    rows = bench_gam(ds, enc, repeats=max(1, cfg.rounds))
    size = {"conversations": len(ds), "sessions": cfg.index_shape.get("sessions")}
    recs = []
    for r in rows:
        impl = "reference" if "reference" in r["name"] else "ours"
        name = r["name"].replace(", reference loop", "")
        if "seconds" in r:
            rec = Record(f"gam {name}", impl, dict(size), [r["seconds"]], 1.0, "runs", "",
                         "encoding excluded", None, None,
                         {k: v for k, v in r.items() if k not in ("name", "seconds")})
        else:
            rec = Record(f"gam {name}", impl, dict(size), [r["p50_ms"] / 1e3], 1.0, "writes",
                         "", "one utterance per call; encoding excluded", None, None,
                         {k: v for k, v in r.items() if k != "name"})
        recs.append(rec)
        log(f"  gam {name:16s} {impl:9s} " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in r.items() if k != "name"))
    return recs
