// Batched PPR on CUDA: one launch per iteration over the whole (block-diagonal) graph
// and all Q reset columns, fused SpMV + teleport + dangling mass + L1 residual.
// Thread mapping: a group of kLanes consecutive threads owns one (node i, column q),
// q fastest (node-major [n, Q] state: the group's reads y[j, q] of neighbour j are
// coalesced across columns); the lanes stride over i's neighbours and reduce with warp
// shuffles. y = p / deg is written alongside p, so no edge values are stored.
// Per (block, column) convergence as the torch op: a small kernel freezes converged
// pairs; the host reads the count of active pairs every kCheck iterations.
// NON-DETERMINISM: the residual and dangling mass per (block, column) are summed with
// float64 atomicAdd (order varies between runs, ~1e-16 relative); the PageRank
// values themselves use a fixed order per node.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "ppr_cuda.h"

namespace memgas {

namespace {

constexpr int kThreads = 256;  // threads per block
constexpr int kLanes = 8;      // threads per (node, column)
constexpr int kCheck = 4;      // iterations between host convergence checks

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("ppr_cuda: ") + what + ": " +
                             cudaGetErrorString(err));
}

unsigned grid_for(int64_t threads) { return (unsigned)((threads + kThreads - 1) / kThreads); }

// p = r, y = r / deg, 1/deg, dangling mass of r per (block, column)
__global__ void init_kernel(const int64_t* indptr, int64_t n, const double* r, int64_t Q,
                            const int64_t* blocks, double* p, double* y, double* inv_deg,
                            double* dmass) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * Q) return;
  const int64_t i = t / Q, q = t % Q;
  const int64_t deg = indptr[i + 1] - indptr[i];
  const double inv = deg > 0 ? 1.0 / (double)deg : 0.0;
  if (q == 0) inv_deg[i] = inv;
  p[t] = r[t];
  y[t] = r[t] * inv;
  if (deg == 0) atomicAdd(&dmass[(blocks ? blocks[i] : 0) * Q + q], r[t]);
}

template <typename I>
__global__ void step_kernel(const int64_t* __restrict__ indptr, const I* __restrict__ indices,
                            int64_t n, const double* __restrict__ r, int64_t Q,
                            const int64_t* __restrict__ blocks, double d,
                            const double* __restrict__ inv_deg, const double* p,
                            const double* y, double* pn, double* yn,
                            const double* __restrict__ dmass, double* dmass_next,
                            double* change, const int32_t* __restrict__ active) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t item = t / kLanes;
  const int lane = (int)(t % kLanes);
  const bool ok = item < n * Q;  // no early return: the whole warp joins the shuffles
  const int64_t i = ok ? item / Q : 0, q = ok ? item % Q : 0;
  double acc = 0.0;
  if (ok)
    for (int64_t e = indptr[i] + lane; e < indptr[i + 1]; e += kLanes)
      acc += y[(int64_t)indices[e] * Q + q];
  for (int off = kLanes / 2; off > 0; off /= 2)
    acc += __shfl_down_sync(0xffffffffu, acc, off, kLanes);
  if (!ok || lane != 0) return;
  const int64_t bq = (blocks ? blocks[i] : 0) * Q + q;
  const double ri = r[item];
  const double v = (acc * d + (1.0 - d) * ri) + (d * ri) * dmass[bq];
  atomicAdd(&change[bq], fabs(v - p[item]));
  const double keep = active[bq] ? v : p[item];
  pn[item] = keep;
  yn[item] = keep * inv_deg[i];
  if (indptr[i + 1] == indptr[i]) atomicAdd(&dmass_next[bq], keep);
}

// freeze converged (block, column) pairs, reset the residual, count the active pairs
__global__ void update_kernel(int64_t pairs, double tol, double* change, double* dmass_used,
                              int32_t* active, int32_t* count, int32_t* count_next) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k == 0) *count_next = 0;
  if (k >= pairs) return;
  const int32_t a = active[k] && !(change[k] < tol);
  active[k] = a;
  change[k] = 0.0;
  dmass_used[k] = 0.0;
  if (a) atomicAdd(count, 1);
}

}  // namespace

int64_t ppr_cuda(const int64_t* indptr, const void* indices, bool idx64, int64_t n,
                 const double* r, int64_t Q, const int64_t* blocks, int64_t n_blocks,
                 double damping, double tol, int64_t max_iter, double* out, double* work,
                 int32_t* iwork, void* stream) {
  if (n < 0 || Q < 0 || n_blocks < 1) throw std::invalid_argument("ppr_cuda: bad sizes");
  if (n == 0 || Q == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t nq = n * Q, pairs = n_blocks * Q;
  double* pbuf[2] = {out, work};
  double* ybuf[2] = {work + nq, work + 2 * nq};
  double* inv_deg = work + 3 * nq;
  double* change = inv_deg + n;
  double* dm[2] = {change + pairs, change + 2 * pairs};
  int32_t* active = iwork;
  int32_t* count = iwork + pairs;  // two counters, alternating
  check(cudaMemsetAsync(change, 0, 3 * pairs * sizeof(double), s), "memset");
  check(cudaMemsetAsync(active, 1, pairs * sizeof(int32_t), s), "memset");  // non-zero
  check(cudaMemsetAsync(count, 0, 2 * sizeof(int32_t), s), "memset");
  init_kernel<<<grid_for(nq), kThreads, 0, s>>>(indptr, n, r, Q, blocks, pbuf[0], ybuf[0],
                                                inv_deg, dm[0]);
  check(cudaGetLastError(), "init launch");
  int64_t it = 0;
  for (; it < max_iter; ++it) {
    const int c = (int)(it % 2);
    if (idx64)
      step_kernel<int64_t><<<grid_for(nq * kLanes), kThreads, 0, s>>>(
          indptr, static_cast<const int64_t*>(indices), n, r, Q, blocks, damping, inv_deg,
          pbuf[c], ybuf[c], pbuf[1 - c], ybuf[1 - c], dm[c], dm[1 - c], change, active);
    else
      step_kernel<int32_t><<<grid_for(nq * kLanes), kThreads, 0, s>>>(
          indptr, static_cast<const int32_t*>(indices), n, r, Q, blocks, damping, inv_deg,
          pbuf[c], ybuf[c], pbuf[1 - c], ybuf[1 - c], dm[c], dm[1 - c], change, active);
    check(cudaGetLastError(), "step launch");
    update_kernel<<<grid_for(pairs), kThreads, 0, s>>>(pairs, tol, change, dm[c], active,
                                                       count + c, count + 1 - c);
    check(cudaGetLastError(), "update launch");
    if (it % kCheck == kCheck - 1 || it == max_iter - 1) {
      int32_t host = 0;
      check(cudaMemcpyAsync(&host, count + c, sizeof(int32_t), cudaMemcpyDeviceToHost, s),
            "copy");
      check(cudaStreamSynchronize(s), "sync");
      if (host == 0) { ++it; break; }
    }
  }
  if (it % 2 == 1)  // the latest state is in the work buffer
    check(cudaMemcpyAsync(out, pbuf[1], nq * sizeof(double), cudaMemcpyDeviceToDevice, s),
          "copy");
  return it;
}

}  // namespace memgas
