#!/usr/bin/env bash
# The benchmark suite at LongMemEval-M scale on one H200 (target: under 8 minutes).
#
#   bash benchmarks/gpu_suite.sh                    # writes bench_gpu/ (report.md, results.json, PNGs)
#   bash benchmarks/gpu_suite.sh --out DIR --budget 420
#   bash benchmarks/gpu_suite.sh --dry-run          # CPU, tiny scale: checks the logic (~30 s)
#
# Prints the per-point log, then (last) a short table: each H200 goal (graph build
# 500 x 500 sessions, 500 queries, BM25 500 queries, BERT-base tokens/s, full
# LongMemEval-M-shaped index) next to its arithmetic limit, after the native kernels'
# own timings (benchmarks/gpu_kernels.py: GMM and PPR kernels against the torch ops).
# Exit status 2 without CUDA (unless --dry-run).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python benchmarks/gpu_suite.py "$@"
