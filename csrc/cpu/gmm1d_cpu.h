// Batched 1-D two-component GMM accept masks on the CPU (see common/gmm1d_row.h).
#pragma once
#include <cstdint>

#include "../common/gmm1d_row.h"

namespace memgas {

// x: [B, m] rows sorted descending (float32 if !is_double else float64), zeros past
// n[b]; n: [B] int64 valid counts; first_centre: [m + 1] int64 k-means++ first-centre
// index per row length; out: [B, m] uint8 accept mask in sorted order (written fully).
// cuda_layout: run the row code as the CUDA kernel instantiates it (no kept arrays), to
// check it on the CPU; same masks.
void gmm1d_cpu(const void* x, bool is_double, const int64_t* n, const int64_t* first_centre,
               uint8_t* out, int64_t B, int64_t m, const GmmParams& p, int n_threads,
               bool cuda_layout = false);

}  // namespace memgas
