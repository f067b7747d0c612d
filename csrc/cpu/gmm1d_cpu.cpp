// Batched 1-D GMM on the CPU: one row per OpenMP thread, the whole fit (k-means++,
// Lloyd, EM) on stack arrays of at most kGmmMaxM points. Deterministic: every row is
// computed by one thread in a fixed order, independently of the others.
#include "gmm1d_cpu.h"

#include <cstring>
#include <stdexcept>

namespace memgas {

namespace {

constexpr int64_t kChunk = 16;  // rows per dynamic OpenMP work item

template <typename T>
void run(const T* x, const int64_t* n, const int64_t* first_centre, uint8_t* out,
         int64_t B, int64_t m, const GmmParams& p, int n_threads) {
#pragma omp parallel for schedule(dynamic, kChunk) num_threads(n_threads)
  for (int64_t b = 0; b < B; ++b) {
    T xc[kGmmMaxM];
    double x64[kGmmMaxM], r1[kGmmMaxM];
    uint8_t lab[kGmmMaxM];
    uint8_t* acc = out + b * m;
    std::memset(acc, 0, (size_t)m);
    const int nb = (int)n[b];
    gmm1d_row<T>(x + b * m, nb, (int)first_centre[nb < 2 ? 0 : nb], p, acc, xc, x64, r1,
                 lab);
  }
}

}  // namespace

void gmm1d_cpu(const void* x, bool is_double, const int64_t* n, const int64_t* first_centre,
               uint8_t* out, int64_t B, int64_t m, const GmmParams& p, int n_threads) {
  if (m < 1 || m > kGmmMaxM) throw std::invalid_argument("gmm1d_cpu: need 1 <= m <= 128");
  for (int64_t b = 0; b < B; ++b)
    if (n[b] < 0 || n[b] > m) throw std::invalid_argument("gmm1d_cpu: n out of [0, m]");
  if (n_threads < 1) n_threads = 1;
  if (is_double)
    run(static_cast<const double*>(x), n, first_centre, out, B, m, p, n_threads);
  else
    run(static_cast<const float*>(x), n, first_centre, out, B, m, p, n_threads);
}

}  // namespace memgas
