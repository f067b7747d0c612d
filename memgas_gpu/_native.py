"""Loader, backend choice and kernel state of the optional native extension ``memgas_gpu._C``.

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
The calls themselves go through :mod:`memgas_gpu.ops._kernels` (one wrapper per kernel,
with the error policy); :func:`memgas_gpu.backend` tells what ``auto`` gives.

**Self-check (CUDA).** The first time ``auto`` would run a native CUDA kernel on a
device (each device index on its own), the kernel runs on a small fixed problem and is
compared with the torch op on that device (the checks live in
:mod:`memgas_gpu.ops.selfcheck`, registered with :func:`register_self_check`). On a
mismatch, or if the kernel cannot launch at all (no kernel image for the GPU, a driver
older than the CUDA runtime linked into the extension), one warning names the kernel
and ``auto`` uses the torch op for it on that device from then on; a native call that
cannot run later is handled the same way (:func:`disable`). ``backend="native"`` and
``MEMGAS_BACKEND=native`` never fall back.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from functools import lru_cache
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

__all__ = ["native_available", "resolve", "C", "BUILD_HINT", "register_self_check",
           "disable", "device_key", "env_backend", "kernel_status", "may_fall_back",
           "on_cuda", "cuda_stream", "n_threads"]

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


def device_key(device) -> str:
    """``"cpu"`` or ``"cuda:<index>"`` (the current device for a bare ``"cuda"``): the
    key of a kernel's self-check state, so every GPU of a machine is checked on its own."""
    dev = torch.device(_device_type(device) if device is None else device)
    if dev.type != "cuda":
        return dev.type
    index = dev.index if dev.index is not None else (
        torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return f"cuda:{index}"


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


def env_backend() -> str:
    """``MEMGAS_BACKEND`` (``auto`` when unset)."""
    env = os.environ.get("MEMGAS_BACKEND", "auto").strip().lower() or "auto"
    if env not in BACKENDS:
        raise ValueError(f"MEMGAS_BACKEND must be one of {BACKENDS}, got {env!r}")
    return env


def may_fall_back(requested: str) -> bool:
    """Whether a native failure may turn into the torch op: only for ``auto`` with no
    ``MEMGAS_BACKEND`` override (``native`` in either place means "this kernel")."""
    return requested == "auto" and env_backend() == "auto"


@lru_cache(maxsize=None)
def _resolve(op: str, kind: str, requested: str) -> str:
    if requested == "native":
        if not native_available(kind):
            raise ImportError(f"{op}: backend='native' requested but {_missing(kind)}; "
                              f"{BUILD_HINT}")
        return "native"
    if requested == "torch":
        return "torch"
    env = env_backend()
    if env != "auto":
        if env == "torch":
            logger.info("%s uses the torch op (MEMGAS_BACKEND=torch)", op)
        return _resolve(op, kind, env)
    if native_available(kind):
        return "native"
    logger.warning("%s on %s falls back to the torch op: %s; %s", op, kind,
                   _missing(kind), BUILD_HINT)
    return "torch"


# ------------------------------------------------------------------ self-check -------
# op -> check(device) returning None when the native kernel agrees with the torch op on
# its fixed problems, else a one-line description of the mismatch (may also raise).
_SELF_CHECKS: Dict[str, Callable[[torch.device], Optional[str]]] = {}
# device kinds whose native kernels are checked before their first use ("cpu" in tests)
_CHECK_KINDS = {"cuda"}
# (op, device key) -> "passed" | "failed: why" | "running"
_STATUS: Dict[Tuple[str, str], str] = {}


def register_self_check(op: str, check: Callable[[torch.device], Optional[str]]) -> None:
    """Register the self-check of ``op``'s native kernel.

    Args:
        op: op name as given to :func:`resolve`.
        check: ``check(device)`` runs the native kernel and the torch op on small fixed
            problems on ``device``; returns None when they agree, else what differs.
    """
    _SELF_CHECKS[op] = check


def disable(op: str, device, why: str, warn: bool = True) -> None:
    """Record that ``op``'s native kernel cannot be used on ``device`` (warns once per
    kernel and device unless ``warn`` is False: the caller raises instead); ``auto``
    uses the torch op there from then on."""
    key = (op, device_key(device))
    first = not _STATUS.get(key, "").startswith("failed")
    _STATUS[key] = f"failed: {why}"
    if first and warn:
        warnings.warn(f"memgas_gpu: the native {key[1]} kernel '{op}' failed ({why}); "
                      f"using the torch op for '{op}' on {key[1]} from now on",
                      RuntimeWarning, stacklevel=3)


def _self_checked(op: str, device) -> bool:
    """Run ``op``'s self-check once per (op, device); True when it passed."""
    key = (op, device_key(device))
    if key not in _STATUS:
        check = _SELF_CHECKS.get(op)
        if check is None:
            _STATUS[key] = "passed (no self-check registered)"
        else:
            _STATUS[key] = "running"  # the check calls the kernel with backend="native"
            try:
                why = check(torch.device(key[1]))
            except Exception as exc:  # noqa: BLE001 - any launch failure means fall back
                why = f"{type(exc).__name__}: {exc}"
            if why is None:
                _STATUS[key] = "passed"
            else:
                _STATUS.pop(key)
                disable(op, key[1], f"self-check: {why}")
    return not _STATUS[key].startswith("failed")


def resolve(op: str, device, requested: str = "auto") -> str:
    """``"native"`` or ``"torch"`` for ``op`` on ``device`` (cached; logs fallbacks once).

    Args:
        op: op name (for messages), e.g. ``"gmm1d"``.
        device: the device of the op's tensors.
        requested: ``"auto"`` (default), ``"native"`` or ``"torch"``.

    Raises:
        ValueError: unknown ``requested`` or ``MEMGAS_BACKEND``.
        ImportError: ``requested="native"`` (or ``MEMGAS_BACKEND=native``) without the
            needed kernels.
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    kind = _device_type(device)
    choice = _resolve(op, kind, requested)
    if (choice == "native" and may_fall_back(requested) and kind in _CHECK_KINDS
            and not _self_checked(op, device)):
        return "torch"
    return choice


def kernel_status(device, run_checks: bool = True) -> Dict[str, str]:
    """``{op: "passed" | "failed: why" | "not checked"}`` for every kernel with a
    self-check on ``device``; runs the pending checks first (on a device kind that has
    them) unless ``run_checks`` is False."""
    out = {}
    key = device_key(device)
    for op in sorted(_SELF_CHECKS):
        if run_checks and torch.device(key).type in _CHECK_KINDS:
            _self_checked(op, key)
        out[op] = _STATUS.get((op, key), "not checked")
    return out


def on_cuda(t: torch.Tensor) -> bool:
    """Whether a native wrapper takes the CUDA path for ``t`` (a seam for CPU tests)."""
    return t.is_cuda


@contextlib.contextmanager
def cuda_stream(device) -> Iterator[int]:
    """Device guard for a native CUDA call; yields torch's current stream handle."""
    with torch.cuda.device(device):
        yield torch.cuda.current_stream().cuda_stream


def n_threads() -> int:
    """OpenMP threads for the CPU kernels: torch's intra-op thread count."""
    return max(1, torch.get_num_threads())
