"""``memgas bench --out DIR``: run the benchmark suite and write its report."""
from __future__ import annotations

import shlex
import sys
import time

import click

from ._common import FiniteFloat, PathArg, check_out_dir, check_runtime, info, quiet_option

# kept here (not imported) so `memgas --help` does not import torch; a test checks they
# equal memgas_gpu.bench.suite.SCALES / STAGES
SCALES = ("tiny", "s", "m")
STAGES = ("graph", "query", "bm25", "encode", "io", "index", "search", "online", "gam",
          "durable", "serve", "scale")
#: what runs when no stage is named: every stage but ``scale`` (folders of up to 100,000
#: conversations: minutes and 400 MB of disk; name it to run it)
DEFAULT_STAGES = tuple(s for s in STAGES if s != "scale")


@click.command("bench")
@click.option("--out", required=True, type=PathArg(file_okay=False),
              help="Folder for report.md, results.json and the PNG plots.")
@click.option("--scale", type=click.Choice(SCALES), default="s", show_default=True,
              help="tiny: smoke test (seconds); s: 2 CPU cores in a few minutes; m: "
                   "LongMemEval-M shape with the full sweeps (sessions 50 -> 5,000, "
                   "haystacks 1 -> 500), meant for one H200.")
@click.option("--device", default=None, help="cpu, cuda, cuda:1 … [default: auto].")
@click.option("--stages", default=",".join(DEFAULT_STAGES), show_default=True,
              help="Comma-separated subset of the stages (scale: only when named).")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="torch intra-op threads [default: 1 on CPU, like the single-threaded "
                   "reference].")
@click.option("--budget", "budget_s", type=FiniteFloat(1), default=None,
              help="Wall-clock seconds; sweep points after it are skipped.")
@click.option("--no-reference", is_flag=True, help="Time only our implementation.")
@quiet_option
def bench(out, scale, device, stages, threads, budget_s, no_reference) -> None:
    """Benchmark every stage, ours vs the reference way; write report.md, results.json
    and log-log scaling plots to OUT."""
    from ..bench import run_suite, write_report
    from ..bench.report import bandwidth_table, goal_table

    device = check_runtime(device)
    check_out_dir(out)
    chosen = [s.strip() for s in stages.split(",") if s.strip()]
    bad = sorted(set(chosen) - set(STAGES))
    if not chosen:  # ran nothing and wrote an empty report, exit 0
        raise click.BadParameter(f"no stage named; choose from {', '.join(STAGES)}",
                                 param_hint="'--stages'")
    if bad:
        raise click.BadParameter(f"unknown {bad}; choose from {', '.join(STAGES)}",
                                 param_hint="'--stages'")
    log = info
    t0 = time.perf_counter()
    res = run_suite(scale, device=device, stages=chosen, threads=threads, budget_s=budget_s,
                    reference=not no_reference, log=log)
    res.meta["command"] = "memgas " + " ".join(shlex.quote(a) for a in sys.argv[1:]) \
        if sys.argv and sys.argv[0].endswith("memgas") else \
        f"memgas bench --scale {scale} --out {out}"
    res.meta["skipped"] = res.skipped
    paths = write_report(out, res.records, res.meta, log=log)
    dev = res.meta["machine_info"]["device"]
    click.echo("\n".join(_summary(res.records)))
    bw = bandwidth_table(res.records, res.meta, headline_only=True)
    if bw:
        click.echo("\n" + "\n".join(bw))
    if dev.startswith("cuda"):
        click.echo("\n".join(goal_table(res.records)))
    from ..bench.serve import serve_rows

    served = serve_rows(res.records)
    if served:
        click.echo("\n" + "\n".join(served))
    click.echo(f"wrote {paths['report']}, {paths['json']} and {len(paths['plots'])} plot(s) "
               f"in {time.perf_counter() - t0:.0f} s")


def _summary(records) -> list[str]:
    from ..bench.report import STAGE_TITLE, fmt_rate, fmt_seconds, ratios

    lines = [f"{'stage':26s} {'shape':40s} {'ours':>10s} {'reference':>10s} {'speed-up':>9s}"
             f"  throughput"]
    for o, ref, x in ratios(records):
        if o.extra.get("headline"):
            shape = " x ".join(str(v) for v in o.size.values()) + " (" + ",".join(o.size) + ")"
            lines.append(f"{STAGE_TITLE.get(o.stage, o.stage):26s} {shape[:40]:40s} "
                         f"{fmt_seconds(o.seconds):>10s} {fmt_seconds(ref.seconds):>10s} "
                         f"{x:8.3g}x  {fmt_rate(o.rate, o.unit)}")
    return lines
