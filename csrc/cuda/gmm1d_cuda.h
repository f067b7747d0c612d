// Batched 1-D two-component GMM accept masks on CUDA (see common/gmm1d_row.h).
#pragma once
#include <cstdint>

#include "../common/gmm1d_row.h"

namespace memgas {

// Same arguments as gmm1d_cpu (all pointers on the device), plus err (one int32 of
// device scratch: the row-length check) and the cudaStream_t. Synchronises the stream.
void gmm1d_cuda(const void* x, bool is_double, const int64_t* n, const int64_t* first_centre,
                uint8_t* out, int64_t B, int64_t m, const GmmParams& p, int32_t* err,
                void* stream);

int cuda_runtime_version();

}  // namespace memgas
