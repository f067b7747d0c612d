"""Shared settings of the pytest-benchmark suites."""
from __future__ import annotations

import pytest
import torch

from memgas_gpu.bench.timing import env_threads


@pytest.fixture(scope="module", autouse=True)
def _threads():
    """torch threads for every benchmark: ``MEMGAS_BENCH_THREADS`` (default 1; on a
    shared 2-core machine more threads mostly measure contention)."""
    old = torch.get_num_threads()
    torch.set_num_threads(env_threads())
    yield
    torch.set_num_threads(old)
