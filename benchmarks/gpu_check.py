"""GPU check of the native kernels: CUDA vs CPU on fresh random inputs, then timings at
LongMemEval-M scale (500 conversations x 500 sessions x 4 granularities = 1M nodes).

    bash benchmarks/gpu_check.sh            # builds the CUDA extension, then runs this
    python benchmarks/gpu_check.py --dry-run  # tiny sizes on the CPU (tested in CI)

Prints one line per step and a table last. ``--dry-run`` runs every step on the CPU
with tiny sizes, comparing the native CPU kernels with the torch ops instead of CUDA
with CPU, so the script itself is checked where no GPU is.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_kernels.py
from gpu_kernels import best_of as timed  # noqa: E402  (also makes memgas_gpu importable)

import memgas_gpu as mg  # noqa: E402
from memgas_gpu import _native  # noqa: E402
from memgas_gpu.ops import (build_association_graph, gmm1d_accept,  # noqa: E402
                            personalized_pagerank)

ROWS = []  # (step, value, target, ok)


def report(step: str, value: str, target: str = "", ok=None) -> None:
    ROWS.append((step, value, target, "" if ok is None else ("ok" if ok else "FAIL")))
    print(f"[gpu_check] {step}: {value} {('(target ' + target + ')') if target else ''}",
          flush=True)


def gmm_rows(n: int, m: int, g: torch.Generator) -> torch.Tensor:
    """Rows of five kinds: normal, bimodal, ties, near-constant, similarity-like."""
    k = n // 5
    a = torch.randn(k, m, generator=g)
    b = (torch.where(torch.rand(k, m, generator=g) < 0.4, 0.8, 0.2)
         + 0.05 * torch.randn(k, m, generator=g))
    c = torch.randint(0, 4, (k, m), generator=g) / 4.0
    d = 0.5 + 1e-3 * torch.rand(k, 1, generator=g) * torch.randn(k, m, generator=g)
    e = torch.sort(0.3 + 0.15 * torch.randn(n - 4 * k, m, generator=g).abs(), dim=1,
                   descending=True).values
    return torch.cat([a, b, c, d, e]).float()


def conversations(C: int, S: int, d: int, dev: torch.device, seed: int = 0):
    """``C`` conversations of ``S`` sessions x 4 granularities, topic-clustered."""
    g = torch.Generator(device=dev).manual_seed(seed)
    n_per = 4 * S
    kw = dict(generator=g, device=dev)
    topics = torch.randn(C, 8, d, **kw)
    t = torch.randint(0, 8, (C, S), **kw)
    sess = topics.gather(1, t[:, :, None].expand(C, S, d)) + 0.8 * torch.randn(C, S, d, **kw)
    E = sess.repeat_interleave(4, dim=1).add_(torch.randn(C, n_per, d, **kw), alpha=0.7)
    E = torch.nn.functional.normalize(E.reshape(C * n_per, d), dim=1)
    s = torch.arange(S).repeat_interleave(4).repeat(C).to(dev)
    gran = torch.arange(4).repeat(C * S).to(dev)
    conv = torch.arange(C).repeat_interleave(n_per).to(dev)
    return E, s, gran, conv


def _edge_set(indptr: torch.Tensor, indices: torch.Tensor) -> set:
    rows = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr.diff())
    return set(zip(rows.tolist(), indices.tolist()))


def check_parity(dev: torch.device, dry: bool, g: torch.Generator) -> None:
    """Native on ``dev`` vs the CPU reference: CUDA vs native CPU (or native vs torch)."""
    ref_backend = "torch" if dry else "native"
    rows = gmm_rows(2000 if dry else 200_000, 30, g)
    a = gmm1d_accept(rows.to(dev), backend="native").cpu()
    b = gmm1d_accept(rows, backend=ref_backend)
    same = float((a == b).all(dim=1).double().mean())
    report("gmm1d masks identical", f"{same:.4%} of {len(rows)} rows", "100%", same == 1.0)

    n_blk, per = (5, 60) if dry else (200, 2000)
    n = n_blk * per
    blocks = torch.arange(n) // per
    src = torch.randint(0, n, (8 * n,), generator=g)
    dst = blocks[src] * per + torch.randint(0, per, (8 * n,), generator=g)
    keep = (src % per) < per * 9 // 10  # the last tenth of every block is isolated
    indptr, indices = mg.ops.symmetric_csr(torch.stack([src[keep], dst[keep]]), n)
    reset = torch.rand(6, n, generator=g).double()
    reset[reset < 0.95] = 0
    reset[1] = 0  # an all-zero row
    for blk in (None, blocks):
        p = personalized_pagerank(indptr.to(dev), indices.to(dev), reset.to(dev),
                                  blocks=None if blk is None else blk.to(dev),
                                  backend="native").cpu()
        q = personalized_pagerank(indptr, indices, reset, blocks=blk, backend=ref_backend)
        diff = float((p - q).abs().max())
        report(f"ppr max abs diff ({'blocks' if blk is not None else 'one graph'})",
               f"{diff:.1e}", "<= 1e-12", diff <= 1e-12)

    E, s, _, conv = conversations(2, 30 if dry else 300, 64, torch.device("cpu"))
    ip_a, ix_a = build_association_graph(E.to(dev), s.to(dev), conversation_of_node=conv.to(dev))
    ip_b, ix_b = build_association_graph(E, s, conversation_of_node=conv, backend=ref_backend)
    A, B = _edge_set(ip_a.cpu(), ix_a.cpu()), _edge_set(ip_b, ix_b)
    jac = len(A & B) / max(1, len(A | B))
    report("graph edges shared (Jaccard)", f"{jac:.4%} of {len(B) // 2} edges",
           "100% (GPU and CPU similarities may round differently)", jac >= 0.999)


def check_speed(dev: torch.device, dry: bool, g: torch.Generator, C: int, S: int,
                d: int) -> None:
    E, s, gran, conv = conversations(C, S, d, dev)
    n = E.shape[0]
    report("scale", f"{C} conversations x {S} sessions = {n} nodes, d={d}")
    t = timed(lambda: build_association_graph(E, s, conversation_of_node=conv), dev, 2)
    indptr, indices = build_association_graph(E, s, conversation_of_node=conv)
    report("graph build", f"{t * 1e3:.1f} ms ({indices.numel() // 2} edges)", "<= 300 ms",
           None if dry else t <= 0.3)
    rows = gmm_rows(n, 30, g).to(dev)
    t = timed(lambda: gmm1d_accept(rows, backend="native"), dev)
    report("gmm1d (fit + sort + scatter)", f"{t * 1e3:.2f} ms for {n} rows", "<= 15 ms",
           None if dry else t <= 0.015)

    Q = C  # LongMemEval: one question per haystack
    qconv = torch.arange(Q, device=dev)
    qe = torch.nn.functional.normalize(E[qconv * 4 * S + 4 * (S // 2)]
                                       + 0.1 * torch.randn(Q, d, device=dev), dim=1)
    from memgas_gpu.bench.data import index_from_nodes
    from memgas_gpu.retrieve import PRESETS, QueryBatch
    from memgas_gpu.retrieve.engine import score

    view = index_from_nodes(E, [S] * C, (indptr, indices)).view()

    def run():
        return score(view, QueryBatch(qe, qconv), PRESETS["memgas"], str(dev))

    t = timed(run, dev)
    report("read path (route + seeds + PPR + sessions)",
           f"{t * 1e3:.2f} ms for {Q} queries", "<= 2 ms", None if dry else t <= 0.002)
    reset = torch.zeros(1, n, dtype=torch.float64, device=dev)
    reset[0, torch.randint(0, n, (15 * Q,), device=dev)] = 1.0
    ix32 = indices.int()
    t = timed(lambda: personalized_pagerank(indptr, ix32, reset, blocks=conv,
                                            backend="native"), dev, 5)
    report("PPR op (1 row x all blocks)", f"{t * 1e3:.3f} ms", "<= 0.5 ms",
           None if dry else t <= 0.0005)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    ap.add_argument("--conversations", type=int, default=500)
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--dim", type=int, default=768)
    args = ap.parse_args()
    dry = args.dry_run
    dev = torch.device("cpu" if dry else "cuda")
    if dry:
        args.conversations, args.sessions, args.dim = 3, 20, 32
    info = _native.C.build_info() if _native.C else None
    report("backend", f"{mg.backend(dev)}; build {info}")
    if _native.C is not None:  # the CUDA self-check of every kernel (auto's gate)
        _native._CHECK_KINDS.add(dev.type)  # the dry run checks the CPU kernels instead
        kernels = mg.backend(dev, detail=True)["kernels"]
        for op, status in kernels.items():
            report(f"self-check {op}", status, "passed", status == "passed")
    if not dry and mg.backend(dev) != "native-cuda":
        report("CUDA kernels", "missing: run bash benchmarks/gpu_check.sh", "", False)
    else:
        g = torch.Generator().manual_seed(0)
        check_parity(dev, dry, g)
        check_speed(dev, dry, g, args.conversations, args.sessions, args.dim)
    w = max(len(r[0]) for r in ROWS)
    print("\n| step | result | target | |\n|---|---|---|---|")
    for step, value, target, ok in ROWS:
        print(f"| {step:<{w}} | {value} | {target} | {ok} |")
    return 1 if any(r[3] == "FAIL" for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
