"""memgas_gpu: multi-granularity long-term conversational memory retrieval (MemGAS).

The names an agent or a researcher needs, in one import::

    import memgas_gpu as mg
    mem = mg.MemoryIndex.build(mg.Dataset([]))      # an empty memory, bundled encoder
    mem.add_session("user-1", mg.Session.from_messages("s1", "2024-05-01", messages))
    hits = mem.search("user-1", ["what did I say about the garden?"], k=5)

This module only re-exports; see the submodules for the implementation.  The names
that need torch (:class:`MemoryIndex`, :class:`Encoder`, :func:`evaluate`,
:class:`GamIndex`, :func:`backend`) and :class:`Client` (a memory served by
``memgas serve``) are imported on first use, so that ``import memgas_gpu`` (and
``memgas --help``) stays fast.
"""
__version__ = "0.1.0"

from .data import Conversation, Dataset, Question, Session, load_dataset  # noqa: E402
from ._lazy import lazy_exports  # noqa: E402
from .errors import DataFormatError, MemgasError  # noqa: E402

#: name → submodule, imported on first access (PEP 562); ``backend`` comes with the
#: kernels' self-checks (memgas_gpu.ops.selfcheck registers them)
_LAZY = {"MemoryIndex": "memory", "Encoder": "encode", "evaluate": "eval",
         "GamIndex": "gam", "DEFAULT_METHOD": "retrieve", "backend": "ops.selfcheck",
         "Client": "serve.client"}

__all__ = [
    "__version__",
    "MemoryIndex",
    "Encoder",
    "Session",
    "Conversation",
    "Dataset",
    "Question",
    "load_dataset",
    "evaluate",
    "GamIndex",
    "DEFAULT_METHOD",
    "DataFormatError",
    "MemgasError",
    "backend",
    "Client",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
