"""Where the CUDA compiler is: one search for ``setup.py``, the ``cuda_build`` tests and
``benchmarks/gpu_check.sh``.

A full CUDA toolkit and the pip one both work::

    pip install nvidia-cuda-nvcc nvidia-cuda-cccl   # nvcc, ptxas, the runtime, CCCL

The pip toolchain puts ``nvcc`` under ``site-packages/nvidia/cu13/bin`` (CUDA 13
wheels; ``nvidia/cuda_nvcc/bin`` for CUDA 12 ones), not on ``PATH``. Its
``nvcc.profile`` adds the CCCL headers (``include/cccl``: ``nv/target``, ``cub``) that
``csrc/cuda/ppr_cuda.cu`` needs; a full toolkit has them in ``include``.

This module imports nothing but the standard library: ``setup.py`` loads it by path,
before torch or the package can be imported. ``python -m memgas_gpu._toolchain``
prints the nvcc found and its version.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from typing import List, Optional, Tuple

__all__ = ["find_nvcc", "nvcc_version", "INSTALL_HINT"]

INSTALL_HINT = ("no nvcc found: pip install nvidia-cuda-nvcc nvidia-cuda-cccl "
                "(or set CUDACXX / CUDA_HOME to a CUDA toolkit)")


def _executable(path: Optional[str]) -> Optional[str]:
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    return None


def _site_dirs() -> List[str]:
    """This interpreter's site-packages, also inside pip's isolated build environment
    (whose ``sys.path`` hides the target environment but whose ``sys.prefix`` is it)."""
    dirs = []
    for scheme_key in ("purelib", "platlib"):
        try:
            dirs.append(sysconfig.get_paths()[scheme_key])
        except KeyError:
            pass
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    seen, out = set(), []
    for d in dirs:
        if d and d not in seen and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out


def pip_nvcc() -> Optional[str]:
    """nvcc of the pip toolchain (``nvidia-cuda-nvcc``) installed for this Python."""
    for site in _site_dirs():
        # newest CUDA first: nvidia/cu13/bin/nvcc, ..., then nvidia/cuda_nvcc/bin/nvcc
        # (the CUDA 12 wheels' layout)
        per_version = glob.glob(os.path.join(site, "nvidia", "cu[0-9]*", "bin", "nvcc"))
        per_version.sort(key=lambda p: int(re.sub(r"\D", "", p.split(os.sep)[-3]) or 0),
                         reverse=True)
        for cand in per_version + [os.path.join(site, "nvidia", "cuda_nvcc", "bin", "nvcc")]:
            if _executable(cand):
                return cand
    return None


def find_nvcc() -> Optional[str]:
    """Path of the CUDA compiler, or None.

    Order: ``CUDACXX``; ``CUDA_HOME`` / ``CUDA_PATH`` (``bin/nvcc``); ``nvcc`` on
    ``PATH``; the pip toolchain installed for this Python; ``/usr/local/cuda/bin/nvcc``.
    """
    explicit = [os.environ.get("CUDACXX")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            explicit.append(os.path.join(os.environ[var], "bin", "nvcc"))
    for cand in explicit + [shutil.which("nvcc"), pip_nvcc(), "/usr/local/cuda/bin/nvcc"]:
        if _executable(cand):
            return cand
    return None


def nvcc_version(nvcc: str) -> Tuple[int, int]:
    """``(major, minor)`` of ``nvcc --version`` (``release 13.0`` -> ``(13, 0)``)."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"release (\d+)\.(\d+)", out)
    if not found:
        raise RuntimeError(f"cannot read the version of {nvcc}: {out.strip()[-200:]}")
    return int(found.group(1)), int(found.group(2))


if __name__ == "__main__":  # python -m memgas_gpu._toolchain
    path = find_nvcc()
    if path is None:
        print(INSTALL_HINT)
        sys.exit(1)
    print(f"{path} (CUDA {'.'.join(map(str, nvcc_version(path)))})")
