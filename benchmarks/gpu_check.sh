#!/usr/bin/env bash
# GPU check of the native kernels (issue 5), for one H200 (or any CUDA GPU):
#   bash benchmarks/gpu_check.sh            # from the repository root
# 1. builds memgas_gpu._C with the CUDA kernels, through setup.py (pip, no network:
#    --no-build-isolation --no-deps), else by a direct CMake build into memgas_gpu/;
# 2. runs benchmarks/gpu_check.py: CUDA vs CPU on fresh random inputs, then timings at
#    LongMemEval-M scale (500 x 500 sessions, 1M nodes); prints a table last.
# Needs: python with torch (CUDA), nvcc, cmake, pybind11, a C++ compiler. ~3-6 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
start=$(date +%s)

$PY - <<'PYEOF'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("[gpu_check] torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0))
PYEOF
arch=$($PY -c "import torch; a, b = torch.cuda.get_device_capability(0); print(f'{a}{b}')")
export MEMGAS_BUILD_NATIVE=1 MEMGAS_BUILD_CUDA=1 MEMGAS_CUDA_ARCHS=${MEMGAS_CUDA_ARCHS:-$arch}
echo "[gpu_check] building the extension (CUDA arch $MEMGAS_CUDA_ARCHS)"
if ! $PY -m pip install --no-deps --no-build-isolation -e . > /tmp/memgas_gpu_build.log 2>&1; then
  echo "[gpu_check] pip build failed (tail of /tmp/memgas_gpu_build.log below); trying CMake directly"
  tail -n 20 /tmp/memgas_gpu_build.log || true
  pybind11_dir=$($PY -c "import pybind11; print(pybind11.get_cmake_dir())")
  cmake -S . -B build/gpu_check -DCMAKE_BUILD_TYPE=Release -DMEMGAS_CUDA=ON \
    -DMEMGAS_CUDA_ARCHS="$MEMGAS_CUDA_ARCHS" -DPython_EXECUTABLE="$(command -v $PY)" \
    -Dpybind11_DIR="$pybind11_dir" -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$PWD/memgas_gpu" \
    > /tmp/memgas_gpu_cmake.log 2>&1 || { tail -n 30 /tmp/memgas_gpu_cmake.log; exit 1; }
  cmake --build build/gpu_check -j "$(nproc)" >> /tmp/memgas_gpu_cmake.log 2>&1 \
    || { tail -n 30 /tmp/memgas_gpu_cmake.log; exit 1; }
fi
echo "[gpu_check] built in $(( $(date +%s) - start )) s"
timeout 420 $PY benchmarks/gpu_check.py "$@"
echo "[gpu_check] total $(( $(date +%s) - start )) s"
