"""GAM write path on LoCoMo dev: online write p99 and offline build, each beside the
per-event Python loop reference, in one run (encoding excluded; see memgas_gpu/bench/gam.py).

    OMP_NUM_THREADS=2 PYTHONPATH=$PWD nice python benchmarks/bench_gam.py --store /tmp/gam_i15_store
"""
from __future__ import annotations

import argparse
import json

import torch

import memgas_gpu as mg
from memgas_gpu.bench.gam import bench_gam
from memgas_gpu.encode import EmbeddingStore, Encoder
from memgas_gpu.gam import GamParams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/locomo/locomo_dev.json")
    ap.add_argument("--store", default=None)
    ap.add_argument("--segmentation", default="semantic")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    ds = mg.load_dataset(a.data)
    enc = Encoder(device="cpu")
    st = EmbeddingStore(a.store, enc.fingerprint) if a.store else None
    rows = bench_gam(ds, enc, GamParams(segmentation=a.segmentation), store=st)
    print(f"torch threads: {torch.get_num_threads()}")
    for r in rows:
        print(json.dumps(r))
    if a.out:
        from memgas_gpu._io import atomic_write

        with atomic_write(a.out) as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
