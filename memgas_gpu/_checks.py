"""Arguments of the Python API checked up front, with one clear line: a device, a
storage dtype, an encoder given as a name instead of an object."""
from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch

from .errors import MemgasError

__all__ = ["DeviceError", "float_dtype", "require_encoder", "resolve_device"]

#: the storage dtypes of an index, by name
FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


class DeviceError(MemgasError, ValueError):
    """A device this torch build or this machine does not have."""


def resolve_device(device: Optional[Union[str, torch.device]]) -> torch.device:
    """``device`` as a ``torch.device``; ``None`` or ``"auto"``: CUDA if available.

    Raises:
        DeviceError: not a device name, or CUDA asked for where torch has none (a
            CPU-only build, no visible GPU, an index past the last GPU).
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise DeviceError(f"device {device!r:.80} is not a device; use 'cpu', 'cuda' or "
                          "'cuda:N'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("CUDA is not available in this torch build (CPU-only)"
                   if torch.version.cuda is None else "no CUDA device is visible")
            raise DeviceError(f"device {device!r}: {why}; use device='cpu'")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise DeviceError(f"device {device!r}: this machine has {n} CUDA device(s)")
    return dev


def float_dtype(dtype: Any) -> torch.dtype:
    """A storage dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16``, or
    its name (``"float32"``, ``"float16"``, ``"bfloat16"``).

    Raises:
        TypeError: anything else (naming what was given).
    """
    if isinstance(dtype, str) and dtype in FLOAT_DTYPES:
        return FLOAT_DTYPES[dtype]
    if isinstance(dtype, torch.dtype) and dtype in FLOAT_DTYPES.values():
        return dtype
    raise TypeError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, or "
                    f"one of the names {', '.join(map(repr, FLOAT_DTYPES))}; got "
                    f"{dtype!r:.80}")


def require_encoder(encoder: Any) -> None:
    """Refuse an encoder given as a model name or path (an
    :class:`~memgas_gpu.encode.Encoder` object is what is used; ``None`` passes)."""
    if isinstance(encoder, (str, bytes, os.PathLike)):
        name = os.fsdecode(encoder) if not isinstance(encoder, str) else encoder
        raise TypeError(f"encoder must be an Encoder object, not the model name or path "
                        f"{name!r:.200}: pass mg.Encoder({name!r:.200})")
