// Batched PPR on CUDA: one launch per iteration over the whole (block-diagonal) graph
// and all Q reset columns, fused SpMV + teleport + dangling mass + L1 residual.
// Thread mapping: a group of kLanes consecutive threads owns one (node i, column q),
// q fastest (node-major [n, Q] state: the group's reads y[j, q] of neighbour j are
// coalesced across columns); the lanes stride over i's neighbours and reduce with warp
// shuffles. y = p / deg is written alongside p, so no edge values are stored.
// Per (block, column) convergence as the torch op, decided on the device every
// iteration: a small kernel moves each (block, column) pair through three states,
// kActive -> kLastCopy (converged now: one more step copies its values into the other
// buffer, so both hold them) -> kFrozen (skipped: no neighbour gathers, no writes), and
// counts the pairs not yet frozen. Every step launch first reads that count and returns
// at once when it is 0, so launches past convergence cost almost nothing; the host reads
// the count only every kCheck iterations, to stop launching.
// NON-DETERMINISM: the residual and dangling mass per (block, column) are summed within
// each warp (lanes with the same (block, column) key, cooperative groups'
// labeled_partition), then added with one float64 atomicAdd per key and warp (order
// varies between runs, ~1e-16 relative); the PageRank values use a fixed order per node.
// The graph is checked on the device before the first iteration (as ppr_cpu does on the
// host): indptr[0] == 0, indptr non-decreasing, columns in [0, n), block ids in range.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "ppr_cuda.h"

namespace memgas {

namespace {

constexpr int kThreads = 256;  // threads per block
constexpr int kLanes = 8;      // threads per (node, column)
constexpr int kCheck = 4;      // iterations between host reads of the live count
// states of a (block, column) pair (see the top of the file)
constexpr int32_t kFrozen = 0, kLastCopy = 1, kActive = 2;

void check(cudaError_t err, const char* what) { cuda_check(err, "ppr_cuda", what); }

namespace cg = cooperative_groups;

unsigned grid_for(int64_t threads) { return (unsigned)((threads + kThreads - 1) / kThreads); }

// error bits of the graph check
constexpr int32_t kBadFirst = 1, kBadOrder = 2, kBadColumn = 4, kBadBlock = 8;

template <typename I>
__global__ void validate_kernel(const int64_t* indptr, const I* indices, int64_t n,
                                int64_t nnz, const int64_t* blocks, int64_t n_blocks,
                                int32_t* err) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t total = n > nnz ? n : nnz;
  int32_t bits = 0;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    if (t < n) {
      if (indptr[t + 1] < indptr[t]) bits |= kBadOrder;
      if (blocks && (blocks[t] < 0 || blocks[t] >= n_blocks)) bits |= kBadBlock;
    }
    if (t < nnz) {
      const int64_t j = (int64_t)indices[t];
      if (j < 0 || j >= n) bits |= kBadColumn;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && indptr[0] != 0) bits |= kBadFirst;
  if (bits) atomicOr(err, bits);
}

// dst[key] += v over the lanes of the warp that share key (key < 0: nothing to add).
// Every lane of the warp must call it (no lane may have returned).
__device__ __forceinline__ void warp_add(double* dst, long long key, double v) {
  const auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const auto peers = cg::labeled_partition(warp, key);
  const double s = cg::reduce(peers, v, cg::plus<double>());
  if (key >= 0 && peers.thread_rank() == 0) atomicAdd(dst + key, s);
}

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
                            double* change, const int32_t* __restrict__ state,
                            const int32_t* __restrict__ live) {
  if (*live == 0) return;  // every pair frozen: nothing left (uniform for the launch)
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t item = t / kLanes;
  const int lane = (int)(t % kLanes);
  const bool ok = item < n * Q;  // no early return: the whole warp joins the shuffles
  const int64_t i = ok ? item / Q : 0, q = ok ? item % Q : 0;
  const long long bq = ok ? (blocks ? blocks[i] : 0) * Q + q : -1;
  const int32_t st = ok ? state[bq] : kFrozen;
  double acc = 0.0;
  if (st == kActive)  // converged pairs gather nothing
    for (int64_t e = indptr[i] + lane; e < indptr[i + 1]; e += kLanes)
      acc += y[(int64_t)indices[e] * Q + q];
  for (int off = kLanes / 2; off > 0; off /= 2)
    acc += __shfl_down_sync(0xffffffffu, acc, off, kLanes);
  const bool lead = lane == 0;
  double diff = 0.0, keep = 0.0;
  bool dangling = false;
  if (lead && st == kActive) {
    const double ri = r[item];
    const double v = (acc * d + (1.0 - d) * ri) + (d * ri) * dmass[bq];
    diff = fabs(v - p[item]);
    keep = v;
    pn[item] = v;
    yn[item] = v * inv_deg[i];
    dangling = indptr[i + 1] == indptr[i];
  } else if (lead && st == kLastCopy) {  // both buffers end with the converged values
    pn[item] = p[item];
    yn[item] = y[item];
  }
  // one atomic per (block, column) and warp instead of one per node: with one block and
  // one column every node of the graph would add to the same address
  const long long key = st == kActive ? bq : -1;
  warp_add(change, key, diff);
  warp_add(dmass_next, dangling ? key : -1, keep);
}

