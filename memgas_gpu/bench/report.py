"""Report writer: ``report.md`` (tables), ``results.json`` (pytest-benchmark format), PNGs.

``results.json`` follows pytest-benchmark's saved-run layout (``machine_info``,
``commit_info``, ``benchmarks`` with ``group``/``name``/``params``/``stats``/
``extra_info``, ``datetime``, ``version``), so ``pytest-benchmark compare`` reads it;
each point's throughput, ratio, peak memory and notes are in ``extra_info``.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Optional

from .._io import atomic_write, nan_to_null
from .bandwidth import bandwidth_rows
from .limits import RATIO_GOALS, evaluate_goals, limit_seconds
from .scaling import scaling_rows, sweep_series
from .timing import Record, percentile

__all__ = ["ratios", "write_json", "write_markdown", "write_plots", "write_report",
           "goal_table", "bandwidth_table", "online_table", "fmt_seconds", "fmt_rate",
           "fmt_bytes"]

STAGE_TITLE = {"graph": "graph build", "query": "routing + PPR + ranking", "bm25": "BM25",
               "encode": "encoding", "io_save": "index save", "io_load": "index load",
               "index": "end-to-end index"}


def fmt_seconds(s: Optional[float]) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def fmt_rate(x: Optional[float], unit: str) -> str:
    if x is None or math.isnan(x) or math.isinf(x):
        return "-"
    if unit == "bytes":
        return f"{x / 1e9:.3g} GB/s"
    for div, p in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{p} {unit}/s"
    return f"{x:.3g} {unit}/s"


def fmt_bytes(b: Optional[float]) -> str:
    if b is None:
        return "-"
    for div, p in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if b >= div:
            return f"{b / div:.3g} {p}"
    return f"{b:.0f} B"


def _shape(size: dict) -> str:
    return " x ".join(f"{v} {k}" for k, v in size.items())


def ratios(records) -> list[tuple[Record, Record, float]]:
    """``(ours, reference, reference_seconds / ours_seconds)`` for each shared point."""
    refs = {(r.stage, r.sweep, tuple(sorted(r.size.items()))): r
            for r in records if r.impl == "reference"}
    out = []
    for r in records:
        if r.impl != "ours":
            continue
        ref = refs.get((r.stage, r.sweep, tuple(sorted(r.size.items()))))
        if ref is not None and r.seconds > 0:
            out.append((r, ref, ref.seconds / r.seconds))
    return out


def _stats(times: list) -> dict:
    n = len(times)
    mean = sum(times) / n
    sd = math.sqrt(sum((t - mean) ** 2 for t in times) / (n - 1)) if n > 1 else 0.0
    q1, q3 = percentile(times, 25), percentile(times, 75)
    iqr = q3 - q1
    lo = min((t for t in times if t >= q1 - 1.5 * iqr), default=min(times))
    hi = max((t for t in times if t <= q3 + 1.5 * iqr), default=max(times))
    iqr_out = sum(1 for t in times if t < q1 - 1.5 * iqr or t > q3 + 1.5 * iqr)
    sd_out = sum(1 for t in times if abs(t - mean) > sd) if sd else 0
    return {"min": min(times), "max": max(times), "mean": mean, "stddev": sd, "rounds": n,
            "median": percentile(times, 50), "iqr": iqr, "q1": q1, "q3": q3,
            "iqr_outliers": iqr_out, "stddev_outliers": sd_out,
            "outliers": f"{sd_out};{iqr_out}", "ld15iqr": lo, "hd15iqr": hi,
            "ops": 1.0 / mean if mean > 0 else 0.0, "total": sum(times),
            "data": list(times), "iterations": 1}


def write_json(path, records, meta: dict) -> Path:
    """pytest-benchmark compatible ``results.json``."""
    ratio = {id(o): (ref, x) for o, ref, x in ratios(records)}
    benches = []
    for r in records:
        param = f"{r.impl}-{r.size_key()}" + (f"-{r.sweep}" if r.sweep else "")
        extra = {"impl": r.impl, "work": r.work, "unit": r.unit, "rate": r.rate,
                 "sweep": r.sweep, "note": r.note, "host_peak_bytes": r.host_peak_bytes,
                 "device_peak_bytes": r.device_peak_bytes, **r.extra}
        if id(r) in ratio:
            extra["speedup_vs_reference"] = ratio[id(r)][1]
        if r.extra.get("flops") or r.extra.get("bytes"):
            extra["h200_limit_s"] = limit_seconds(r.extra.get("flops") or 0,
                                                  r.extra.get("bytes") or 0)
        benches.append({
            "group": r.stage, "name": f"{r.stage}[{param}]",
            "fullname": f"memgas_gpu.bench::{r.stage}[{param}]",
            "params": {"impl": r.impl, "sweep": r.sweep, **r.size}, "param": param,
            "extra_info": extra,
            "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": len(r.times),
                        "max_time": 0.0, "min_time": 0.0, "warmup": False},
            "stats": _stats(r.times),
        })
    try:
        from importlib.metadata import version

        pb_version = version("pytest-benchmark")
    except Exception:  # not installed: the format is that of 4.x / 5.x
        pb_version = "5.1.0"
    doc = {"machine_info": meta.get("machine_info", {}),
           "commit_info": meta.get("commit_info", {}), "benchmarks": benches,
           "datetime": _dt.datetime.now(_dt.timezone.utc).isoformat(), "version": pb_version,
           "memgas_bench": {k: v for k, v in meta.items() if k not in ("machine_info",
                                                                       "commit_info")}}
    path = Path(path)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(nan_to_null(doc), indent=1, default=str, allow_nan=False))
    return path


def goal_table(records, device_type: str = "cuda") -> list[str]:
    """Markdown lines: the H200 goals, measured, arithmetic limit, % of the limit."""
    lines = ["| goal | target | measured | arithmetic limit (H200) | limit / measured | met |",
             "| --- | --- | --- | --- | --- | --- |"]
    for g in evaluate_goals(records):
        if g["measured"] is None:
            lines.append(f"| {g['what']} | {_target(g)} | not measured at this scale | - | - | - |")
            continue
        if g["kind"] == "max_s":
            meas, lim = fmt_seconds(g["measured"]), fmt_seconds(g["limit"])
            eff = g["limit"] / g["measured"] if g["limit"] and g["measured"] else None
        else:
            meas = fmt_rate(g["measured"], "tokens")
            lim = fmt_rate(g["limit"], "tokens") if g["limit"] else "-"
            eff = g["measured"] / g["limit"] if g["limit"] else None
        met = "yes" if g["met"] else "no"
        if device_type != "cuda":
            met += " (not an H200)"
        lines.append(f"| {g['what']} ({_shape(g.get('size', {}))}) | {_target(g)} | {meas} | "
                     f"{lim} | {'-' if eff is None else f'{eff:.1%}'} | {met} |")
    return lines


def bandwidth_table(records, meta: dict, headline_only: bool = False) -> list[str]:
    """Markdown lines: the memory-bound stages against this machine's measured
    bandwidth (bytes touched, implied time, measured / limit)."""
    bw = meta.get("bandwidth")
    rows = [r for r in bandwidth_rows(records, bw) if r["headline"] or not headline_only]
    if not rows:
        return []
    lines = [f"Measured in this run ({bw['threads']} thread(s), "
             f"{fmt_bytes(bw['buffer_bytes'])} buffers): copy {bw['copy'] / 1e9:.3g} GB/s, "
             f"triad {bw['triad'] / 1e9:.3g} GB/s. Limit = bytes the stage must touch / "
             "triad bandwidth.", "",
             "| stage | shape | bytes touched | limit | measured | measured / limit |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {STAGE_TITLE.get(r['stage'], r['stage'])} | {_shape(r['size'])} | "
                     f"{fmt_bytes(r['bytes'])} | {fmt_seconds(r['limit_s'])} | "
                     f"{fmt_seconds(r['measured_s'])} | {r['ratio']:.3g}x |")
    return lines


def _target(g: dict) -> str:
    if g["kind"] == "max_s":
        return "<= " + fmt_seconds(g["target"])
    return ">= " + fmt_rate(g["target"], "tokens")


def write_markdown(path, records, meta: dict, plots: Optional[list] = None) -> Path:
    mi = meta.get("machine_info", {})
    dev = mi.get("device", "cpu")
    hw = mi.get("gpu") or f"{mi.get('cpu', {}).get('count', '?')} CPU cores " \
                          f"({mi.get('cpu', {}).get('brand_raw', '')})"
    L = ["# memgas_gpu benchmark report", "",
         f"- command: `{meta.get('command', 'memgas bench')}`",
         f"- scale: `{meta.get('scale')}`, device: `{dev}` ({hw}), torch {mi.get('torch')}, "
         f"{mi.get('torch_threads')} torch thread(s), ops backend `{mi.get('ops_backend', '?')}`",
         f"- started {meta.get('started', '?')}, took {meta.get('seconds', 0):.0f} s"
         + (f"; load average at start {', '.join(f'{x:.1f}' for x in mi['load_average'])}"
            if mi.get("load_average") else ""),
         "- times are medians of the timed rounds; `reference` is the straightforward way "
         "(scikit-learn GMM per node, igraph PPR per query, bm25s per question, fixed-64 "
         "unsorted encoding, Python loop per question), in the same run on the same inputs.",
         ""]
    L += ["## Ours vs reference (headline points)", "",
          "| stage | shape | ours | reference | speed-up | CPU goal | ours throughput | note |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for o, ref, x in ratios(records):
        if not o.extra.get("headline"):
            continue
        goal = RATIO_GOALS.get(o.stage)
        L.append(f"| {STAGE_TITLE.get(o.stage, o.stage)} | {_shape(o.size)} | "
                 f"{fmt_seconds(o.seconds)} | {fmt_seconds(ref.seconds)} | {x:.3g}x | "
                 f"{f'>= {goal:g}x' if goal else '-'} | {fmt_rate(o.rate, o.unit)} | "
                 f"{ref.note} |")
    cuda = str(dev).startswith("cuda")
    L += ["", "## Throughput, latency and memory (ours)", "",
          "| stage | shape | median | throughput | p50 latency (1 question) | p99 latency | "
          "host peak | device peak |" + (" H200 limit |" if cuda else ""),
          "| --- " * (9 if cuda else 8) + "|"]
    for r in records:
        if r.impl != "ours" or not r.extra.get("headline"):
            continue
        lim = (fmt_seconds(limit_seconds(r.extra.get("flops") or 0, r.extra.get("bytes") or 0))
               if r.extra.get("flops") or r.extra.get("bytes") else "-")
        L.append(f"| {STAGE_TITLE.get(r.stage, r.stage)} | {_shape(r.size)} | "
                 f"{fmt_seconds(r.seconds)} | {fmt_rate(r.rate, r.unit)} | "
                 f"{fmt_seconds(r.extra.get('latency_p50_s'))} | "
                 f"{fmt_seconds(r.extra.get('latency_p99_s'))} | {fmt_bytes(r.host_peak_bytes)} | "
                 f"{fmt_bytes(r.device_peak_bytes)} |" + (f" {lim} |" if cuda else ""))
    idx = [r for r in records if r.stage == "index" and r.impl == "ours"]
    if idx:
        b = idx[0].extra.get("breakdown_s", {})
        L += ["", "End-to-end index breakdown: " + ", ".join(
            f"{k[:-2]} {fmt_seconds(v)}" for k, v in b.items())
            + f"; {idx[0].extra.get('distinct_texts')} distinct of "
              f"{idx[0].extra.get('texts')} texts encoded"
            + (f"; {idx[0].extra['distinct_sessions']} distinct sessions in "
               f"{idx[0].extra['session_slots']} session slots, "
               f"{idx[0].extra.get('tokens_encoded')} tokens encoded"
               if "distinct_sessions" in idx[0].extra else "")
            + (f"; extrapolated to {idx[0].extra['full_haystacks']} haystacks: "
               f"{fmt_seconds(idx[0].extra['full_seconds'])}" if "full_seconds" in idx[0].extra
               else "") + "."]
    bw = bandwidth_table(records, meta)
    if bw:
        L += ["", "## Memory-bandwidth limit (this machine)", ""] + bw
    on = online_table(records)
    if on:
        L += ["", "## Memory service: latency against the conversations held", ""] + on
    from .durable import durable_table

    du = durable_table(records)
    if du:
        L += ["", "## Durable memory: writes, checkpoints, recovery", ""] + du
    from .serve import serve_rows

    served = serve_rows(records)
    if served:
        L += ["", "## Serving many clients (memgas serve): batching on and off", ""] + served
    L += ["", "## Scaling (log-log slope of time vs size)", "",
          "| stage | axis | impl | sizes | times | slope (all) | slope (top 2) | expected | "
          "peak memory (largest) | why |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in scaling_rows(records):
        hp = s["host_peak_bytes"][-1] if s["host_peak_bytes"] else None
        dp = s["device_peak_bytes"][-1] if s["device_peak_bytes"] else None
        mem = fmt_bytes(hp) + (f" / dev {fmt_bytes(dp)}" if dp else "")
        ex = "*" if any(s["extrapolated"]) else ""
        L.append(f"| {STAGE_TITLE.get(s['stage'], s['stage'])} | {s['axis']} | {s['impl']}{ex} | "
                 f"{', '.join(str(x) for x in s['sizes'])} | "
                 f"{', '.join(fmt_seconds(y) for y in s['seconds'])} | {s['slope']:.2f} | "
                 f"{s['slope_top']:.2f} | {s['expected']:g} | {mem} | {s['why']} |")
    L += ["", "Memory: peak resident set above the process's at the start of the point "
          "(warm-up included; host), peak CUDA allocation above the start (device)."]
    L += ["", "`*`: some reference points are extrapolated from a timed subsample (see "
          "results.json `note`)."]
    L += ["", "## H200 goals", ""]
    L += goal_table(records, "cuda" if cuda else "cpu")
    L += ["", "Arithmetic limit = max(FLOPs / 989 TFLOP/s bf16, bytes / 4.8 TB/s), with the "
          "minimum FLOPs and bytes of the algorithm (memgas_gpu/bench/limits.py)."]
    if meta.get("skipped"):
        L += ["", "Skipped: " + "; ".join(meta["skipped"])]
    if plots:
        L += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    path = Path(path)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L) + "\n")
    return path


def online_table(records) -> list[str]:
    """Markdown rows of the ``online`` stage: p50 / p99 of each operation per index size,
    the log-log slope of p50 against the conversations held, and the LongMemEval-shaped
    point."""
    from .online import slope

    recs = [r for r in records if r.stage == "online"]
    sized = [r for r in recs if "conversations" in r.size]
    if not recs:
        return []
    L = []
    if sized:
        sizes = sorted({r.size["conversations"] for r in sized})
        ops = list(dict.fromkeys(r.impl for r in sized))
        L += ["| operation | " + " | ".join(f"{c} conv." for c in sizes)
              + " | slope | largest / smallest |",
              "| --- " * (len(sizes) + 3) + "|"]
        for op in ops:
            by = {r.size["conversations"]: r for r in sized if r.impl == op}
            cells = [f"{by[c].extra['p50_ms']:.3g} / {by[c].extra['p99_ms']:.3g} ms"
                     if c in by else "-" for c in sizes]
            lo, hi = by.get(sizes[0]), by.get(sizes[-1])
            ratio = (f"{hi.extra['p50_ms'] / lo.extra['p50_ms']:.2f}x"
                     if lo and hi and lo.extra["p50_ms"] > 0 else "-")
            L.append(f"| {op} | " + " | ".join(cells) + f" | {slope(sized, op):.2f} | {ratio} |")
        L += ["", f"Cells: p50 / p99 over the timed calls ({sized[0].size['sessions']} sessions "
              "per conversation, the asked conversation chosen at random each call). Slope: "
              "least-squares slope of log p50 against log conversations (0: flat)."]
    hay = [r for r in recs if "haystacks" in r.size]
    if hay:
        sz = hay[0].size
        L += ["", f"LongMemEval shape ({sz['haystacks']} haystacks x {sz['sessions']} sessions "
              f"from {sz['pool']} distinct sessions, one new question per call):", "",
              "| operation | p50 | p99 |", "| --- | --- | --- |"]
        L += [f"| {r.impl} | {r.extra['p50_ms']:.3g} ms | {r.extra['p99_ms']:.3g} ms |"
              for r in hay if "batch" not in r.size]
    bat = [r for r in recs if "batch" in r.size]
    if bat:
        sz = bat[0].size
        L += ["", f"A batch of {sz['batch']} one-question searches over as many of "
              f"{sz['haystacks']} haystacks ({sz['sessions']} sessions each), `search_many`:",
              "", "| batch | p50 | p99 |", "| --- | --- | --- |"]
        L += [f"| {r.impl} | {r.extra['p50_ms']:.3g} ms | {r.extra['p99_ms']:.3g} ms |"
              for r in bat]
        L += ["", f"New conversations / warm: {bat[0].extra['vs_warm']:.2f}x."]
    return L


def _online_plot(plt, out_dir, records) -> Optional[Path]:
    sized = [r for r in records if r.stage == "online" and "conversations" in r.size]
    if not sized:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for op in dict.fromkeys(r.impl for r in sized):
        pts = sorted((r.size["conversations"], r.extra["p50_ms"]) for r in sized
                     if r.impl == op)
        ax.loglog(*zip(*pts), "-o", label=op)
    ax.set_xlabel("conversations in the index")
    ax.set_ylabel("p50 latency (ms)")
    ax.set_title("memory service: one call at a time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = Path(out_dir) / "online_latency.png"
    with atomic_write(p, "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
    return p


def write_plots(out_dir, records, log=print) -> list[Path]:
    """One log-log PNG per sweep axis: a panel per stage, ours vs reference."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return []
    series = sweep_series(records)
    out = []
    for axis in sorted({k[1] for k in series}):
        stages = sorted({k[0] for k in series if k[1] == axis})
        fig, axes = plt.subplots(1, len(stages), figsize=(4.2 * len(stages), 3.6), squeeze=False)
        for ax, stage in zip(axes[0], stages):
            for impl, style in (("ours", "-o"), ("reference", "--s")):
                pts = series.get((stage, axis, impl))
                if not pts:
                    continue
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                ax.loglog(xs, ys, style, label=impl)
                ex = [(x, y) for x, y, r in pts if r.note.startswith("extrapolated")]
                if ex:
                    ax.loglog(*zip(*ex), "s", mfc="none", mec="k", ms=9,
                              label="extrapolated" if impl == "reference" else None)
            ax.set_title(STAGE_TITLE.get(stage, stage))
            ax.set_xlabel("sessions per haystack" if axis == "sessions" else "haystacks")
            ax.set_ylabel("seconds")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        p = Path(out_dir) / f"scaling_{axis}.png"
        with atomic_write(p, "wb") as f:
            fig.savefig(f, dpi=110, format="png")
        plt.close(fig)
        out.append(p)
    p = _online_plot(plt, out_dir, records)
    if p is not None:
        out.append(p)
    return out


def write_report(out_dir, records, meta: dict, log=print) -> dict:
    """Write ``report.md``, ``results.json`` and the PNGs into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(out, records, log)
    return {"report": write_markdown(out / "report.md", records, meta, plots),
            "json": write_json(out / "results.json", records, meta), "plots": plots}
