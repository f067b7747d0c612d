"""Build of memgas_gpu's optional native extension ``memgas_gpu._C`` (CMake + pybind11).

Everything else is in pyproject.toml. The extension holds CPU kernels (OpenMP) and,
when enabled, CUDA kernels; without it memgas_gpu runs its pure-torch ops.

Environment variables:

* ``MEMGAS_BUILD_NATIVE``: ``auto`` (default: try; if the build fails, print a warning
  and install without it), ``1`` (a failed build fails the install), ``0`` (skip).
* ``MEMGAS_BUILD_CUDA``: ``auto`` (default: build the CUDA kernels when nvcc is found and
  either an importable torch has CUDA or, torch not being importable as in pip's
  isolated build, an NVIDIA driver is present; on failure retry CPU-only), ``1``
  (required), ``0`` (never). nvcc is searched by ``memgas_gpu/_toolchain.py``: a CUDA
  toolkit (``CUDACXX``, ``CUDA_HOME``, ``PATH``, ``/usr/local/cuda``) or the pip
  toolchain (``pip install nvidia-cuda-nvcc nvidia-cuda-cccl``).
* ``MEMGAS_CUDA_ARCHS``: CMake CUDA architectures (default ``native`` when a GPU is
  visible, else ``common``: every common architecture, see CMakeLists.txt).
* ``MEMGAS_CMAKE_ARGS``: extra arguments for the CMake configure step.
"""
from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _env(name: str, default: str = "auto") -> str:
    value = os.environ.get(name, default).strip().lower()
    if value not in ("auto", "0", "1"):
        raise SystemExit(f"{name} must be auto, 0 or 1 (got {value!r})")
    return value


def _log(msg: str) -> None:
    print(f"memgas_gpu native build: {msg}", file=sys.stderr, flush=True)


def _load_toolchain():
    """memgas_gpu/_toolchain.py by path: the package itself (torch) may not import here."""
    spec = importlib.util.spec_from_file_location("_memgas_toolchain",
                                                  ROOT / "memgas_gpu" / "_toolchain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TOOLCHAIN = _load_toolchain()


def _nvcc() -> str | None:
    return _TOOLCHAIN.find_nvcc()


def _gpu_visible() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def _want_cuda() -> tuple[bool, str]:
    mode = _env("MEMGAS_BUILD_CUDA")
    if mode == "0":
        return False, "MEMGAS_BUILD_CUDA=0"
    if mode == "1":
        return True, "MEMGAS_BUILD_CUDA=1"
    if _nvcc() is None:
        return False, "nvcc not found"
    try:
        import torch  # only in a non-isolated build (--no-build-isolation)
    except ImportError:
        return _gpu_visible(), "nvcc found, torch not importable; NVIDIA driver " + (
            "present" if _gpu_visible() else "absent")
    return torch.version.cuda is not None, f"nvcc found, torch.version.cuda={torch.version.cuda}"


def _remove_stale() -> None:
    """Delete an extension left in the source tree by an earlier build (editable
    installs load it from there), so that a skipped or failed build means "no native
    extension" rather than an old one that may not match the Python wrappers."""
    for old in (ROOT / "memgas_gpu").glob("_C.*"):
        if old.suffix in (".so", ".pyd", ".dylib"):
            _log(f"removing the stale {old.relative_to(ROOT)}")
            old.unlink()


class CMakeExtension(Extension):
    def __init__(self, name: str, sourcedir: Path = ROOT) -> None:
        super().__init__(name, sources=[])
        self.sourcedir = os.fspath(sourcedir)


class CMakeBuild(build_ext):
    """Runs CMake into the extension's folder; a failure is fatal only when asked for."""

    def build_extensions(self) -> None:
        failed = []
        for ext in self.extensions:
            try:
                self.build_extension(ext)
            except Exception as exc:  # noqa: BLE001 - any build error means "no native"
                if _env("MEMGAS_BUILD_NATIVE") == "1":
                    raise
                _log(f"WARNING: building {ext.name} failed ({exc}); installing the "
                     "pure-torch version. Set MEMGAS_BUILD_NATIVE=1 to make this an error.")
                failed.append(ext)
                _remove_stale()
        # later steps (copy to the source tree, editable wheel) must not look for them
        self.extensions = [e for e in self.extensions if e not in failed]

    def copy_file(self, infile, outfile, *args, **kwargs):
        """Put a built extension into the source tree by copy-then-rename.

        Overwriting the file in place changes the pages of every running process that
        has the old module mapped (it crashed concurrent test runs during rebuilds);
        a rename leaves them their old, unlinked file.
        """
        if not str(outfile).endswith((".so", ".pyd")):
            return super().copy_file(infile, outfile, *args, **kwargs)
        tmp = f"{outfile}.tmp{os.getpid()}"
        shutil.copyfile(infile, tmp)
        shutil.copymode(infile, tmp)
        os.replace(tmp, outfile)
        return outfile, 1

    def build_extension(self, ext: CMakeExtension) -> None:
        cuda, why = _want_cuda()
        _log(f"CUDA kernels {'on' if cuda else 'off'} ({why})")
        try:
            self._cmake(ext, cuda)
        except Exception as exc:  # noqa: BLE001
            if not cuda or _env("MEMGAS_BUILD_CUDA") == "1":
                raise
            _log(f"WARNING: the CUDA build failed ({exc}); building the CPU kernels only")
            self._cmake(ext, False)

    def _cmake(self, ext: CMakeExtension, cuda: bool) -> None:
        import pybind11

        cmake = os.environ.get("MEMGAS_CMAKE") or shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("cmake not found (pip install cmake)")
        extdir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = Path(self.build_temp).resolve() / ("cmake-cuda" if cuda else "cmake-cpu")
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = "Debug" if self.debug else "Release"
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={extdir}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY_{cfg.upper()}={extdir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DMEMGAS_CUDA={'ON' if cuda else 'OFF'}",
        ]
        if cuda:
            nvcc = _nvcc()
            if nvcc is None:
                raise RuntimeError(_TOOLCHAIN.INSTALL_HINT)
            _log(f"nvcc: {nvcc}")
            args.append(f"-DCMAKE_CUDA_COMPILER={os.path.realpath(nvcc)}")
            # a visible GPU: its own architecture; else every common one (CMakeLists.txt)
            archs = os.environ.get("MEMGAS_CUDA_ARCHS") or (
                "native" if _gpu_visible() else "common")
            args.append(f"-DMEMGAS_CUDA_ARCHS={archs}")
        args += shlex.split(os.environ.get("MEMGAS_CMAKE_ARGS", ""))
        jobs = str(max(1, os.cpu_count() or 1))
        subprocess.run([cmake, ext.sourcedir, *args], cwd=build_dir, check=True)
        subprocess.run([cmake, "--build", ".", "--config", cfg, "-j", jobs], cwd=build_dir,
                       check=True)


if _env("MEMGAS_BUILD_NATIVE") == "0":
    _remove_stale()
    ext_modules = []
else:
    ext_modules = [CMakeExtension("memgas_gpu._C")]
setup(ext_modules=ext_modules, cmdclass={"build_ext": CMakeBuild})
