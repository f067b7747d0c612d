"""``python -m memgas_gpu.cli``: the ``memgas`` command."""
from .main import main

main()