// next state of every (block, column) pair, reset of its residual, count of the pairs
// not frozen (read by the next step launch and, every kCheck iterations, by the host)
__global__ void update_kernel(int64_t pairs, double tol, double* change, double* dmass_used,
                              int32_t* state, int32_t* count, int32_t* count_next) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k == 0) *count_next = 0;
  if (k >= pairs) return;
  const int32_t s = state[k];
  const int32_t ns = s == kActive ? (change[k] < tol ? kLastCopy : kActive) : kFrozen;
  state[k] = ns;
  change[k] = 0.0;
  dmass_used[k] = 0.0;
  const unsigned live = __activemask();
  const unsigned votes = __ballot_sync(live, ns != kFrozen);
  if (votes && (threadIdx.x % 32) == (unsigned)(__ffs(live) - 1))
    atomicAdd(count, __popc(votes));  // one atomic per warp
}

// the first step's live count: every pair
__global__ void live_init_kernel(int32_t* count, int32_t pairs) { *count = pairs; }

__global__ void state_init_kernel(int32_t* state, int64_t pairs) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k < pairs) state[k] = kActive;
}

std::string graph_error(int32_t bits) {
  std::string msg = "ppr_cuda:";
  if (bits & kBadFirst) msg += " indptr[0] must be 0;";
  if (bits & kBadOrder) msg += " indptr decreases;";
  if (bits & kBadColumn) msg += " column index out of range;";
  if (bits & kBadBlock) msg += " block id out of range;";
  return msg;
}

}  // namespace

