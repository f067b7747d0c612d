"""The ``memgas`` command line: a thin layer over the library.

Each subcommand lives in its own module and is registered in :mod:`.main`.
"""
from __future__ import annotations

import sys

from .._extras import engine_missing

__all__ = ["main"]


def main() -> None:  # console-script entry point
    """Run the ``memgas`` command; without the engine's packages (an install of the
    ``[client]`` extra only) one line naming the extra to install, and exit status 2."""
    try:
        from .main import main as run
    except ImportError as e:
        hint = engine_missing(e)
        if hint is None:
            raise
        print(f"error: the memgas command: {hint}", file=sys.stderr)
        raise SystemExit(2) from None
    run()
