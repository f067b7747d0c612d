"""Encoding throughput on CPU: sorted token-budget batches vs fixed batches of 64.

    python benchmarks/bench_encode.py [--n 500] [--budget 8192] [--repeat 1] [--threads N]

Texts: the turns of LoCoMo conversations conv-26, conv-30 and conv-41 (the file
``locomo/locomo_dev.json`` under ``MEMGAS_DATA``, see ``memgas_gpu.testing``; each
message ``[speaker]: text``,
messages merged in pairs), encoded with the bundled all-MiniLM-L6-v2. The
baseline follows the reference: batches of 64 in input order, the HF tokenizer
call with ``padding=True, truncation=True`` per batch, mean pooling. Rates count
real (non-padding) tokens. One timed run each (``--repeat``: best of N, alternating),
after a short warm-up. The padding efficiency it prints does not depend on machine load.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

import torch

def locomo_turns(path: Optional[Path] = None) -> list[str]:
    """Turns of every conversation: ``[speaker]: text`` messages merged in pairs."""
    from memgas_gpu.testing import require_real_data

    path = path or require_real_data("locomo_list")
    turns = []
    for conv in json.loads(path.read_text()):
        c = conv["conversation"]
        for s in range(1, 1000):
            msgs = c.get(f"session_{s}")
            if msgs is None:
                continue
            rendered = []
            for m in msgs:
                t = f"[{m['speaker']}]: {m['text']}"
                if m.get("blip_caption"):
                    t += f"\n The image Caption: {m['blip_caption']}"
                rendered.append(t)
            turns += ["\n".join(rendered[i : i + 2]) for i in range(0, len(rendered), 2)]
    return turns


def reference_fixed64(enc, texts: list[str]) -> tuple[torch.Tensor, int]:
    """Reference-style encoding: fixed batches of 64 in input order."""
    out, real = [], 0
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            b = enc.tokenizer(texts[i : i + 64], padding=True, truncation=True,
                              max_length=enc.max_length, return_tensors="pt")
            h = enc.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).float()
            out.append((h * m).sum(1) / m.sum(1))
            real += int(b["attention_mask"].sum())
    return torch.cat(out), real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=500, help="the first N turns (0: all 742); keeps the run under 2 min")
    ap.add_argument("--budget", type=int, default=None, help="token budget (default: the encoder's)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of each (best kept; default 1)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from memgas_gpu.encode import Encoder

    enc = Encoder(device="cpu", normalize=False)
    texts = locomo_turns()
    if args.n:
        texts = texts[: args.n]
    real = sum(enc.count_tokens(texts))
    print(f"{len(texts)} LoCoMo turns, {real:,} real tokens, torch threads {torch.get_num_threads()}")
    enc.encode(texts[:64], progress=False)
    reference_fixed64(enc, texts[:64])

    t_ours = t_base = float("inf")
    for _ in range(args.repeat):  # alternate the two, keep each one's best time
        t0 = time.perf_counter()
        ours = enc.encode(texts, token_budget=args.budget, progress=False)
        t_ours = min(t_ours, time.perf_counter() - t0)
        t0 = time.perf_counter()
        base, real_b = reference_fixed64(enc, texts)
        t_base = min(t_base, time.perf_counter() - t0)
    assert real_b == real, (real_b, real)
    diff = (ours - base).abs().max().item()
    r_ours, r_base = real / t_ours, real / t_base
    print(f"ours (sorted, token budget {args.budget or enc.token_budget:,}): {t_ours:6.2f}s  {r_ours:9,.0f} tokens/s")
    print(f"fixed batches of 64, input order:        {t_base:6.2f}s  {r_base:9,.0f} tokens/s")
    print(f"speed-up: {r_ours / r_base:.2f}x   (max |difference| {diff:.2e})")
    tok = enc.tokenize(texts)
    width = [tok.max_len(i) for i in range(len(tok))]
    pad_ours = sum(len(b) * max(width[i] for i in b) for b in enc.plan(tok, token_budget=args.budget))
    pad_base = sum(len(width[i : i + 64]) * max(width[i : i + 64]) for i in range(0, len(texts), 64))
    print(f"padding efficiency (real / padded tokens): ours {real / pad_ours:.1%}, fixed-64 {real / pad_base:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
