// Fused top-m + GMM per association-graph row: one row per OpenMP thread. The row of
// similarities is scanned once with a sorted insertion buffer of m (value, column)
// pairs; its finite values, already sorted descending, go straight into the GMM.
//
// Selection semantics (same edges as torch.topk + gmm1d_accept in ops/graph.py):
// NaN and -inf never produce edges and are skipped; +inf takes a slot but is invalid.
// Ties at the m-th value keep the lowest column (torch.topk's order among ties is
// unspecified); the GMM itself only sees values, so ties inside the top m are harmless.
#include "graph_cpu.h"

#include <cmath>
#include <stdexcept>

namespace memgas {

namespace {

constexpr int64_t kChunk = 8;  // rows per dynamic OpenMP work item

template <typename T>
inline void insert(T v, int64_t j, T* val, int64_t* idx, int& cnt, int k) {
  int pos = cnt < k ? cnt : k - 1;  // drop the last one when full
  while (pos > 0 && val[pos - 1] < v) {  // equal values keep column order
    val[pos] = val[pos - 1];
    idx[pos] = idx[pos - 1];
    --pos;
  }
  val[pos] = v;
  idx[pos] = j;
  if (cnt < k) ++cnt;
}

template <typename T, int M>
void run(const T* sims, int64_t R, int64_t W, const int64_t* ncand, int64_t m, bool gmm,
         const int64_t* first_centre, const GmmParams& p, int64_t* out_idx,
         uint8_t* out_acc, int n_threads) {
#pragma omp parallel for schedule(dynamic, kChunk) num_threads(n_threads)
  for (int64_t r = 0; r < R; ++r) {
    T val[M];
    int64_t idx[M];
    const T* row = sims + r * W;
    const int64_t nc = ncand[r];
    const int k = (int)(nc < m ? nc : m);
    int cnt = 0;
    int64_t j = 0;
    for (; j < nc && cnt < k; ++j) {  // fill: skip NaN and -inf
      const T v = row[j];
      if (v == v && v != -INFINITY) insert(v, j, val, idx, cnt, k);
    }
    if (k > 0) {
      T thr = val[k - 1];
      for (; j < nc; ++j) {  // NaN and -inf never pass the threshold
        const T v = row[j];
        if (v > thr) {
          insert(v, j, val, idx, cnt, k);
          thr = val[k - 1];
        }
      }
    }
    int64_t* oi = out_idx + r * m;
    uint8_t* oa = out_acc + r * m;
    for (int64_t t = 0; t < m; ++t) { oi[t] = t < cnt ? idx[t] : -1; oa[t] = 0; }
    int s = 0;
    while (s < cnt && val[s] == INFINITY) ++s;  // +inf: selected, never accepted
    const int nv = cnt - s;
    if (gmm)
      gmm1d_row<T, M, true>(val + s, nv, (int)first_centre[nv < 2 ? 0 : nv], p, oa + s);
    else
      for (int t = s; t < cnt; ++t) oa[t] = 1;
  }
}

}  // namespace

void graph_topm_cpu(const void* sims, bool is_double, int64_t R, int64_t W,
                    const int64_t* ncand, int64_t m, bool gmm, const int64_t* first_centre,
                    const GmmParams& p, int64_t* out_idx, uint8_t* out_acc, int n_threads) {
  if (m < 1 || m > kGmmMaxM) throw std::invalid_argument("graph_topm_cpu: need 1 <= m <= 128");
  for (int64_t r = 0; r < R; ++r)
    if (ncand[r] < 0 || ncand[r] > W)
      throw std::invalid_argument("graph_topm_cpu: ncand out of [0, W]");
  if (n_threads < 1) n_threads = 1;
  // the GMM instances of gmm1d_cpu / gmm1d_cuda: M = 32 for up to 32 candidates
  if (is_double && m <= 32)
    run<double, 32>(static_cast<const double*>(sims), R, W, ncand, m, gmm, first_centre, p,
                    out_idx, out_acc, n_threads);
  else if (is_double)
    run<double, kGmmMaxM>(static_cast<const double*>(sims), R, W, ncand, m, gmm,
                          first_centre, p, out_idx, out_acc, n_threads);
  else if (m <= 32)
    run<float, 32>(static_cast<const float*>(sims), R, W, ncand, m, gmm, first_centre, p,
                   out_idx, out_acc, n_threads);
  else
    run<float, kGmmMaxM>(static_cast<const float*>(sims), R, W, ncand, m, gmm,
                         first_centre, p, out_idx, out_acc, n_threads);
}

}  // namespace memgas
