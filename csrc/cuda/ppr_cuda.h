// Batched personalized PageRank on CUDA (see memgas_gpu/ops/ppr.py for the maths).
#pragma once
#include <cstdint>

namespace memgas {

// Same graph / reset / output layout as ppr_cpu (device pointers). work: float64
// [3 n Q + n + 3 n_blocks Q], iwork: int32 [n_blocks Q + 2] (scratch from the caller).
// Returns the number of iterations run.
int64_t ppr_cuda(const int64_t* indptr, const void* indices, bool idx64, int64_t n,
                 const double* r, int64_t Q, const int64_t* blocks, int64_t n_blocks,
                 double damping, double tol, int64_t max_iter, double* out, double* work,
                 int32_t* iwork, void* stream);

}  // namespace memgas
