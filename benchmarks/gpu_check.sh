#!/usr/bin/env bash
# The first thing to run on a CUDA machine (see docs/gpu-notes.md), from the repository root:
#   bash benchmarks/gpu_check.sh [--no-speed]
# 1. puts the wheels carried in .whl/ (if any) on PYTHONPATH (no network needed);
# 2. builds memgas_gpu._C with the CUDA kernels for the visible GPU's architecture
#    (pip --no-build-isolation --no-deps, else CMake directly into memgas_gpu/);
# 3. runs benchmarks/gpu_check.py: the kernels' self-checks (backend(detail=True)), CUDA
#    against the CPU kernels on fresh random inputs, then timings at LongMemEval-M scale;
# 4. runs the CUDA tests of the native layer when pytest is importable.
# Needs: python with torch (CUDA), nvcc (a toolkit or pip's nvidia-cuda-nvcc), cmake,
# pybind11, a C++ compiler. About 3-6 minutes. Logs go to $OUT (if set) or /tmp.
# Exit status: 0 when every check passed, 1 otherwise (the table says which).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${OUT:-/tmp}
start=$(date +%s)
status=0

if ls .whl/*.whl > /dev/null 2>&1; then  # carried wheels: installed beside, not into, site-packages
  $PY -m pip install -q --no-index --no-deps --target /tmp/memgas_site .whl/*.whl \
    && export PYTHONPATH=/tmp/memgas_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

$PY - <<'PYEOF' || exit 2
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("[gpu_check] torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0), flush=True)
PYEOF
arch=$($PY -c "import torch; a, b = torch.cuda.get_device_capability(0); print(f'{a}{b}')")
nvcc=$($PY memgas_gpu/_toolchain.py) || { echo "[gpu_check] $nvcc"; exit 2; }
echo "[gpu_check] nvcc: $nvcc"
export MEMGAS_BUILD_NATIVE=1 MEMGAS_BUILD_CUDA=1 MEMGAS_CUDA_ARCHS=${MEMGAS_CUDA_ARCHS:-$arch}
echo "[gpu_check] building the extension (CUDA arch $MEMGAS_CUDA_ARCHS)"
if ! $PY -m pip install --no-deps --no-build-isolation -e . > "$LOGS/gpu_build.log" 2>&1; then
  echo "[gpu_check] pip build failed (tail of $LOGS/gpu_build.log below); trying CMake directly"
  tail -n 20 "$LOGS/gpu_build.log" || true
  pybind11_dir=$($PY -c "import pybind11; print(pybind11.get_cmake_dir())")
  cmake -S . -B build/gpu_check -DCMAKE_BUILD_TYPE=Release -DMEMGAS_CUDA=ON \
    -DMEMGAS_CUDA_ARCHS="$MEMGAS_CUDA_ARCHS" -DPython_EXECUTABLE="$(command -v $PY)" \
    -DCMAKE_CUDA_COMPILER="${nvcc%% (*}" -Dpybind11_DIR="$pybind11_dir" \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$PWD/memgas_gpu" > "$LOGS/gpu_cmake.log" 2>&1 \
    && cmake --build build/gpu_check -j "$(nproc)" >> "$LOGS/gpu_cmake.log" 2>&1 \
    || { tail -n 30 "$LOGS/gpu_cmake.log"; exit 1; }
fi
echo "[gpu_check] built in $(( $(date +%s) - start )) s"

timeout 420 $PY benchmarks/gpu_check.py "$@" || status=1

if $PY -c "import pytest" 2> /dev/null; then
  echo "[gpu_check] CUDA tests of the native layer"
  timeout 240 $PY -m pytest -q -p no:cacheprovider -m "not slow" tests/test_native.py \
    tests/test_ppr.py -k "cuda or validates or past_int32" 2>&1 | tail -n 15 || status=1
else
  echo "[gpu_check] pytest is not importable: the CUDA tests were not run"
fi
echo "[gpu_check] total $(( $(date +%s) - start )) s, exit status $status"
exit $status
