"""Serving one memory to many clients: micro-batching of searches (:class:`Batcher`),
the HTTP service behind ``memgas serve`` (:func:`create_app`), tenants and API keys
(:class:`KeyRing`), and its Python client (:class:`Client`).

The names load on first use (PEP 562): ``import memgas_gpu.serve`` imports neither
torch nor the web stack (Starlette, uvicorn) nor httpx.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_HOME = {
    "Batcher": "batcher", "BATCH_BUCKETS": "batcher",
    "Client": "client", "ServerError": "client", "ClientError": "client",
    "ClientConnectionError": "client", "ClientTimeout": "client",
    "ProtocolError": "client",
    "KeyRing": "tenants", "KeyFileError": "tenants", "load_keys": "tenants",
    "create_app": "app", "LocalBackend": "backend",
}

__all__ = list(_HOME)

__getattr__, __dir__ = lazy_exports(__name__, _HOME)
