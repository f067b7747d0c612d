"""BM25 as sparse products vs bm25s: every question of LoCoMo conversations 26, 30 and 41
against their turns.

    python benchmarks/bench_bm25.py [--device cuda] [--repeat 5]

Prints the time to score every question of every conversation against that
conversation's turns (one batched product) and the bm25s time (index per conversation,
one ``get_scores`` call per question), and checks that the scores agree.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from memgas_gpu import load_dataset
from memgas_gpu.lexical import TermMatrix, Tokenizer, Vocabulary, bm25_scores, bm25_weights

from memgas_gpu.testing import real_data_path

DATA = real_data_path("locomo_list")  # MEMGAS_DATA (see memgas_gpu.testing), or None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(DATA) if DATA else None, required=DATA is None,
                    help="LoCoMo file [default: locomo/locomo_dev.json under MEMGAS_DATA]")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--copies", type=int, default=1,
                    help="replicate the conversations (scale test)")
    args = ap.parse_args()
    ds = load_dataset(args.data)
    tok = Tokenizer()
    vocab = Vocabulary()
    docs, dgroup, queries, qgroup = [], [], [], []
    for g, c in enumerate([c for _ in range(args.copies) for c in ds]):
        for s in c.sessions:
            for t in s.turns:
                docs.append(vocab.encode(tok(t)))
                dgroup.append(g)
        for q in c.questions:
            queries.append(tok(q.text))
            qgroup.append(g)
    D = TermMatrix.from_ids(docs)
    Qm = TermMatrix.from_ids([vocab.encode(q, grow=False) for q in queries])
    dev = torch.device(args.device)
    D, Qm = D.to(dev), Qm.to(dev)
    dg, qg = torch.tensor(dgroup, device=dev), torch.tensor(qgroup, device=dev)
    V = len(vocab)

    def run():
        W, key = bm25_weights(D.indptr, D.indices, D.tf, dg, V)
        return bm25_scores(W, key, V, Qm.indptr, Qm.indices, Qm.tf, qg)

    run()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.repeat):
        S = run()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    ours = (time.perf_counter() - t0) / args.repeat
    print(f"memgas_gpu bm25 ({dev}): {len(queries)} queries x {len(docs)} turns in "
          f"{len(set(dgroup))} corpora: {1e3 * ours:.2f} ms ({S._nnz()} nonzero scores)")
    try:
        import bm25s
    except ImportError:
        print("bm25s not installed: pip install bm25s")
        return
    dense = S.to_dense().cpu().numpy()
    t0 = time.perf_counter()
    worst = 0.0
    dg_np = np.array(dgroup)
    for g in sorted(set(dgroup)):
        cols = np.nonzero(dg_np == g)[0]
        r = bm25s.BM25()
        r.index([[vocab.terms[i] for i in docs[j]] for j in cols], show_progress=False)
        for qi in np.nonzero(np.array(qgroup) == g)[0]:
            q = [t for t in queries[qi] if t in r.vocab_dict]
            ref = r.get_scores(q) if q else np.zeros(len(cols))
            worst = max(worst, float(np.abs(ref - dense[qi, cols]).max()))
    ref_t = time.perf_counter() - t0
    print(f"bm25s (index + per-query loop): {1e3 * ref_t:.2f} ms; max |difference| {worst:.2e}")


if __name__ == "__main__":
    main()
