"""Random-weight BERT folders for tests and benchmarks (offline, no downloads)."""
from __future__ import annotations

import os
import shutil
from typing import Any

from .encoder import bundled_model_path, hf_progress_bars

__all__ = ["make_random_bert", "TOKENIZER_FILES"]

#: Tokenizer files copied from the bundled MiniLM (BERT uncased WordPiece vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def make_random_bert(path: str, seed: int = 0, **config: Any) -> str:
    """Save a random-weight ``BertModel`` with the bundled MiniLM's tokenizer.

    Args:
        path: output folder (created).
        seed: ``torch.manual_seed`` for the weights.
        **config: ``BertConfig`` fields. With none given, a tiny model
            (hidden 32, 2 layers, 2 heads, intermediate 64, 512 positions);
            pass ``base=True`` for ``BertConfig()`` defaults (BERT-base size).

    Returns:
        ``path`` (a folder ``Encoder(path)`` opens offline).
    """
    import torch
    from transformers import BertConfig, BertModel

    base = config.pop("base", False)
    cfg = BertConfig(**({} if base else TINY), **config)
    torch.manual_seed(seed)
    model = BertModel(cfg).eval()
    os.makedirs(path, exist_ok=True)
    with hf_progress_bars(False):
        model.save_pretrained(path, safe_serialization=True)
    src = bundled_model_path()
    for name in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(src, name), os.path.join(path, name))
    return path
