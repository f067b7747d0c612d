// Batched 1-D GMM on CUDA: ONE ROW PER THREAD, the rows of a thread block in shared
// memory. The block first copies its rows (contiguous in global memory) into shared
// memory with consecutive threads reading consecutive elements (coalesced), then thread
// r fits row r (k-means++, Lloyd, EM) with the very code the CPU runs
// (common/gmm1d_row.h, which gmm1d_cpu also runs with cuda_layout=True), keeping no
// per-point scratch: centred values, distances, labels and EM responsibilities are
// recomputed from the row, so a thread holds only registers (no local-memory arrays). The accept masks go to
// shared memory and leave with one coalesced copy.
// Shared memory per row: the row with an odd stride (no bank conflicts when the
// threads of a warp read their rows' i-th points) and its mask; rows per block are
// chosen to stay within the default 48 KB (see rows_per_block).
// Why not a row per warp: the k-means step must reproduce numpy's float32 summation
// order bit for bit (tied points sit exactly between two centres), and those sums are
// sequential; with ~1M rows per graph there are enough rows to fill the GPU anyway.
// Built with --fmad=false so products and sums round as on the CPU. Deterministic, no
// atomics but the error flag. Launched on the caller's stream; the row lengths are
// checked on the device (n[b] in [0, m], as the CPU kernel does; a bad row is left
// all-zero and reported), and the stream is synchronised after the kernel so that a
// launch or execution error is raised here, not later in an unrelated op.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "gmm1d_cuda.h"

namespace memgas {

namespace {

constexpr int kMaxRows = 128;                 // rows (threads) per block at most
constexpr int64_t kSharedBudget = 48 * 1024;  // bytes of shared memory per block

__host__ __device__ inline int64_t stride_of(int64_t m) { return m % 2 == 1 ? m : m + 1; }

// Rows per block: a multiple of 32 between 32 and kMaxRows whose rows fit the budget.
template <typename T>
int rows_per_block(int64_t m) {
  const int64_t per_row = stride_of(m) * (int64_t)sizeof(T) + m;
  int64_t rows = (kSharedBudget / per_row) / 32 * 32;
  return (int)(rows < 32 ? 32 : (rows > kMaxRows ? kMaxRows : rows));
}

template <typename T>
size_t shared_bytes(int rows, int64_t m) {
  return (size_t)rows * (size_t)(stride_of(m) * (int64_t)sizeof(T) + m);
}

template <typename T, int M>
__global__ void gmm1d_kernel(const T* __restrict__ x, const int64_t* __restrict__ n,
                             const int64_t* __restrict__ first_centre,
                             uint8_t* __restrict__ out, int64_t B, int64_t m, GmmParams p,
                             int32_t* __restrict__ err) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int R = (int)blockDim.x;
  const int64_t stride = stride_of(m);
  T* rows = reinterpret_cast<T*>(smem);                     // [R, stride]
  uint8_t* acc = reinterpret_cast<uint8_t*>(rows + R * stride);  // [R, m]
  const int64_t b0 = (int64_t)blockIdx.x * R;
  const int64_t here = B - b0 < R ? B - b0 : R;  // rows of this block
  for (int64_t k = threadIdx.x; k < here * m; k += R)  // coalesced: consecutive k
    rows[(k / m) * stride + k % m] = x[b0 * m + k];
  const int r = (int)threadIdx.x;
  uint8_t* a = acc + (int64_t)r * m;
  for (int64_t i = 0; i < m; ++i) a[i] = 0;
  __syncthreads();
  if (r < here) {
    const int64_t nb = n[b0 + r];
    if (nb < 0 || nb > m) {
      atomicOr(err, 1);  // the row stays all-zero
    } else {
      gmm1d_row<T, M, false>(rows + r * stride, (int)nb, (int)first_centre[nb < 2 ? 0 : nb], p, a);
    }
  }
  __syncthreads();
  for (int64_t k = threadIdx.x; k < here * m; k += R) out[b0 * m + k] = acc[k];
}

void check(cudaError_t err, const char* what) { cuda_check(err, "gmm1d_cuda", what); }

template <typename T>
void launch(const T* x, const int64_t* n, const int64_t* fc, uint8_t* out, int64_t B,
            int64_t m, const GmmParams& p, int32_t* err, cudaStream_t s) {
  const int rows = rows_per_block<T>(m);
  const int64_t grid = (B + rows - 1) / rows;
  const size_t shared = shared_bytes<T>(rows, m);
  if (m <= 32)
    gmm1d_kernel<T, 32><<<(unsigned)grid, rows, shared, s>>>(x, n, fc, out, B, m, p, err);
  else
    gmm1d_kernel<T, kGmmMaxM><<<(unsigned)grid, rows, shared, s>>>(x, n, fc, out, B, m, p,
                                                                   err);
  check(cudaGetLastError(), "launch");
  int32_t bits = 0;
  check(cudaMemcpyAsync(&bits, err, sizeof(int32_t), cudaMemcpyDeviceToHost, s), "copy");
  check(cudaStreamSynchronize(s), "kernel");  // execution errors surface here
  if (bits) throw std::invalid_argument("gmm1d_cuda: n out of [0, m]");
}

}  // namespace

void gmm1d_cuda(const void* x, bool is_double, const int64_t* n, const int64_t* first_centre,
                uint8_t* out, int64_t B, int64_t m, const GmmParams& p, int32_t* err,
                void* stream) {
  if (m < 1 || m > kGmmMaxM) throw std::invalid_argument("gmm1d_cuda: need 1 <= m <= 128");
  if (B == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cuda_check_entry("gmm1d_cuda", s);
  check(cudaMemsetAsync(err, 0, sizeof(int32_t), s), "memset");
  if (is_double)
    launch(static_cast<const double*>(x), n, first_centre, out, B, m, p, err, s);
  else
    launch(static_cast<const float*>(x), n, first_centre, out, B, m, p, err, s);
}

int cuda_runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

}  // namespace memgas
