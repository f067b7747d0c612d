"""Loader and backend choice for the optional native extension ``memgas_gpu._C``.

The extension (``csrc/``, built by ``setup.py`` through CMake) holds CPU kernels and,
when built with CUDA, GPU kernels. Every op in :mod:`memgas_gpu.ops` that has a native
kernel takes ``backend="auto" | "native" | "torch"``:

* ``"auto"`` (default): native when the extension is built and supports the tensor's
  device, else the torch op. ``MEMGAS_BACKEND=torch`` (or ``native``) in the
  environment replaces ``auto``.
* ``"native"``: the native kernel; raises ImportError (with the build command) when the
  extension or its CUDA part is missing.
* ``"torch"``: the readable torch op (the reference the kernels are tested against).

The choice is resolved once per (op, device type) and each fallback is logged once.
:func:`backend` tells what ``auto`` gives.
"""
from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import Optional

import torch

__all__ = ["backend", "native_available", "resolve", "C", "BUILD_HINT"]

logger = logging.getLogger("memgas_gpu")

BUILD_HINT = ('build it with: MEMGAS_BUILD_NATIVE=1 pip install -e . '
              '(add MEMGAS_BUILD_CUDA=1 for the CUDA kernels; see docs/native.md)')
BACKENDS = ("auto", "native", "torch")

try:  # the most specialised build first: one module, with or without CUDA kernels
    from . import _C as C  # type: ignore[attr-defined]
    _IMPORT_ERROR: Optional[BaseException] = None
except ImportError as exc:  # not built (no compiler, MEMGAS_BUILD_NATIVE=0, ...)
    C = None
    _IMPORT_ERROR = exc


def _device_type(device) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def native_available(device="cpu") -> bool:
    """Whether the native extension has kernels for ``device`` (``"cpu"``/``"cuda"``)."""
    if C is None:
        return False
    kind = _device_type(device)
    return kind == "cpu" or (kind == "cuda" and bool(getattr(C, "has_cuda", False)))


def _missing(kind: str) -> str:
    if C is None:
        return f"the native extension memgas_gpu._C is not built ({_IMPORT_ERROR})"
    return f"memgas_gpu._C was built without {kind.upper()} kernels"


@lru_cache(maxsize=None)
def _resolve(op: str, kind: str, requested: str) -> str:
    if requested == "native":
        if not native_available(kind):
            raise ImportError(f"{op}: backend='native' requested but {_missing(kind)}; "
                              f"{BUILD_HINT}")
        return "native"
    if requested == "torch":
        return "torch"
    env = os.environ.get("MEMGAS_BACKEND", "auto").strip().lower() or "auto"
    if env not in BACKENDS:
        raise ValueError(f"MEMGAS_BACKEND must be one of {BACKENDS}, got {env!r}")
    if env != "auto":
        if env == "torch":
            logger.info("%s uses the torch op (MEMGAS_BACKEND=torch)", op)
        return _resolve(op, kind, env)
    if native_available(kind):
        return "native"
    logger.warning("%s on %s falls back to the torch op: %s; %s", op, kind,
                   _missing(kind), BUILD_HINT)
    return "torch"


def resolve(op: str, device, requested: str = "auto") -> str:
    """``"native"`` or ``"torch"`` for ``op`` on ``device`` (cached; logs fallbacks once).

    Args:
        op: op name (for messages), e.g. ``"gmm1d"``.
        device: the device of the op's tensors.
        requested: ``"auto"`` (default), ``"native"`` or ``"torch"``.

    Raises:
        ValueError: unknown ``requested``.
        ImportError: ``requested="native"`` (or ``MEMGAS_BACKEND=native``) without the
            needed kernels.
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    return _resolve(op, _device_type(device), requested)


def backend(device=None) -> str:
    """Backend that ``auto`` uses for ops on ``device``.

    Args:
        device: ``"cpu"``, ``"cuda"`` or a ``torch.device`` (default: ``"cuda"`` when a
            GPU is available, else ``"cpu"``).

    Returns:
        ``"native-cpu"``, ``"native-cuda"`` or ``"torch"`` (the extension is missing, lacks
        kernels for the device, or ``MEMGAS_BACKEND=torch``).
    """
    kind = _device_type(device)
    env = os.environ.get("MEMGAS_BACKEND", "auto").strip().lower() or "auto"
    if env == "torch" or not native_available(kind):
        return "torch"
    return f"native-{kind}"


def n_threads() -> int:
    """OpenMP threads for the CPU kernels: torch's intra-op thread count."""
    return max(1, torch.get_num_threads())
