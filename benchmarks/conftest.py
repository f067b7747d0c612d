"""Shared settings of the pytest-benchmark suites."""
from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _threads():
    """torch threads for every benchmark: ``MEMGAS_BENCH_THREADS`` (default 1; on a
    shared 2-core machine more threads mostly measure contention)."""
    old = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("MEMGAS_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(old)
