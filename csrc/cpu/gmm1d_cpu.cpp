// Batched 1-D GMM on the CPU: one row per OpenMP thread, the whole fit (k-means++,
// Lloyd, EM) by the row code the CUDA kernel runs (common/gmm1d_row.h), reading the row
// in place. Deterministic: every row is
// computed by one thread in a fixed order, independently of the others.
#include "gmm1d_cpu.h"

#include <cstring>
#include <stdexcept>

namespace memgas {

namespace {

constexpr int64_t kChunk = 16;  // rows per dynamic OpenMP work item

template <typename T, int M, bool kKeep>
void run(const T* x, const int64_t* n, const int64_t* first_centre, uint8_t* out,
         int64_t B, int64_t m, const GmmParams& p, int n_threads) {
#pragma omp parallel for schedule(dynamic, kChunk) num_threads(n_threads)
  for (int64_t b = 0; b < B; ++b) {
    uint8_t* acc = out + b * m;
    std::memset(acc, 0, (size_t)m);
    const int nb = (int)n[b];
    gmm1d_row<T, M, kKeep>(x + b * m, nb, (int)first_centre[nb < 2 ? 0 : nb], p, acc);
  }
}

// M = 32 for rows of up to 32 points, else 128, as the CUDA kernel; cuda_layout: the
// CUDA kernel's own instances (responsibilities recomputed, not kept), to run its row
// code on the CPU
template <typename T>
void run_m(const T* x, const int64_t* n, const int64_t* fc, uint8_t* out, int64_t B,
           int64_t m, const GmmParams& p, int n_threads, bool cuda_layout) {
  if (cuda_layout && m <= 32)
    run<T, 32, false>(x, n, fc, out, B, m, p, n_threads);
  else if (cuda_layout)
    run<T, kGmmMaxM, false>(x, n, fc, out, B, m, p, n_threads);
  else if (m <= 32)
    run<T, 32, true>(x, n, fc, out, B, m, p, n_threads);
  else
    run<T, kGmmMaxM, true>(x, n, fc, out, B, m, p, n_threads);
}

}  // namespace

void gmm1d_cpu(const void* x, bool is_double, const int64_t* n, const int64_t* first_centre,
               uint8_t* out, int64_t B, int64_t m, const GmmParams& p, int n_threads,
               bool cuda_layout) {
  if (m < 1 || m > kGmmMaxM) throw std::invalid_argument("gmm1d_cpu: need 1 <= m <= 128");
  for (int64_t b = 0; b < B; ++b)
    if (n[b] < 0 || n[b] > m) throw std::invalid_argument("gmm1d_cpu: n out of [0, m]");
  if (n_threads < 1) n_threads = 1;
  if (is_double)
    run_m(static_cast<const double*>(x), n, first_centre, out, B, m, p, n_threads,
          cuda_layout);
  else
    run_m(static_cast<const float*>(x), n, first_centre, out, B, m, p, n_threads,
          cuda_layout);
}

}  // namespace memgas
