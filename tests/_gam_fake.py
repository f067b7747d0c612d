"""A deterministic bag-of-words "encoder" for GAM tests: each text's vector depends on
that text only (hashed word counts), so batched and one-by-one encoding give the same
bits; related texts (shared words) are similar."""
from __future__ import annotations

import hashlib
import re

import torch

DIM = 64


def _vec(text: str) -> torch.Tensor:
    v = torch.zeros(DIM)
    for w in re.findall(r"[a-z]+", text.lower()):
        h = int(hashlib.md5(w.encode()).hexdigest()[:8], 16)
        v[h % DIM] += 1.0 if (h >> 8) % 2 else -1.0
    if not v.any():
        v[0] = 1.0
    return v


class FakeEncoder:
    dim = DIM

    def encode(self, texts, progress=None):
        return torch.stack([_vec(t) for t in texts]) if texts else torch.zeros(0, DIM)

    def count_tokens(self, texts):
        return [len(t.split()) + 2 for t in texts]
