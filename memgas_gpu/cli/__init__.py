"""The ``memgas`` command line: a thin layer over the library.

Each subcommand lives in its own module and is registered in :mod:`.main`.
"""
from .main import main

__all__ = ["main"]
