"""Where the real datasets live, from one place: the ``MEMGAS_DATA`` folder.

The test suite and the benchmarks that read real conversations ask this module for
their paths.  ``MEMGAS_DATA`` names a folder laid out as::

    locomo/locomo_dev.json           LoCoMo conversations conv-26, conv-30, conv-41
    locomo/v2/{26,30,41}.json        the same three, one flat file each
    longmemeval_format_sample.json   LoCoMo conv-26 in LongMemEval's format (40 questions)

``python -m memgas_gpu.testing prepare locomo10.json DIR`` writes that layout from the
official ``locomo10.json``.  Without ``MEMGAS_DATA`` the folder ``../shared/data``
beside the checkout is used where it exists.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = [
    "ENV",
    "REAL_FILES",
    "data_dir",
    "default_data_dir",
    "how_to_get_real_data",
    "real_data_path",
    "repo_root",
    "require_real_data",
]

ENV = "MEMGAS_DATA"

#: name → path under the data folder
REAL_FILES = {
    "locomo_list": "locomo/locomo_dev.json",
    "locomo_flat": "locomo/v2",
    "lme_sample": "longmemeval_format_sample.json",
}


def repo_root() -> Path:
    """The checkout this package was imported from (``…/memgas_gpu/..``)."""
    return Path(__file__).resolve().parents[2]


def default_data_dir() -> Path:
    """``../shared/data`` beside the checkout (may not exist)."""
    return repo_root().parent / "shared" / "data"


def data_dir() -> Optional[Path]:
    """The real-data folder: ``$MEMGAS_DATA`` if set, else ``../shared/data`` beside the
    checkout; None when that folder does not exist."""
    env = os.environ.get(ENV)
    path = Path(env).expanduser() if env else default_data_dir()
    return path if path.is_dir() else None


def real_data_path(name: str) -> Optional[Path]:
    """Path of one real-data file (a key of :data:`REAL_FILES`), or None when absent."""
    root = data_dir()
    if root is None:
        return None
    path = root / REAL_FILES[name]
    return path if path.exists() else None


def how_to_get_real_data(name: Optional[str] = None) -> str:
    """One line for a skip message: what is missing, which variable to set, what to
    download."""
    env = os.environ.get(ENV)
    where = f"{ENV}={env}" if env else f"{ENV} unset, no {default_data_dir()}"
    what = f"{REAL_FILES[name]} not found ({where})" if name else f"no real data ({where})"
    return (f"{what}: download locomo10.json (github.com/snap-research/LoCoMo), run "
            f"'python -m memgas_gpu.testing prepare locomo10.json DIR' and set {ENV}=DIR "
            f"(LongMemEval itself: github.com/xiaowu0162/LongMemEval)")


def require_real_data(name: str) -> Path:
    """Path of one real-data file for a script; exits with how to get it when absent."""
    path = real_data_path(name)
    if path is None:
        raise SystemExit(f"error: {how_to_get_real_data(name)}")
    return path
