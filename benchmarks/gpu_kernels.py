"""Timings of the native kernels alone at LongMemEval-M scale (run by ``gpu_suite.sh``).

    python benchmarks/gpu_kernels.py             # on a CUDA machine, after gpu_check.sh
    python benchmarks/gpu_kernels.py --dry-run   # tiny sizes, CPU kernels (logic check)

Rows (kernel time only, inputs prepared beforehand; best of 5, synchronised):

* ``gmm1d`` on 1M rows of 30 similarity-like points (float32, the m <= 32 instance) and
  on 250k rows of 100 points (the m <= 128 instance): the kernel without per-thread
  arrays, rows staged in shared memory; against the torch op on the same rows.
* ``ppr`` on a 1M-node graph of 500 blocks (LongMemEval-M: 500 haystacks of 500
  sessions x 4 nodes), one reset row across all blocks: to convergence (``tol=1e-10``,
  converged blocks skipped, checked on the device every iteration) and for exactly 100
  iterations (``tol=0``: nothing converges, nothing skipped); against the torch op.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
for _ in range(3):  # a bare GPU machine may lack the I/O extras the package imports
    try:
        import memgas_gpu  # noqa: E402, F401
        break
    except ModuleNotFoundError as exc:
        if exc.name not in ("tqdm", "ijson"):
            raise
        import types
        print(f"[gpu_kernels] note: {exc.name} is not installed; using a stub (unused here)")
        stub = types.ModuleType(exc.name)
        stub.tqdm = lambda it=None, *a, **k: it
        sys.modules[exc.name] = stub

from memgas_gpu.ops import _kernels, personalized_pagerank, symmetric_csr  # noqa: E402
from memgas_gpu.ops.gmm1d import first_centre_table, gmm1d_accept  # noqa: E402


def best_of(fn, dev: torch.device, repeat: int = 5) -> float:
    """Best wall time of ``fn()`` in seconds over ``repeat`` runs after a warm-up
    (synchronised on CUDA)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return best


def similarity_rows(B: int, m: int, dev: torch.device, seed: int = 0) -> torch.Tensor:
    """Rows sorted descending: a high cluster (a third) over a low one, as top-m scores."""
    g = torch.Generator(device=dev).manual_seed(seed)
    hi = 0.6 + 0.1 * torch.rand(B, m // 3, generator=g, device=dev)
    lo = 0.2 + 0.15 * torch.rand(B, m - m // 3, generator=g, device=dev)
    return torch.cat([hi, lo], 1).sort(dim=1, descending=True).values.contiguous()


def block_graph(n_blocks: int, per: int, deg: int, dev: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = n_blocks * per
    src = torch.randint(0, n, (deg * n // 2,), generator=g)
    dst = (src // per) * per + torch.randint(0, per, (deg * n // 2,), generator=g)
    indptr, indices = symmetric_csr(torch.stack([src, dst]), n)
    blocks = torch.arange(n) // per
    reset = torch.zeros(1, n, dtype=torch.float64)
    reset[0, torch.randint(0, n, (15 * n_blocks,), generator=g)] = 1.0
    return indptr.to(dev), indices.to(dev), blocks.to(dev), reset.to(dev)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    args = ap.parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device; use --dry-run for a CPU logic check")
        return 2
    dev = torch.device("cpu" if dry else "cuda")
    rows_out = []

    def row(name: str, seconds: float, work: str, ref: float = None) -> None:
        ratio = f"{ref / seconds:.1f}x the torch op" if ref else ""
        rows_out.append((name, f"{seconds * 1e3:.3f} ms", work, ratio))
        print(f"[gpu_kernels] {name}: {seconds * 1e3:.3f} ms ({work}) {ratio}", flush=True)

    for B, m in ((1000, 30), (200, 100)) if dry else ((1_000_000, 30), (250_000, 100)):
        xs = similarity_rows(B, m, dev)
        n = torch.full((B,), m, dtype=torch.int64, device=dev)
        table = torch.tensor(first_centre_table(m), dtype=torch.int64, device=dev)
        params = (float(torch.finfo(torch.float32).eps), 1e-3, 1e-6, 100, 1e-4, 300)
        t = best_of(lambda: _kernels.gmm1d(xs, n, table, params), dev)
        ref = best_of(lambda: gmm1d_accept(xs, backend="torch"), dev, repeat=1)
        row(f"gmm1d kernel, m={m}", t, f"{B / t / 1e6:.2f} M rows/s, {B} rows", ref)

    n_blocks, per = (10, 100) if dry else (500, 2000)
    indptr, indices, blocks, reset = block_graph(n_blocks, per, 10, dev)
    for tol, label in ((1e-10, "to convergence"), (0.0, "100 iterations")):
        def run(backend):
            return personalized_pagerank(indptr, indices, reset, tol=tol, max_iter=100,
                                         blocks=blocks, backend=backend)
        t = best_of(lambda: run("native"), dev)
        ref = best_of(lambda: run("torch"), dev, repeat=1)
        row(f"ppr kernel, {label}", t, f"{n_blocks * per} nodes, {indices.numel()} edges, "
            f"{n_blocks} blocks, 1 row", ref)
    print("\n| kernel | time | work | vs torch |\n|---|---|---|---|")
    for r in rows_out:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
