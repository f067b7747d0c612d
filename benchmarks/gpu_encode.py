"""GPU encoding speed check: BERT-base-size encoder, bf16, real (non-padding) tokens/s.

Run on a CUDA machine (target: one H200)::

    python benchmarks/gpu_encode.py                 # ~1-2 min on an H200
    python benchmarks/gpu_encode.py --n-texts 50000 --budgets 32768,65536,131072

Random-weight ``BertConfig()`` model (110M parameters, the size of Contriever),
the bundled MiniLM's uncased WordPiece tokenizer, synthetic texts whose lengths
follow a conversational-memory mix (60% turns, median ~45 words; 40% sessions,
median ~1,200 words, truncated at 512 tokens). Prints tokenisation rate, encoding
rate per token budget, a fixed-batch-64 unsorted baseline, bf16-vs-fp32 agreement
and peak memory. Without CUDA it says so and exits with status 2; ``--dry-run``
runs every step on the CPU with a tiny model (used by the test-suite).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np
import torch


def synthetic_texts(n: int, vocab: list[str], seed: int = 0, session_scale: float = 1.0) -> list[str]:
    """Texts with a turn/session length mix (log-normal word counts)."""
    rng = np.random.default_rng(seed)
    is_session = rng.random(n) < 0.4
    words = np.where(is_session, rng.lognormal(np.log(1200 * session_scale), 0.6, n),
                     rng.lognormal(np.log(45), 0.7, n)).astype(int).clip(1, 6000)
    pool = np.array(vocab)
    return [" ".join(pool[rng.integers(0, len(pool), k)]) for k in words]


def word_list(tokenizer) -> list[str]:
    vocab = tokenizer.get_vocab()
    return sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 2)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fixed64(enc, texts: list[str]) -> tuple[float, int]:
    """The reference's way: batches of 64 in input order, padded to the batch's longest."""
    tok = enc.tokenize(texts)
    real, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(texts), 64):
            items = list(range(i, min(i + 64, len(texts))))
            ids, mask, _, r = enc._prepare(tok, items)
            enc._forward(ids.to(enc.device), mask.to(enc.device))
            real += r
    sync(enc.device)
    return time.perf_counter() - t0, real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model, few texts (smoke test)")
    ap.add_argument("--n-texts", type=int, default=20000)
    ap.add_argument("--budgets", default="32768,65536,131072", help="token budgets to time")
    ap.add_argument("--baseline-texts", type=int, default=4000, help="texts for the fixed-64 baseline (0: skip)")
    args = ap.parse_args(argv)

    from memgas_gpu.encode import Encoder
    from memgas_gpu.encode.tiny import make_random_bert

    if args.dry_run:
        device, cfg, scale = torch.device("cpu"), {}, 0.05
        budgets = [2048]
        print("dry run: CPU, tiny random BERT (numbers are not meaningful)")
    elif not torch.cuda.is_available():
        print("gpu_encode: CUDA is not available on this machine; nothing measured. "
              "Run it on a GPU machine, or use --dry-run for a CPU smoke test.")
        return 2
    else:
        device, cfg, scale = torch.device("cuda"), {"base": True}, 1.0
        budgets = [int(b) for b in args.budgets.split(",")]
        print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}")

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = make_random_bert(tmp, **cfg)
        enc = Encoder(path, device=device, normalize=False)
        print(f"model: {sum(p.numel() for p in enc.model.parameters()) / 1e6:.1f}M params, dim {enc.dim}, "
              f"dtype {enc.dtype}, built in {time.perf_counter() - t0:.1f}s")
        texts = synthetic_texts(args.n_texts, word_list(enc.tokenizer), session_scale=scale)

        t0 = time.perf_counter()
        tok = enc.tokenize(texts)
        dt = time.perf_counter() - t0
        real = sum(tok.n_tokens(i) for i in range(len(tok)))
        print(f"texts: {len(texts)}, real tokens: {real:,} (mean {real / len(texts):.0f}/text); "
              f"tokenize: {dt:.2f}s = {real / dt:,.0f} tokens/s")

        enc.encode(texts[:256], progress=False)  # warm-up (kernels, allocator)
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for budget in budgets:
            plan = enc.plan(tok, token_budget=budget)
            padded = sum(len(b) * max(tok.max_len(i) for i in b) for b in plan)
            t0 = time.perf_counter()
            enc.encode(texts, token_budget=budget, progress=False)  # includes tokenisation
            sync(device)
            dt = time.perf_counter() - t0
            print(f"ours  budget {budget:>7,}: {len(plan):5d} batches, padding efficiency "
                  f"{real / padded:.1%}, {dt:6.2f}s, {real / dt:,.0f} tokens/s, {len(texts) / dt:,.0f} texts/s")
        if args.baseline_texts:
            sub = texts[: min(args.baseline_texts, len(texts))]
            dt, r = fixed64(enc, sub)
            print(f"fixed batches of 64 (unsorted, {len(sub)} texts): {dt:.2f}s, {r / dt:,.0f} tokens/s")

        sub = texts[:256]
        ref = Encoder(path, device=device, dtype="float32", normalize=False).encode(sub, progress=False)
        low = enc.encode(sub, progress=False)
        cos = torch.nn.functional.cosine_similarity(low, ref, dim=1)
        print(f"{enc.dtype} vs float32: min cosine {cos.min():.5f}, mean {cos.mean():.5f}")
        if device.type == "cuda":
            print(f"peak GPU memory: {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