int64_t ppr_cuda(const int64_t* indptr, const void* indices, bool idx64, int64_t n,
                 const double* r, int64_t Q, const int64_t* blocks, int64_t n_blocks,
                 double damping, double tol, int64_t max_iter, double* out, double* work,
                 int64_t work_len, int32_t* iwork, int64_t iwork_len, void* stream) {
  if (n < 0 || Q < 0 || n_blocks < 1) throw std::invalid_argument("ppr_cuda: bad sizes");
  if (n_blocks * Q >= ((int64_t)1 << 31))
    throw std::invalid_argument("ppr_cuda: n_blocks * Q must be below 2**31");
  const auto need = ppr_cuda_workspace(n, Q, n_blocks);
  if (work_len < need.first || iwork_len < need.second)
    throw std::invalid_argument("ppr_cuda: workspace too small");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cuda_check_entry("ppr_cuda", s);
  const int64_t nq = n * Q, pairs = n_blocks * Q;
  {  // the graph, on the device, before anything reads through it
    int64_t nnz = 0;  // the caller checked that indices holds indptr[n] entries
    check(cudaMemcpyAsync(&nnz, indptr + n, sizeof(int64_t), cudaMemcpyDeviceToHost, s),
          "copy");
    check(cudaStreamSynchronize(s), "sync");
    if (nnz < 0) throw std::invalid_argument("ppr_cuda: indptr[n] < 0");
    int32_t* err = iwork + pairs + 2;
    check(cudaMemsetAsync(err, 0, sizeof(int32_t), s), "memset");
    const int64_t total = (n > nnz ? n : nnz);
    const unsigned grid = total > 0 ? (unsigned)std::min<int64_t>(grid_for(total), 4096) : 1;
    if (idx64)
      validate_kernel<int64_t><<<grid, kThreads, 0, s>>>(
          indptr, static_cast<const int64_t*>(indices), n, nnz, blocks, n_blocks, err);
    else
      validate_kernel<int32_t><<<grid, kThreads, 0, s>>>(
          indptr, static_cast<const int32_t*>(indices), n, nnz, blocks, n_blocks, err);
    check(cudaGetLastError(), "validate launch");
    int32_t bits = 0;
    check(cudaMemcpyAsync(&bits, err, sizeof(int32_t), cudaMemcpyDeviceToHost, s), "copy");
    check(cudaStreamSynchronize(s), "sync");
    if (bits) throw std::invalid_argument(graph_error(bits));
  }
  if (n == 0 || Q == 0) return 0;
  double* pbuf[2] = {out, work};
  double* ybuf[2] = {work + nq, work + 2 * nq};
  double* inv_deg = work + 3 * nq;
  double* change = inv_deg + n;
  double* dm[2] = {change + pairs, change + 2 * pairs};
  int32_t* state = iwork;
  int32_t* count = iwork + pairs;  // two live counters: step `it` reads count[1 - it % 2]
  check(cudaMemsetAsync(change, 0, 3 * pairs * sizeof(double), s), "memset");
  check(cudaMemsetAsync(count, 0, 2 * sizeof(int32_t), s), "memset");
  init_kernel<<<grid_for(nq), kThreads, 0, s>>>(indptr, n, r, Q, blocks, pbuf[0], ybuf[0],
                                                inv_deg, dm[0]);
  check(cudaGetLastError(), "init launch");
  state_init_kernel<<<grid_for(pairs), kThreads, 0, s>>>(state, pairs);
  check(cudaGetLastError(), "state launch");
  live_init_kernel<<<1, 1, 0, s>>>(count + 1, (int32_t)pairs);
  check(cudaGetLastError(), "live launch");
  int64_t it = 0;
  int32_t live = (int32_t)pairs;  // as last read by the host
  for (; it < max_iter; ++it) {
    const int c = (int)(it % 2);
    if (idx64)
      step_kernel<int64_t><<<grid_for(nq * kLanes), kThreads, 0, s>>>(
          indptr, static_cast<const int64_t*>(indices), n, r, Q, blocks, damping, inv_deg,
          pbuf[c], ybuf[c], pbuf[1 - c], ybuf[1 - c], dm[c], dm[1 - c], change, state,
          count + 1 - c);
    else
      step_kernel<int32_t><<<grid_for(nq * kLanes), kThreads, 0, s>>>(
          indptr, static_cast<const int32_t*>(indices), n, r, Q, blocks, damping, inv_deg,
          pbuf[c], ybuf[c], pbuf[1 - c], ybuf[1 - c], dm[c], dm[1 - c], change, state,
          count + 1 - c);
    check(cudaGetLastError(), "step launch");
    update_kernel<<<grid_for(pairs), kThreads, 0, s>>>(pairs, tol, change, dm[c], state,
                                                       count + c, count + 1 - c);
    check(cudaGetLastError(), "update launch");
    if (it % kCheck == kCheck - 1 || it == max_iter - 1) {
      check(cudaMemcpyAsync(&live, count + c, sizeof(int32_t), cudaMemcpyDeviceToHost, s),
            "copy");
      check(cudaStreamSynchronize(s), "sync");
      if (live == 0) { ++it; break; }
    }
  }
  // live == 0: every pair is frozen and both buffers hold its values; else every launch
  // did work and the latest values are in pbuf[it % 2]
  if (live != 0 && it % 2 == 1)
    check(cudaMemcpyAsync(out, pbuf[1], nq * sizeof(double), cudaMemcpyDeviceToDevice, s),
          "copy");
  check(cudaStreamSynchronize(s), "sync");  // execution errors surface here
  return it;
}

}  // namespace memgas
