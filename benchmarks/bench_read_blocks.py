"""Read path in the LongMemEval shape, stage by stage: the packed MemGAS read path as
plain op calls against the blocks of ``read_blocks.py``, in one run on the same inputs,
with this machine's memory bandwidth for the floor.

    OMP_NUM_THREADS=1 python benchmarks/bench_read_blocks.py            # 64 x 500, d=384
    python benchmarks/bench_read_blocks.py --haystacks 16 --rounds 3    # quicker

Each "current" stage is the straightforward way (one product per conversation, a
scatter into ``[Q, G, N]`` copies, boolean-mask indexing); medians of ``--rounds`` timed runs after one warm-up, in
process CPU time (with one thread, the work itself: on a shared machine the wall time
also counts the waits for a core; the totals give both).
Prints a markdown table (docs/performance.md keeps the measured one).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from memgas_gpu import ops
from memgas_gpu.bench.bandwidth import measure_bandwidth
from memgas_gpu.bench.data import N_GRAN, make_haystacks, make_queries
from memgas_gpu.ops.graph import node_layout

import read_blocks as blocks  # benchmarks/read_blocks.py (the script's folder is on sys.path)


WALL: dict = {}


def timed(fn, rounds: int) -> float:
    """Median process CPU time of ``fn()`` (1 thread: the time the work takes; on a
    shared machine the wall time also counts waiting for a core, kept in WALL)."""
    fn()
    ts, ws = [], []
    for _ in range(rounds):
        t0, w0 = time.process_time(), time.perf_counter()
        fn()
        ts.append(time.process_time() - t0)
        ws.append(time.perf_counter() - w0)
    WALL[fn] = statistics.median(ws)
    return statistics.median(ts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--haystacks", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    C, N, d = args.haystacks, args.sessions, args.dim
    h = make_haystacks(C, N, d)
    t0 = time.perf_counter()
    indptr, indices = ops.build_association_graph(h.node_emb, h.session_of_node,
                                                  conversation_of_node=h.conv_of_node)
    print(f"graph of {C} x {N} sessions built in {time.perf_counter() - t0:.1f} s "
          f"({indices.numel() // 2} edges)", flush=True)
    q, qc = make_queries(h, per_conv=1)
    emb, conv, gran = h.node_emb, h.conv_of_node, h.gran_of_node
    n = emb.shape[0]
    count = torch.bincount(conv, minlength=C)
    start = torch.cumsum(count, 0) - count
    n_max = int(count.max())
    N_max = n_max // N_GRAN
    Q = q.shape[0]
    _, _, rank = node_layout(h.session_of_node, conv)
    bw = measure_bandwidth("cpu")
    rows = []

    # ---- current stages (the straightforward calls, CPU path) --------------------------
    def cur_sims():
        out = torch.zeros(Q, n_max)
        order = torch.argsort(qc, stable=True)
        convs, sizes = torch.unique_consecutive(qc[order], return_counts=True)
        o = 0
        for a, k_n, k in zip(start[convs].tolist(), count[convs].tolist(), sizes.tolist()):
            qi = order[o:o + k]
            o += k
            out[qi, :k_n] = q[qi] @ emb[a:a + k_n].T
        return out

    sims = cur_sims()
    col = torch.arange(n_max)
    ok = col[None, :] < count[qc][:, None]
    pos = torch.where(ok, start[qc][:, None] + col[None, :], torch.zeros_like(col)[None, :])

    def cur_route_seeds():
        g, s = gran[pos], rank[pos]
        flat = torch.where(ok, g * N_max + s, torch.full_like(g, N_GRAN * N_max))
        S = torch.zeros(Q, N_GRAN * N_max + 1).scatter_(1, flat, sims)
        okm = torch.zeros(Q, N_GRAN * N_max + 1, dtype=torch.bool).scatter_(
            1, flat, torch.ones_like(flat, dtype=torch.bool))
        w = ops.entropy_router(S[:, :-1].view(Q, N_GRAN, N_max), 0.2, "inverse",
                               okm[:, :-1].view(Q, N_GRAN, N_max))
        return ops.seed_scores(w.gather(1, g) * sims, 15, ok).to(torch.float64)

    seeds = cur_route_seeds()
    slot, R = ops.query_waves(qc)

    def cur_reset():
        reset = torch.zeros(R, n, dtype=torch.float64)
        rws = slot[:, None].expand(Q, n_max)
        reset.index_put_((rws[ok], pos[ok]), seeds[ok], accumulate=True)
        return reset

    reset = cur_reset()

    def ppr():
        return ops.personalized_pagerank(indptr, indices, reset, 0.1, 1e-10, 100, blocks=conv)

    p = ppr()

    def cur_sums():
        rws = slot[:, None].expand(Q, n_max)
        node_p = torch.where(ok, p[rws, pos], torch.zeros_like(seeds))
        out = torch.zeros(Q, N_max + 1, dtype=torch.float64)
        tgt = torch.where(ok, rank[pos], torch.full_like(pos, N_max))
        return out.scatter_add_(1, tgt, node_p)[:, :N_max]

    def cur_total():  # the stages above, in sequence
        cur_sims()
        cur_route_seeds()
        cur_reset()
        ppr()
        return cur_sums(), None

    # ---- new blocks ---------------------------------------------------------------
    pattern = blocks.block_pattern(qc, start, count, n)
    emb_h = emb.half()
    n_sess = count[qc] // N_GRAN

    def new_total():
        return blocks.regular_packed_scores(q, qc, emb, start, count, indptr, indices, conv)

    r = args.rounds
    sims_bytes = Q * n_max * d * 4
    t_cur, t_new = timed(cur_sims, r), timed(
        lambda: blocks.packed_similarities(q, qc, emb, start, count, n_max, pattern=pattern), r)
    t_half = timed(lambda: blocks.packed_similarities(q, qc, emb_h, start, count, n_max,
                                                   half_storage=True), r)
    rows.append(("similarities (fp32)", t_cur, t_new, sims_bytes))
    rows.append(("similarities, fp16 storage (not rank-preserving)", t_cur, t_half,
                 sims_bytes // 2))
    rows.append(("routing + seeds", timed(cur_route_seeds, r), timed(
        lambda: blocks.regular_router_seeds(sims, n_sess, N_GRAN), r), None))
    rows.append(("PPR reset rows", timed(cur_reset, r), timed(
        lambda: blocks.packed_reset(seeds, slot, R, qc, start, count, n), r), None))
    t_ppr = timed(ppr, r)
    rows.append(("PPR (native, unchanged)", t_ppr, t_ppr, None))
    rows.append(("session sums", timed(cur_sums, r), timed(
        lambda: blocks.packed_session_sums(p, slot, qc, start, count, n_max, N_GRAN), r), None))
    a, _ = cur_total()
    b, _ = new_total()
    same = torch.equal(torch.argsort(a, dim=1, descending=True, stable=True),
                       torch.argsort(b, dim=1, descending=True, stable=True))
    t_a, t_b = timed(cur_total, r), timed(new_total, r)
    rows.append(("total (current stages in sequence vs regular_packed_scores)", t_a, t_b,
                  None))
    rows.append(("total, wall clock", WALL[cur_total], WALL[new_total], None))
    print(f"\n{C} haystacks x {N} sessions, d = {d}, {Q} questions (one each), "
          f"{args.threads} thread(s); triad bandwidth {bw['triad'] / 1e9:.3g} GB/s; "
          f"same rankings: {same}\n")
    print("| stage (CPU time) | current | blocks | speed-up | bytes (min) | bandwidth floor |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, tc, tn, nbytes in rows:
        floor = f"{nbytes / bw['triad'] * 1e3:.1f} ms" if nbytes else "-"
        mb = f"{nbytes / 1e6:.0f} MB" if nbytes else "-"
        print(f"| {name} | {tc * 1e3:.1f} ms | {tn * 1e3:.1f} ms | {tc / tn:.2f}x | {mb} | "
              f"{floor} |")


if __name__ == "__main__":
    main()
