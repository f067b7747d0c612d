"""Our personalized PageRank against cuGraph's on the same graph and reset vectors.

Used by ``gpu_suite.py`` (one row of its output, also written to ``cugraph.json``).
The graph is the benchmark's association graph of ``C`` haystacks of ``N`` sessions
(block-diagonal, one block per haystack); each question's reset vector is the top-16
node similarities of its own haystack (the kind of seeds the read path uses). Ours
runs every question in one call (one packed row: one question per block); cuGraph's
API takes one personalization vector per call, so it is called once per question on
the whole graph, timed on a subsample and extrapolated. ``alpha`` = MemGAS's damping
0.1 (probability of following an edge) in both; tolerances differ (ours: L1 per block
1e-10; cuGraph: its own norm), so the row also gives the largest score difference on
the timed questions. cuGraph not importable -> the row says so; nothing fails.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

SEEDS = 16


def _problem(n_conv: int, n_sessions: int, dim: int, device):
    from memgas_gpu import ops
    from memgas_gpu.bench.data import make_haystacks, make_queries

    h = make_haystacks(n_conv, n_sessions, dim, device=device)
    indptr, indices = ops.build_association_graph(h.node_emb, h.session_of_node,
                                                  conversation_of_node=h.conv_of_node)
    q, qconv = make_queries(h, per_conv=1)
    per = h.n_nodes // n_conv
    sims = (q[:, None, :] @ h.node_emb.view(n_conv, per, -1)[qconv].transpose(1, 2))[:, 0]
    val, idx = sims.clamp_min(0).topk(min(SEEDS, per), dim=1)
    cols = idx + (qconv * per)[:, None]  # global node ids
    return h, indptr, indices, cols, val.double()


def _ours(indptr, indices, cols, vals, blocks, n: int, device) -> tuple[float, torch.Tensor]:
    from memgas_gpu.ops import personalized_pagerank

    reset = torch.zeros(1, n, dtype=torch.float64, device=device)
    reset[0, cols.flatten()] = vals.flatten()
    run = lambda: personalized_pagerank(indptr, indices, reset, damping=0.1, blocks=blocks)  # noqa
    run()
    best = float("inf")
    for _ in range(3):
        if reset.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = run()
        if reset.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, out[0]


def _cugraph_caller(indptr, indices, n: int):
    """``call(cols, vals) -> [n] scores`` through cugraph (or pylibcugraph)."""
    try:
        import cudf
        import cugraph
    except ImportError:
        cugraph = None
    if cugraph is not None:
        G = cugraph.Graph()
        G.from_cudf_adjlist(cudf.Series(indptr.cpu().numpy()),
                            cudf.Series(indices.cpu().numpy()), None, renumber=False,
                            store_transposed=True)

        def call(cols, vals):
            df = cudf.DataFrame({"vertex": cudf.Series(cols.cpu().numpy()),
                                 "values": cudf.Series(vals.cpu().numpy())})
            pr = cugraph.pagerank(G, alpha=0.1, personalization=df, tol=1e-10, max_iter=100)
            out = torch.zeros(n, dtype=torch.float64)
            out[torch.as_tensor(pr["vertex"].to_numpy())] = torch.as_tensor(
                pr["pagerank"].to_numpy()).double()
            return out

        return call, f"cugraph {cugraph.__version__}"
    try:
        import cupy
        import pylibcugraph as plc
    except ImportError as exc:
        raise ImportError(f"neither cugraph nor pylibcugraph + cupy is importable ({exc})") \
            from None

    handle = plc.ResourceHandle()
    props = plc.GraphProperties(is_symmetric=True, is_multigraph=False)
    G = plc.SGGraph(handle, props, cupy.asarray(indptr.cpu().numpy()),
                    cupy.asarray(indices.cpu().numpy()), None, store_transposed=True,
                    renumber=False, do_expensive_check=False, input_array_format="CSR")

    def call(cols, vals):
        v, s = plc.personalized_pagerank(
            handle, G, None, None, None, None, cupy.asarray(cols.cpu().numpy()),
            cupy.asarray(vals.cpu().numpy()), 0.1, 1e-10, 100, False)[:2]
        out = torch.zeros(n, dtype=torch.float64)
        out[torch.as_tensor(cupy.asnumpy(v))] = torch.as_tensor(cupy.asnumpy(s)).double()
        return out

    return call, f"pylibcugraph {plc.__version__}"


def cugraph_row(device, n_conv: int, n_sessions: int, dim: int, max_calls: int = 20,
                log=print) -> dict:
    """Time ours and cuGraph's personalized PageRank; a dict for the report."""
    t0 = time.perf_counter()
    h, indptr, indices, cols, vals = _problem(n_conv, n_sessions, dim, device)
    n = h.n_nodes
    row: dict = {"shape": f"{n_conv} x {n_sessions} sessions ({n} nodes, "
                          f"{int(indices.numel()) // 2} edges), {n_conv} questions"}
    t_ours, ours = _ours(indptr, indices, cols, vals, h.conv_of_node, n, device)
    row["ours_s"] = t_ours
    try:
        call, lib = _cugraph_caller(indptr, indices, n)
    except Exception as exc:  # noqa: BLE001 - not importable, or an API of another version
        row["cugraph"] = f"not importable or unusable here ({type(exc).__name__}: {exc})"
        row["line"] = (f"cuGraph personalized PageRank, {row['shape']}: ours "
                       f"{t_ours * 1e3:.3g} ms; cuGraph {row['cugraph']}")
        log(row["line"])
        return row
    k = min(n_conv, max_calls)
    per = n // n_conv
    call(cols[0], vals[0] / vals[0].sum())  # warm-up
    times, worst = [], 0.0
    for i in range(k):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        got = call(cols[i], vals[i] / vals[i].sum())
        times.append(time.perf_counter() - t1)
        a, b = i * per, (i + 1) * per
        worst = max(worst, float((got[a:b] - ours[a:b].cpu()).abs().max()))
    t_ref = sum(times) / k * n_conv
    row.update(cugraph=lib, cugraph_s=t_ref, timed_calls=k, max_abs_diff=worst,
               ratio=t_ref / t_ours, seconds=time.perf_counter() - t0)
    note = "measured" if k == n_conv else f"extrapolated from {k} of {n_conv} calls"
    row["line"] = (f"cuGraph personalized PageRank ({lib}), {row['shape']}: ours "
                   f"{t_ours * 1e3:.3g} ms, cuGraph {t_ref * 1e3:.3g} ms ({note}, one call per "
                   f"question) -> ours {row['ratio']:.3g}x; max |diff| {worst:.2g}")
    log(row["line"])
    return row


def main_row(device: str, dry: bool, out_dir: Optional[str] = None, log=print) -> dict:
    """The row gpu_suite.py prints: 500 x 500 on CUDA, tiny on the CPU dry run."""
    import json

    from memgas_gpu._io import atomic_write

    shape = (3, 20, 32) if dry else (500, 500, 768)
    try:
        row = cugraph_row(device, *shape, log=log)
    except Exception as exc:  # noqa: BLE001 - the suite's other results still count
        row = {"line": f"cuGraph personalized PageRank: not measured ({type(exc).__name__}: "
                       f"{exc})"}
        log(row["line"])
    if out_dir:
        from pathlib import Path

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        with atomic_write(Path(out_dir) / "cugraph.json", "w", encoding="utf-8") as f:
            json.dump(row, f, indent=1)
    return row
