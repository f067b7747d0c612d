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

**Self-check (CUDA).** The first time ``auto`` would run a native CUDA kernel in a
process, the kernel runs on a small fixed problem and is compared with the torch op on
the same device (each op registers its check with :func:`register_self_check`). On a
mismatch, or if the kernel cannot launch at all (no kernel image for the GPU, a driver
older than the CUDA runtime linked into the extension), one warning names the kernel
and ``auto`` uses the torch op for it from then on; a native call that fails later is
handled the same way (:func:`native_failed`). ``backend="native"`` and
``MEMGAS_BACKEND=native`` never fall back. ``backend(detail=True)`` reports each
kernel's status.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from functools import lru_cache
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

__all__ = ["backend", "native_available", "resolve", "C", "BUILD_HINT",
           "register_self_check", "native_failed", "on_cuda", "cuda_stream"]

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


# ------------------------------------------------------------------ self-check -------
# op -> check(device) returning None when the native kernel agrees with the torch op on
# its fixed problem, else a one-line description of the mismatch (may also raise).
_SELF_CHECKS: Dict[str, Callable[[torch.device], Optional[str]]] = {}
# device kinds whose native kernels are checked before their first use ("cpu" in tests)
_CHECK_KINDS = {"cuda"}
# (op, kind) -> "passed" or "failed: why"
_STATUS: Dict[Tuple[str, str], str] = {}


def register_self_check(op: str, check: Callable[[torch.device], Optional[str]]) -> None:
    """Register the self-check of ``op``'s native kernel (called by the ops modules).

    Args:
        op: op name as given to :func:`resolve`.
        check: ``check(device)`` runs the native kernel and the torch op on a small fixed
            problem on ``device``; returns None when they agree, else what differs.
    """
    _SELF_CHECKS[op] = check


def native_failed(op: str, device, exc: BaseException) -> None:
    """Record that ``op``'s native kernel failed on ``device`` (warns once); ``auto``
    uses the torch op from then on."""
    _fail(op, _device_type(device), f"{type(exc).__name__}: {exc}")


def _fail(op: str, kind: str, why: str) -> None:
    first = not _STATUS.get((op, kind), "").startswith("failed")
    _STATUS[(op, kind)] = f"failed: {why}"
    if first:
        warnings.warn(f"memgas_gpu: the native {kind.upper()} kernel '{op}' failed its "
                      f"check ({why}); using the torch op for '{op}' from now on",
                      RuntimeWarning, stacklevel=3)


def _self_checked(op: str, device) -> bool:
    """Run ``op``'s self-check once per (op, device kind); True when it passed."""
    kind = _device_type(device)
    key = (op, kind)
    if key not in _STATUS:
        check = _SELF_CHECKS.get(op)
        if check is None:
            _STATUS[key] = "passed (no self-check registered)"
        else:
            dev = torch.device(device) if device is not None else torch.device(kind)
            _STATUS[key] = "running"  # the check itself calls the op with backend="native"
            try:
                why = check(dev)
            except Exception as exc:  # noqa: BLE001 - any launch failure means fall back
                why = f"{type(exc).__name__}: {exc}"
            if why is None:
                _STATUS[key] = "passed"
            else:
                _STATUS.pop(key)
                _fail(op, kind, why)
    return not _STATUS[key].startswith("failed")


def _env_backend() -> str:
    return os.environ.get("MEMGAS_BACKEND", "auto").strip().lower() or "auto"


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
    kind = _device_type(device)
    choice = _resolve(op, kind, requested)
    if (choice == "native" and requested == "auto" and _env_backend() == "auto"
            and kind in _CHECK_KINDS and not _self_checked(op, device)):
        return "torch"
    return choice


def on_cuda(t: torch.Tensor) -> bool:
    """Whether a native wrapper takes the CUDA path for ``t`` (a seam for CPU tests)."""
    return t.is_cuda


@contextlib.contextmanager
def cuda_stream(device) -> Iterator[int]:
    """Device guard for a native CUDA call; yields torch's current stream handle."""
    with torch.cuda.device(device):
        yield torch.cuda.current_stream().cuda_stream


def backend(device=None, detail: bool = False):
    """Backend that ``auto`` uses for ops on ``device``.

    Args:
        device: ``"cpu"``, ``"cuda"`` or a ``torch.device`` (default: ``"cuda"`` when a
            GPU is available, else ``"cpu"``).
        detail: also report every kernel: runs the self-checks not run yet (on a
            device kind that has them) and returns a dict instead of a string.

    Returns:
        ``"native-cpu"``, ``"native-cuda"`` or ``"torch"`` (the extension is missing, lacks
        kernels for the device, or ``MEMGAS_BACKEND=torch``). With ``detail``:
        ``{"backend": <that string>, "kernels": {op: "passed" | "failed: why" |
        "not checked"}}``.
    """
    kind = _device_type(device)
    env = _env_backend()
    name = "torch" if env == "torch" or not native_available(kind) else f"native-{kind}"
    if not detail:
        return name
    kernels = {}
    for op in sorted(_SELF_CHECKS):
        if name != "torch" and kind in _CHECK_KINDS:
            _self_checked(op, device if device is not None else kind)
        kernels[op] = _STATUS.get((op, kind), "not checked")
    return {"backend": name, "kernels": kernels}


def n_threads() -> int:
    """OpenMP threads for the CPU kernels: torch's intra-op thread count."""
    return max(1, torch.get_num_threads())
