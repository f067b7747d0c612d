"""Shared fixtures: paths to the real data shipped in ../shared/data."""
from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _need(p: Path) -> Path:
    if not p.exists():
        pytest.skip(f"shared data not found: {p}")
    return p


@pytest.fixture(scope="session")
def locomo_list_path() -> Path:
    return _need(SHARED / "locomo" / "locomo_dev.json")


@pytest.fixture(scope="session")
def locomo_flat_dir() -> Path:
    return _need(SHARED / "locomo" / "v2")


@pytest.fixture(scope="session")
def lme_sample_path() -> Path:
    return _need(SHARED / "longmemeval_format_sample.json")


@pytest.fixture(scope="session")
def minilm():
    """The bundled all-MiniLM-L6-v2 encoder on the CPU, loaded once per test session."""
    from memgas_gpu.encode import Encoder

    return Encoder(device="cpu")


@pytest.fixture(scope="session")
def locomo_index(locomo_list_path, minilm):
    """MemoryIndex of the real LoCoMo conversation conv-30 (19 sessions, 105 questions)."""
    from memgas_gpu import Dataset, load_dataset
    from memgas_gpu.retrieve import MemoryIndex

    ds = load_dataset(locomo_list_path)
    one = Dataset([ds.get("conv-30")], format=ds.format, source=ds.source)
    return one, MemoryIndex.build(one, minilm, summaries="source", device="cpu",
                                  progress=False)
