"""``python -m memgas_gpu.cli``: the ``memgas`` command without the console script."""
from . import main

main()
