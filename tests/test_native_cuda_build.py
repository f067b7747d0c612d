"""The CUDA sources compile, without a GPU: every ``csrc/cuda/*.cu`` for sm_90 machine
code and compute_90 PTX with warnings as errors (nvcc's and the host compiler's), and
ptxas reports no register spills and, for the GMM kernels, no stack frame (no
per-thread arrays in local memory) (marker ``cuda_build``; part of the default run,
where it skips with one line when no nvcc is found).

nvcc comes from ``memgas_gpu._toolchain.find_nvcc``: a CUDA toolkit or the pip one
(``pip install nvidia-cuda-nvcc nvidia-cuda-cccl``, which ``.[dev]`` installs on Linux).
"""
from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from memgas_gpu import _toolchain

ROOT = Path(__file__).resolve().parents[1]
CUDA_SOURCES = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
NVCC = _toolchain.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason=_toolchain.INSTALL_HINT)


def compile_cu(src: Path, out_dir: Path) -> str:
    """nvcc -c for sm_90 + compute_90 PTX, warnings as errors; returns ptxas' report."""
    cmd = [NVCC, "-c", str(src), "-o", str(out_dir / (src.stem + ".o")), "-std=c++17",
           "-O3", "--fmad=false", "-I", str(ROOT / "csrc"),
           "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90",
           "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror",
           "-Xptxas", "-v"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{(res.stdout + res.stderr)[-4000:]}"
    return res.stdout + res.stderr


def ptxas_entries(report: str) -> dict:
    """``{kernel: (stack_bytes, spill_store_bytes, spill_load_bytes)}`` from ptxas -v."""
    out, name = {}, None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for 'sm_90'", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                      r"(\d+) bytes spill loads", line)
        if m and name:
            out[name] = tuple(int(v) for v in m.groups())
            name = None
    return out


@pytest.mark.cuda_build
@needs_nvcc
@pytest.mark.parametrize("src", CUDA_SOURCES, ids=lambda p: p.name)
def test_cuda_source_compiles_without_warnings(src, tmp_path):
    entries = ptxas_entries(compile_cu(src, tmp_path))
    assert entries, "ptxas reported no kernel"
    spills = {k: v for k, v in entries.items() if v[1] or v[2]}
    assert not spills, f"register spills: {spills}"
    if src.name == "gmm1d_cuda.cu":  # no per-thread arrays in local memory (was 3.4 KB)
        frames = {k: v[0] for k, v in entries.items() if "gmm1d_kernel" in k}
        assert len(frames) == 4 and not any(frames.values()), frames


def test_cuda_sources_exist():
    assert {p.name for p in CUDA_SOURCES} >= {"gmm1d_cuda.cu", "ppr_cuda.cu"}


# ------------------------------------------------------------ the nvcc search ---------
def _fake_nvcc(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.5, V13.5.37'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_find_nvcc_pip_layout_and_order(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    pip13 = _fake_nvcc(site / "nvidia" / "cu13" / "bin" / "nvcc")
    _fake_nvcc(site / "nvidia" / "cuda_nvcc" / "bin" / "nvcc")  # a CUDA 12 wheel beside
    monkeypatch.setattr(_toolchain, "_site_dirs", lambda: [str(site)])
    for var in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(os.path, "isfile",
                        lambda p, real=os.path.isfile: real(p) and not p.startswith("/usr/local/cuda"))
    assert _toolchain.find_nvcc() == str(pip13)  # not on PATH: found in site-packages
    assert _toolchain.nvcc_version(str(pip13)) == (13, 5)
    home = _fake_nvcc(tmp_path / "toolkit" / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "toolkit"))
    assert _toolchain.find_nvcc() == str(home)  # an explicit toolkit wins
    cxx = _fake_nvcc(tmp_path / "other" / "nvcc")
    monkeypatch.setenv("CUDACXX", str(cxx))
    assert _toolchain.find_nvcc() == str(cxx)
    monkeypatch.setattr(_toolchain, "_site_dirs", lambda: [])
    for var in ("CUDACXX", "CUDA_HOME"):
        monkeypatch.delenv(var)
    assert _toolchain.find_nvcc() is None
