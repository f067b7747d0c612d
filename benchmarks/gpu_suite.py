"""The benchmark suite at LongMemEval-M scale on a GPU; see ``gpu_suite.sh``.

Runs :func:`memgas_gpu.bench.run_suite` at scale ``m`` (haystacks 1 -> 500 of 500 sessions,
d = 768; sessions 50 -> 5,000; BERT-base-size random encoder in bf16; an M-shaped
index slice of 10 haystacks extrapolated to 500) with a wall-clock budget (sweep points
that would start after it are skipped), writes the report, and prints the goal table
last. ``--dry-run`` runs the same logic at scale ``tiny`` on the CPU. It also times
cuGraph's personalized PageRank against ours on the same graph and reset vectors
(``gpu_cugraph.py``; the row says so when cuGraph is not importable), and the native
kernels alone (``gpu_kernels.py``: the GMM without per-thread arrays, the PPR that skips
converged blocks).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpu_cugraph.py


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_gpu", help="report folder (default bench_gpu)")
    ap.add_argument("--budget", type=float, default=390.0,
                    help="seconds after which no new point starts (default 390)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny scale (logic check)")
    ap.add_argument("--scale", default=None, help="suite scale (default m; tiny with --dry-run)")
    ap.add_argument("--stages", default=None, help="comma-separated subset of the stages")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference timings")
    ap.add_argument("--no-cugraph", action="store_true", help="skip the cuGraph PPR row")
    ap.add_argument("--no-kernels", action="store_true", help="skip the kernel timings")
    args = ap.parse_args(argv)

    import torch

    from memgas_gpu.bench import STAGES, run_suite, write_report
    from memgas_gpu.bench.report import goal_table, ratios, fmt_rate, fmt_seconds, STAGE_TITLE

    if args.dry_run:
        device, scale = "cpu", args.scale or "tiny"
        print("dry run: CPU, tiny scale (numbers are not meaningful)", flush=True)
    elif not torch.cuda.is_available():
        print("gpu_suite: CUDA is not available on this machine; nothing measured. "
              "Run it on a GPU machine, or use --dry-run for a CPU logic check.")
        return 2
    else:
        device, scale = "cuda", args.scale or "m"
        print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}", flush=True)
    stages = args.stages.split(",") if args.stages else list(STAGES)
    t0 = time.perf_counter()
    res = run_suite(scale, device=device, stages=stages, budget_s=args.budget,
                    reference=not args.no_reference,
                    log=lambda m: print(m, flush=True))
    res.meta["command"] = "bash benchmarks/gpu_suite.sh " + " ".join(argv or sys.argv[1:])
    res.meta["skipped"] = res.skipped
    paths = write_report(args.out, res.records, res.meta)
    print(f"\nwrote {paths['report']}, {paths['json']}, {len(paths['plots'])} plot(s); "
          f"{time.perf_counter() - t0:.0f} s in all")
    for o, ref, x in ratios(res.records):
        if o.extra.get("headline"):
            print(f"{STAGE_TITLE.get(o.stage, o.stage):24s} ours {fmt_seconds(o.seconds):>9s}  "
                  f"reference {fmt_seconds(ref.seconds):>9s}  {x:8.3g}x  "
                  f"{fmt_rate(o.rate, o.unit)}")
    if res.skipped:
        print("skipped (time budget): " + "; ".join(res.skipped))
    if not args.no_cugraph:
        from gpu_cugraph import main_row

        print()
        main_row(device, args.dry_run, args.out, log=lambda m: print(m, flush=True))
    if not args.no_kernels:
        import gpu_kernels

        print()
        gpu_kernels.main(["--dry-run"] if args.dry_run else [])
    print()
    print("\n".join(goal_table(res.records, "cuda" if device == "cuda" else "cpu")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
