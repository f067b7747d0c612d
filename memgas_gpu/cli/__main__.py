"""``python -m memgas_gpu.cli``: the ``memgas`` command with this package's code."""
from .main import main

main()
