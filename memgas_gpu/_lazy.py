"""Exports of a package that load on first use (PEP 562), so that importing the
package imports none of the submodules behind them (torch, for most)."""
from __future__ import annotations

import importlib
import sys

from ._extras import engine_missing

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: dict):
    """``(__getattr__, __dir__)`` for the package ``package``, where ``homes`` maps each
    exported name to the submodule defining it (relative to the package, dotted for
    deeper ones; or a relative module name such as ``..memory.index``); a name is imported once, then kept as a plain attribute."""

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            mod = (importlib.import_module(home, package) if home.startswith(".")
                   else importlib.import_module(f"{package}.{home}"))
        except ImportError as e:
            hint = engine_missing(e)
            if hint is None:
                raise
            raise hint from e
        value = getattr(mod, name)
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
