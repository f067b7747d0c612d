"""The encoder an index records, resolved as data: checked field by field, found on this
machine by default, fetched from the network only when the caller allows it.

``MemoryIndex.build`` records its encoder in ``config``: ``encoder_source``
(``{"path", "bundled"}``: where to reload it) and ``encoder`` (its settings, as
:meth:`Encoder.describe` gives them).  A manifest is not trusted configuration, so
:func:`recorded_encoder` opens only

* the bundled all-MiniLM-L6-v2 (``bundled: true``),
* a local model folder: a folder holding ``config.json`` and safetensors weights
  (pickled ``.bin`` weights are never loaded from a folder an index names),
* a Hugging Face model id that is already in the local Hugging Face cache, or,
  only with ``allow_download=True`` or ``MEMGAS_ALLOW_DOWNLOAD=1``, one fetched from
  the Hub.

Anything else stops with one line saying what to pass instead (``encoder=``).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ..errors import MemgasError

__all__ = ["EncoderRecordError", "DOWNLOAD_ENV", "check_encoder_record", "recorded_encoder"]

#: set to 1 to let :func:`recorded_encoder` download a Hub model an index names
DOWNLOAD_ENV = "MEMGAS_ALLOW_DOWNLOAD"
_DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
_MAX_LENGTH = 1 << 20
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


class EncoderRecordError(MemgasError, ValueError):
    """An index's encoder record that is malformed or names an encoder this machine
    cannot open without a download it was not allowed."""


def _bad(field: str, what: str) -> EncoderRecordError:
    return EncoderRecordError(f"field 'config.{field}': {what}")


def _optional_int(d: dict, key: str) -> None:
    v = d.get(key)
    if v is not None and (type(v) is not int or not 1 <= v <= _MAX_LENGTH):
        raise _bad(f"encoder.{key}", f"expected null or an integer from 1 to {_MAX_LENGTH}, "
                                     f"got {str(v)[:40]}")


def check_encoder_record(config: Any) -> None:
    """Types and ranges of the encoder record in an index ``config`` (no file is
    touched); the settings are checked where they are used, with ``encoder_source``.

    Raises:
        EncoderRecordError: naming the field (``field 'config.encoder.pooling': ...``).
    """
    if not isinstance(config, dict):
        return
    src = config.get("encoder_source")
    if src is not None:
        if not isinstance(src, dict):
            raise _bad("encoder_source", f"expected an object, got {type(src).__name__}")
        path, bundled = src.get("path"), src.get("bundled", False)
        if not isinstance(path, str) or not path or len(path) > 4096 or "\0" in path:
            raise _bad("encoder_source.path", "expected a non-empty path or model id")
        if not isinstance(bundled, bool):
            raise _bad("encoder_source.bundled", "expected true or false")
    d = config.get("encoder")
    if src is None or d is None:  # a custom encoder object: its description is only shown
        return
    if not isinstance(d, dict):
        raise _bad("encoder", f"expected an object, got {type(d).__name__}")
    checks = {"pooling": ("mean", "cls"), "long_text": ("truncate", "chunk_mean")}
    for key, allowed in checks.items():
        v = d.get(key, allowed[0])
        if v not in allowed or not isinstance(v, str):
            raise _bad(f"encoder.{key}", f"expected one of {', '.join(allowed)}, got "
                                         f"{str(v)[:40]!r}")
    norm = d.get("normalize", "auto")
    if not (isinstance(norm, bool) or norm == "auto"):
        raise _bad("encoder.normalize", f"expected true, false or 'auto', got {str(norm)[:40]!r}")
    _optional_int(d, "max_length")
    _optional_int(d, "chunk_stride")
    dtype = d.get("dtype")
    if dtype is not None and dtype not in _DTYPES:
        raise _bad("encoder.dtype", f"expected one of {', '.join(_DTYPES)}, got "
                                    f"{str(dtype)[:40]!r}")


def _model_folder(path: str) -> str:
    """``path`` if it is a folder a model loads from without running a pickle."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise EncoderRecordError(f"the index's encoder folder {path!r} is not a model folder "
                                 "(no config.json): pass encoder=")
    if not any(os.path.isfile(os.path.join(path, w)) for w in _WEIGHTS):
        raise EncoderRecordError(f"the index's encoder folder {path!r} holds no safetensors "
                                 "weights (pickled weights are never loaded from a folder an "
                                 "index names): pass encoder=")
    return path


def _cached_hub_folder(name: str) -> Optional[str]:
    """The local Hugging Face cache snapshot of model ``name``, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - comes with transformers
        return None
    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # an id the hub client refuses: not cached
        return None
    return os.path.dirname(found) if isinstance(found, str) else None


def recorded_encoder(config: dict, *, allow_download: Optional[bool] = None,
                     device: Optional[str] = None):
    """The :class:`~memgas_gpu.encode.Encoder` an index ``config`` records, opened
    without network access unless ``allow_download`` (default: the environment variable
    ``MEMGAS_ALLOW_DOWNLOAD=1``).

    Raises:
        EncoderRecordError: a malformed record, no record (an index built with a custom
            encoder object), a folder that is not a safetensors model folder, or a Hub
            model that is not cached here while downloads are off.
    """
    from .encoder import HUB_ID, Encoder, bundled_model_path

    check_encoder_record(config)
    src = config.get("encoder_source")
    if not src:
        raise EncoderRecordError("this index does not record its encoder (built with a "
                                 "custom one): pass encoder=")
    if allow_download is None:
        allow_download = os.environ.get(DOWNLOAD_ENV, "").strip().lower() in ("1", "true",
                                                                              "yes")
    path = src["path"]
    if src.get("bundled"):
        model = bundled_model_path()
    elif os.path.isdir(path):
        model = _model_folder(path)
    elif os.path.isabs(path) or path.startswith((".", "~")) or not HUB_ID.fullmatch(path):
        raise EncoderRecordError(f"the index's encoder folder {path[:200]!r} does not exist "
                                 "on this machine: pass encoder=")
    elif allow_download:
        model = path
    else:
        model = _cached_hub_folder(path)
        if model is None:
            raise EncoderRecordError(
                f"the index's encoder {path!r} is not in the local Hugging Face cache and "
                f"downloads are off: pass encoder=, or allow them ({DOWNLOAD_ENV}=1)")
        model = _model_folder(model)
    d = config.get("encoder") or {}
    return Encoder(model, pooling=d.get("pooling", "mean"),
                   normalize=d.get("normalize", "auto"), max_length=d.get("max_length"),
                   long_text=d.get("long_text", "truncate"),
                   chunk_stride=d.get("chunk_stride"), dtype=d.get("dtype"), device=device)
