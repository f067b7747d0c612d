"""A second process writing to an EmbeddingStore (used by tests/test_store_writers.py).

Usage: ``python _store_writer.py DIR PREFIX [STARTED GO]``: encode the 4 texts
``PREFIX 0..3`` into the store at DIR; with STARTED and GO, create the file STARTED once
the writer lock is held and wait for the file GO before encoding.
"""
from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import torch


def texts(prefix: str) -> list[str]:
    return [f"{prefix} {i}" for i in range(4)]


def vector(text: str) -> torch.Tensor:
    h = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return torch.tensor([b / 255.0 for b in h[:4]], dtype=torch.float32)


class StoreEncoder:
    """The encoder interface the store uses, with known vectors (:func:`vector`)."""

    fingerprint = "store-standin/1"
    dim = 4

    def __init__(self, started: Path = None, go: Path = None) -> None:
        self.started, self.go = started, go

    def tokenize(self, items):
        return list(items)

    def plan(self, tok, sort_keys=None, token_budget=None, batch_size=None):
        return [list(range(len(tok)))]

    def encode_batches(self, tok, plan, token_budget=None, progress=None):
        if self.started is not None:
            self.started.touch()
            deadline = time.monotonic() + 60
            while not self.go.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.go} never appeared")
                time.sleep(0.02)
        for items in plan:
            yield items, torch.stack([vector(tok[i]) for i in items])


def main(argv: list[str]) -> None:
    from memgas_gpu.encode import EmbeddingStore

    folder, prefix = argv[0], argv[1]
    hold = [Path(a) for a in argv[2:4]] if len(argv) >= 4 else [None, None]
    enc = StoreEncoder(*hold)
    store = EmbeddingStore(folder, enc.fingerprint, dtype="float32")
    store.encode(enc, texts(prefix), progress=False)


if __name__ == "__main__":
    main(sys.argv[1:])
