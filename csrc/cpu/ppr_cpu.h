// Batched personalized PageRank on the CPU (see memgas_gpu/ops/ppr.py for the maths).
#pragma once
#include <cstdint>

namespace memgas {

// Graph: symmetric CSR indptr [n + 1] int64, indices [nnz] (int32 if !idx64 else int64).
// r: [n, Q] node-major reset, already cleaned and normalised per (block, column).
// blocks: [n] int64 block id in [0, n_blocks) or nullptr (one block). out: [n, Q].
// Each (block, column) iterates until its L1 change is below tol (or max_iter).
void ppr_cpu(const int64_t* indptr, const void* indices, bool idx64, int64_t n,
             const double* r, int64_t Q, const int64_t* blocks, int64_t n_blocks,
             double damping, double tol, int64_t max_iter, double* out, int n_threads);

}  // namespace memgas
