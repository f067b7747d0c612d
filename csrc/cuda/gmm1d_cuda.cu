// Batched 1-D GMM on CUDA: ONE ROW PER THREAD. Thread b fits row b (k-means++, Lloyd,
// EM) with the very code the CPU runs (common/gmm1d_row.h), its points in per-thread
// arrays (registers / L1-cached local memory; sized 32 for m <= 32, else 128).
// Why not a row per warp: the k-means step must reproduce numpy's float32 summation
// order bit for bit (tied points sit exactly between two centres), and those sums are
// sequential; with ~1M rows per graph there are enough rows to fill the GPU anyway.
// Built with --fmad=false so products and sums round as on the CPU. Deterministic, no
// atomics. Launched on the caller's stream; the row lengths are checked on the device
// (n[b] in [0, m], as the CPU kernel does; a bad row is left all-zero and reported), and
// the stream is synchronised after the kernel so that a launch or execution error is
// raised here, not later in an unrelated op.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "gmm1d_cuda.h"

namespace memgas {

namespace {

constexpr int kThreads = 128;  // rows per thread block

template <typename T, int M>
__global__ void gmm1d_kernel(const T* __restrict__ x, const int64_t* __restrict__ n,
                             const int64_t* __restrict__ first_centre,
                             uint8_t* __restrict__ out, int64_t B, int64_t m, GmmParams p,
                             int32_t* __restrict__ err) {
  const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  T xs[M], xc[M];
  double x64[M], r1[M];
  uint8_t lab[M], acc[M];
  if (n[b] < 0 || n[b] > m) {
    for (int i = 0; i < m; ++i) out[b * m + i] = 0;
    atomicOr(err, 1);
    return;
  }
  const int nb = (int)n[b];
  for (int i = 0; i < m; ++i) { xs[i] = i < nb ? x[b * m + i] : T(0); acc[i] = 0; }
  gmm1d_row<T>(xs, nb, (int)first_centre[nb < 2 ? 0 : nb], p, acc, xc, x64, r1, lab);
  for (int i = 0; i < m; ++i) out[b * m + i] = acc[i];
}

void check(cudaError_t err, const char* what) { cuda_check(err, "gmm1d_cuda", what); }

template <typename T>
void launch(const T* x, const int64_t* n, const int64_t* fc, uint8_t* out, int64_t B,
            int64_t m, const GmmParams& p, int32_t* err, cudaStream_t s) {
  const int64_t grid = (B + kThreads - 1) / kThreads;
  if (m <= 32)
    gmm1d_kernel<T, 32><<<(unsigned)grid, kThreads, 0, s>>>(x, n, fc, out, B, m, p, err);
  else
    gmm1d_kernel<T, kGmmMaxM><<<(unsigned)grid, kThreads, 0, s>>>(x, n, fc, out, B, m, p,
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
