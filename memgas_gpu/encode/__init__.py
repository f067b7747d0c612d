"""Text encoding: :class:`Encoder` (pooled HF encoders, token-budget batches) and
:class:`EmbeddingStore` (content-addressed, resumable, deduplicated embeddings)."""
from .batching import Tokenized, TextTokenizer, pad_rows, plan_batches, split_windows
from .encoder import (Encoder, EncoderLoadError, bundled_model_path, check_model_source,
                      normalize_auto)
from .record import EncoderRecordError, check_encoder_record, recorded_encoder
from .store import EmbeddingStore, StoreError, text_key

__all__ = [
    "Encoder",
    "EncoderLoadError",
    "EmbeddingStore",
    "EncoderRecordError",
    "StoreError",
    "Tokenized",
    "TextTokenizer",
    "bundled_model_path",
    "check_model_source",
    "check_encoder_record",
    "normalize_auto",
    "pad_rows",
    "plan_batches",
    "recorded_encoder",
    "split_windows",
    "text_key",
]
