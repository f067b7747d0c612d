"""memgas_gpu: multi-granularity long-term conversational memory retrieval (MemGAS).

This module only re-exports; see the submodules for the implementation.
"""
__version__ = "0.1.0"

from .data import Conversation, Dataset, Question, Session, load_dataset  # noqa: E402
from .errors import DataFormatError, MemgasError  # noqa: E402
from .ops.selfcheck import backend  # noqa: E402  (registers the kernels' self-checks)

__all__ = [
    "__version__",
    "Conversation",
    "Dataset",
    "Question",
    "Session",
    "load_dataset",
    "DataFormatError",
    "MemgasError",
    "backend",
]
