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
