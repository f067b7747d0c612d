"""Test helpers: where real data lives, and project-made stand-ins for it.

This module only re-exports; see :mod:`.paths` and :mod:`.standin`.
"""
from .paths import (ENV, REAL_FILES, data_dir, default_data_dir, how_to_get_real_data,
                    real_data_path, repo_root, require_real_data)
from .standin import DEV_IDS, locomo_like_records, to_flat, to_longmemeval, write_dev_layout

__all__ = [
    "DEV_IDS",
    "ENV",
    "REAL_FILES",
    "data_dir",
    "default_data_dir",
    "how_to_get_real_data",
    "locomo_like_records",
    "real_data_path",
    "repo_root",
    "require_real_data",
    "to_flat",
    "to_longmemeval",
    "write_dev_layout",
]
