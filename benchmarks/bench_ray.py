"""Ray scale-out: encoding throughput with 1 vs 2 local workers, and Ray's overhead
over the single-process path at small scale.

    python benchmarks/bench_ray.py [--n 400] [--threads 1]

Texts: turns of LoCoMo conversations conv-26, conv-30 and conv-41 (``MEMGAS_DATA``,
see ``memgas_gpu.testing``) encoded with the
bundled all-MiniLM-L6-v2.  Each worker runs ``--threads`` torch threads; the
single-process baseline runs the same count, so on a 2-core machine the 2-worker
run can at best double the 1-worker rate.  Prints real tokens/s and the ratios.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

def _turns(n: int) -> list[str]:
    from memgas_gpu import load_dataset
    from memgas_gpu.testing import require_real_data

    data = require_real_data("locomo_list")
    return [t for c in load_dataset(data) for s in c.sessions for t in s.turns][:n]


def _rate(enc, texts) -> tuple[float, float]:
    tok = enc.tokenize(texts)
    real = sum(tok.n_tokens(i) for i in range(len(tok)))
    plan = enc.plan(tok)
    t0 = time.perf_counter()
    for _ in enc.encode_batches(tok, plan, progress=False):
        pass
    dt = time.perf_counter() - t0
    return real / dt, dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=400, help="texts to encode")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    args = ap.parse_args(argv)
    from memgas_gpu.distributed import RayEncoder, init_ray
    from memgas_gpu.encode import Encoder

    torch.set_num_threads(args.threads)
    texts = _turns(args.n)
    local = Encoder(device="cpu")
    _rate(local, texts[:16])  # warm-up
    single, t_single = _rate(local, texts)
    t0 = time.perf_counter()
    init_ray(num_cpus=2)
    t_start = time.perf_counter() - t0
    rows = [("single process", single, t_single)]
    for workers in (1, 2):
        enc = RayEncoder({}, num_workers=workers, threads=args.threads)
        _rate(enc, texts[:16])
        rate, dt = _rate(enc, texts)
        enc.shutdown()
        rows.append((f"ray, {workers} worker{'s' if workers > 1 else ''}", rate, dt))
    print(f"{len(texts)} LoCoMo turns, MiniLM, {args.threads} thread(s) per worker; "
          f"ray start-up {t_start:.1f}s")
    print(f"{'run':<18} {'tokens/s':>10} {'seconds':>8}")
    for name, rate, dt in rows:
        print(f"{name:<18} {rate:>10,.0f} {dt:>8.2f}")
    print(f"2 workers / 1 worker: {rows[2][1] / rows[1][1]:.2f}x;  "
          f"ray 1 worker / single process: {rows[1][1] / rows[0][1]:.2f}x (overhead "
          f"{100 * (1 - rows[1][1] / rows[0][1]):.0f}%)")
    return 0


def test_bench_ray(benchmark):  # pragma: no cover - run with --benchmark-enable
    import pytest

    from memgas_gpu.testing import how_to_get_real_data, real_data_path

    if real_data_path("locomo_list") is None:
        pytest.skip(how_to_get_real_data("locomo_list"))
    benchmark.pedantic(main, args=(["--n", "200"],), rounds=1, iterations=1)


if __name__ == "__main__":
    sys.exit(main())
