// Batched personalized PageRank on CUDA (see memgas_gpu/ops/ppr.py for the maths).
#pragma once
#include <cstdint>

#include "../common/ppr_workspace.h"

namespace memgas {

// Same graph / reset / output layout as ppr_cpu (device pointers). work / iwork:
// float64 / int32 scratch from the caller, of the lengths ppr_cuda_workspace gives
// (checked against work_len / iwork_len). The graph (indptr, column range, block ids)
// is checked on the device before the first iteration: std::invalid_argument.
// Returns the number of iterations launched (launches after every (block, column) has
// converged return at once).
int64_t ppr_cuda(const int64_t* indptr, const void* indices, bool idx64, int64_t n,
                 const double* r, int64_t Q, const int64_t* blocks, int64_t n_blocks,
                 double damping, double tol, int64_t max_iter, double* out, double* work,
                 int64_t work_len, int32_t* iwork, int64_t iwork_len, void* stream);

}  // namespace memgas
