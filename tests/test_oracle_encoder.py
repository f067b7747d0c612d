"""The bundled encoder against sentence-transformers on the same model folder.

sentence-transformers reads the folder's ``modules.json`` (Transformer, mean Pooling,
Normalize) and ``sentence_bert_config.json`` (``max_seq_length`` 256) itself, so it is an
independent reference for pooling, normalisation and truncation; one text is longer
than 256 tokens.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

st = pytest.importorskip("sentence_transformers")

LONG = " ".join(f"On day {i} we talked about gardening, tomatoes and the weather." for i in
                range(60))
TEXTS = ["[user]: I adopted a puppy named Biscuit last week",
         "What instrument does my sister play?",
         "short", LONG]


@pytest.fixture(scope="module")
def reference_vectors():
    from memgas_gpu.encode.encoder import bundled_model_path

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = st.SentenceTransformer(bundled_model_path(), device="cpu")
    assert model.max_seq_length == 256
    assert len(model.tokenizer(LONG)["input_ids"]) > 400  # truncation matters for LONG
    return model.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=False,
                        batch_size=2)


def test_bundled_encoder_equals_sentence_transformers(minilm, reference_vectors):
    ours = minilm.encode(TEXTS).numpy()
    np.testing.assert_allclose(np.linalg.norm(reference_vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(ours, reference_vectors, atol=2e-5, rtol=0)
