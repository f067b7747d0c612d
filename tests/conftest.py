"""Shared fixtures: the dev data (real where available, else project-made stand-ins).

Real data comes from one place, ``memgas_gpu.testing.data_dir()``: the folder named by
``MEMGAS_DATA``, else ``../shared/data`` beside the checkout.  When it does not hold the
whole dev layout, the data fixtures hand out project-made conversations of the same
format and shape (``memgas_gpu.testing.standin``), so loaders, the pipeline and the
parity checks against scikit-learn / igraph / bm25s still run; tests marked
``real_data`` (quality thresholds measured on real conversations) are then skipped
with a message saying what to download and which variable to set.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from memgas_gpu.testing import (REAL_FILES, data_dir, how_to_get_real_data, real_data_path,
                                locomo_like_records, write_dev_layout)

DATA_FIXTURES = ("locomo_list_path", "locomo_flat_dir", "lme_sample_path", "locomo_index")
REAL = data_dir() if all(real_data_path(n) for n in REAL_FILES) else None


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "real_data: needs the real dev conversations (MEMGAS_DATA); skipped, "
                   "with how to get them, when only project-made stand-ins are available")
    config._memgas_data = {"standin": 0, "skipped": 0}


def pytest_collection_modifyitems(config, items):
    if REAL is not None:
        return
    skip = pytest.mark.skip(reason=how_to_get_real_data())
    for item in items:
        if item.get_closest_marker("real_data"):
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Count, after deselection, what runs on stand-ins and what is skipped."""
    seen = session.config._memgas_data
    for item in session.items if REAL is None else ():
        if item.get_closest_marker("real_data"):
            seen["skipped"] += 1
        elif set(getattr(item, "fixturenames", ())) & set(DATA_FIXTURES):
            seen["standin"] += 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    seen = config._memgas_data
    if REAL is not None:
        terminalreporter.write_line(f"real data: {REAL}")
    elif seen["standin"] or seen["skipped"]:
        terminalreporter.write_line(
            f"real data: {seen['standin']} tests ran on project-made stand-ins, "
            f"{seen['skipped']} real-data checks skipped; {how_to_get_real_data()}")


@pytest.fixture(scope="session")
def dev_data(tmp_path_factory) -> Path:
    """The dev-data folder: the real one, else project-made stand-ins written once."""
    if REAL is not None:
        return REAL
    return write_dev_layout(locomo_like_records(), tmp_path_factory.mktemp("standin_data"))


@pytest.fixture(scope="session")
def locomo_list_path(dev_data) -> Path:
    """LoCoMo list file with conversations conv-26, conv-30 and conv-41."""
    return dev_data / REAL_FILES["locomo_list"]


@pytest.fixture(scope="session")
def locomo_flat_dir(dev_data) -> Path:
    """The same three conversations as flat files ``26.json``, ``30.json``, ``41.json``."""
    return dev_data / REAL_FILES["locomo_flat"]


@pytest.fixture(scope="session")
def lme_sample_path(dev_data) -> Path:
    """LoCoMo conv-26 in LongMemEval's format: 40 questions over the same 19 sessions."""
    return dev_data / REAL_FILES["lme_sample"]


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    """The folder of a random-weight BERT (hidden 32; seeded, so every test session gets
    the same weights), made once per test session in pytest's temporary folder."""
    from memgas_gpu.encode.tiny import make_random_bert

    return make_random_bert(str(tmp_path_factory.mktemp("tiny-bert")))


@pytest.fixture(scope="session")
def tiny_enc(tiny_bert):
    """An :class:`~memgas_gpu.encode.Encoder` of :func:`tiny_bert` on the CPU
    (``max_length=64``), loaded once per test session: fast, deterministic."""
    from memgas_gpu.encode import Encoder

    return Encoder(tiny_bert, device="cpu", max_length=64)


@pytest.fixture(scope="session")
def minilm():
    """The bundled all-MiniLM-L6-v2 encoder on the CPU, loaded once per test session."""
    from memgas_gpu.encode import Encoder

    return Encoder(device="cpu")


@pytest.fixture(scope="session")
def locomo_index(locomo_list_path, minilm):
    """MemoryIndex of the LoCoMo conversation conv-30 (19 sessions, 105 questions)."""
    from memgas_gpu import Dataset, load_dataset
    from memgas_gpu.retrieve import MemoryIndex

    ds = load_dataset(locomo_list_path)
    one = Dataset([ds.get("conv-30")], format=ds.format, source=ds.source)
    return one, MemoryIndex.build(one, minilm, summaries="source", device="cpu",
                                  progress=False)
