"""Median wall time of the read path (routing + PPR + ranking) in the two shapes, for
before/after comparisons of two trees: run it in each tree, back to back.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/read_path_shapes.py 1 after

Shapes: one 500-session conversation with 200 questions (batched), and 64 haystacks of
500 sessions with one question each (LongMemEval). Synthetic embeddings
(:func:`memgas_gpu.bench.data.make_haystacks`), the real association graph.
"""
import sys
import time

import torch

from memgas_gpu.bench.data import make_haystacks, make_queries
from memgas_gpu.bench.stages import graph_runner, query_runner


def main(threads: int, label: str) -> None:
    torch.set_num_threads(threads)
    out = []
    for C, N, per in ((1, 500, 200), (64, 500, 1)):
        h = make_haystacks(C, N, 384)
        g = graph_runner(h)()
        q, qc = make_queries(h, per_conv=per)
        run = query_runner(h, g, q, qc)
        for _ in range(2):
            run()
        ts = []
        for _ in range(9):
            t = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t)
        out.append(f"{C}x{N}x{per}: {sorted(ts)[4] * 1e3:.2f} ms")
    print(label, threads, "threads:", "; ".join(out))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1, sys.argv[2] if len(sys.argv) > 2 else "")
