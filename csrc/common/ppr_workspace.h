// Scratch sizes of the CUDA PageRank (one definition for the kernel, the bindings and
// the Python wrapper, which allocates them with torch so they live in torch's cache).
#pragma once
#include <cstdint>
#include <utility>

namespace memgas {

// float64 work: second state [n Q], y = p / deg [2 n Q], 1/deg [n], change and dangling
// mass [3 n_blocks Q]; int32 iwork: pair states [n_blocks Q], two live counters, one error
// flag of the device-side graph check.
inline std::pair<int64_t, int64_t> ppr_cuda_workspace(int64_t n, int64_t Q,
                                                      int64_t n_blocks) {
  return {3 * n * Q + n + 3 * n_blocks * Q, n_blocks * Q + 3};
}

}  // namespace memgas
