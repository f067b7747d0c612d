// Association-graph candidates on the CPU: fused top-m selection + GMM accept per node.
#pragma once
#include <cstdint>

#include "../common/gmm1d_row.h"

namespace memgas {

// sims: [R, W] similarities (float32, or float64 if is_double), row r's candidates are
// columns [0, ncand[r]); first_centre: [m + 1] (see gmm1d_cpu). Writes out_idx [R, m]
// int64 (selected columns, by decreasing similarity, -1 past the selection) and
// out_acc [R, m] uint8 (1 = edge). gmm = false accepts every finite candidate.
void graph_topm_cpu(const void* sims, bool is_double, int64_t R, int64_t W,
                    const int64_t* ncand, int64_t m, bool gmm, const int64_t* first_centre,
                    const GmmParams& p, int64_t* out_idx, uint8_t* out_acc, int n_threads);

}  // namespace memgas
