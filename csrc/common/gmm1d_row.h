// One row of the batched 1-D two-component GMM (MemGAS edge test), shared verbatim by
// the CPU kernel (one row per OpenMP thread) and the CUDA kernel (one row per thread,
// the rows of a thread block in shared memory): the same template instances run on both.
//
// It mirrors memgas_gpu/ops/gmm1d.py operation by operation, so that both produce the
// same masks: k-means (k-means++ seeding, Lloyd) in the input dtype T with numpy's
// summation order, then EM in float64 with scikit-learn's formulas. Build with FMA
// contraction off (-ffp-contract=off / nvcc --fmad=false): every product and sum here
// must round on its own, as the separate torch ops do.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MG_HD __host__ __device__ __forceinline__
#else
#define MG_HD inline
#endif
// Full unrolling of the short fixed loops (accumulators and label words stay in registers)
// (device code; the host pass of nvcc takes neither pragma: nothing there)
#if defined(__CUDA_ARCH__)
#define MG_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define MG_UNROLL
#elif defined(__GNUC__) && !defined(__clang__)
#define MG_UNROLL _Pragma("GCC unroll 8")
#else
#define MG_UNROLL
#endif

namespace memgas {

constexpr int kGmmMaxM = 128;  // numpy's pairwise block: rows up to this length only
constexpr double kUTrial0 = 0.7151893663724195;  // RandomState(0) draws (k-means++)
constexpr double kUTrial1 = 0.6027633760716439;
constexpr double kLog2Pi = 1.8378770664093453;   // log(2 pi)
constexpr double kLog2 = 0.6931471805599453;

struct GmmParams {
  double eps;        // finfo(input dtype).eps, in n_k = sum(resp) + 10 eps
  double tol;        // EM tolerance on the mean log-likelihood
  double reg;        // reg_covar
  int max_iter;      // EM iterations
  double km_tol;     // k-means tolerance relative to var(x)
  int km_max_iter;   // Lloyd iterations
};

// numpy's pairwise float sum of f(0) ... f(n - 1) for n <= 128: 8 interleaved
// accumulators r[k] = f(k) + f(8 + k) + ... over the first n - n % 8 terms, combined as
// ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the tail one by one. The terms
// are computed on the fly (f is a function of the index), so no per-point array is kept.
template <typename T, typename F>
MG_HD T np_sum(int n, F f) {
  const int n8 = n >= 8 ? n - n % 8 : 0;
  T r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n8; i += 8) {
MG_UNROLL
    for (int k = 0; k < 8; ++k) r[k] = r[k] + f(i + k);
  }
  T res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (int i = n8; i < n; ++i) res = res + f(i);
  return res;
}

// Final k-means centres of scikit-learn KMeans(2, n_init=1, random_state=0) on the
// centred points xc(0..n-1); the labels are (d1c - 2 x c1) < (d0c - 2 x c0).
template <typename T>
struct Centres {
  T c0, c1;
  MG_HD bool label(T x) const {
    const T two = (T)2;
    return (c1 * c1 - two * (x * c1)) < (c0 * c0 - two * (x * c0));
  }
};

// M: the longest row the caller passes (<= kGmmMaxM); sizes the label bit mask that the
// Lloyd loop compares between iterations (M / 32 words, in registers when unrolled).
template <typename T, int M, typename XC>
MG_HD Centres<T> kmeans_centres(XC xc, int n, int idx0, T tol_abs, int max_iter) {
  // k-means++ seeding: d2 = (x - c0)^2 in float64, stored in T (recomputed, not kept)
  const double c0d = (double)xc(idx0);
  auto d2 = [&](int i) -> T {
    const double d = (double)xc(i) - c0d;
    return (T)(d * d);
  };
  const double pot = (double)np_sum<T>(n, d2);
  const double v0 = kUTrial0 * pot, v1 = kUTrial1 * pot;
  int cand[2] = {0, 0};
  double acc = 0.0;
  for (int i = 0; i < n; ++i) {  // searchsorted(cumsum(d2), u * pot), side="left"
    acc += (double)d2(i);
    const double cum = (double)(T)acc;  // float64 cumsum, stored in T
    cand[0] += cum < v0;
    cand[1] += cum < v1;
  }
  T pots[2];
  MG_UNROLL
  for (int t = 0; t < 2; ++t) {
    if (cand[t] > n - 1) cand[t] = n - 1;
    const double xcand = (double)xc(cand[t]);
    // sum(min(d2, dist^2 to the trial)), numpy's order
    pots[t] = np_sum<T>(n, [&](int i) -> T {
      const double d = (double)xc(i) - xcand;
      const T dc = (T)(d * d), di = d2(i);
      return dc < di ? dc : di;
    });
  }
  // a select, not an index: a dynamically indexed array would live in local memory
  Centres<T> c{xc(idx0), xc(pots[1] < pots[0] ? cand[1] : cand[0])};
  constexpr int kWords = (M + 31) / 32;
  uint32_t bits[kWords];
MG_UNROLL
  for (int w = 0; w < kWords; ++w) bits[w] = 0;
  for (int it = 0; it < max_iter; ++it) {  // Lloyd
    T s0 = 0, s1 = 0;
    int cnt1 = 0;
    bool same = it > 0;
MG_UNROLL
    for (int w = 0; w < kWords; ++w) {  // the labels of points 32 w .. 32 w + 31
      uint32_t word = 0;
      for (int j = 0; j < 32 && 32 * w + j < n; ++j) {
        const T x = xc(32 * w + j);
        const bool l = c.label(x);
        if (l) { s1 = s1 + x; ++cnt1; } else { s0 = s0 + x; }
        word |= (uint32_t)l << j;
      }
      same = same && word == bits[w];
      bits[w] = word;
    }
    const T f1 = (T)cnt1, f0 = (T)n - f1;
    T n0 = s0 * ((T)1 / (f0 < (T)1 ? (T)1 : f0));
    T n1 = s1 * ((T)1 / (f1 < (T)1 ? (T)1 : f1));
    if (!(f0 > 0)) n0 = n1;  // an empty cluster sits on the other one
    if (!(f1 > 0)) n1 = n0;
    const T sh0 = sqrt((n0 - c.c0) * (n0 - c.c0)), sh1 = sqrt((n1 - c.c1) * (n1 - c.c1));
    const T shift = sh0 * sh0 + sh1 * sh1;
    c.c0 = n0;
    c.c1 = n1;
    if (same || shift <= tol_abs) break;
  }
  return c;
}

struct Gmm2 { double w0, w1, mu0, mu1, v0, v1; };

// Per-component constants of the weighted log-probability (computed once per step).
struct LogProbConst { double p0, p1, m0, m1, k0, k1, lw0, lw1; };

MG_HD LogProbConst log_prob_const(const Gmm2& g) {
  LogProbConst c;
  c.p0 = 1.0 / sqrt(g.v0);  // precision Cholesky factor (1-D)
  c.p1 = 1.0 / sqrt(g.v1);
  c.m0 = g.mu0 * c.p0;
  c.m1 = g.mu1 * c.p1;
  c.k0 = log(c.p0);
  c.k1 = log(c.p1);
  c.lw0 = log(g.w0);
  c.lw1 = log(g.w1);
  return c;
}

// -0.5 (log 2pi + y^2) + log(pc) + log(w), in the torch op's order of operations
MG_HD void log_probs(double x, const LogProbConst& c, double* a0, double* a1) {
  const double y0 = x * c.p0 - c.m0, y1 = x * c.p1 - c.m1;
  *a0 = -0.5 * (kLog2Pi + y0 * y0) + c.k0 + c.lw0;
  *a1 = -0.5 * (kLog2Pi + y1 * y1) + c.k1 + c.lw1;
}

// E-step of one point: the responsibility r1 of component 1 and the log-sum-exp of the
// two weighted log-probabilities (scikit-learn's _logsumexp for two columns).
struct Resp { double r1, lse; };

MG_HD Resp responsibility(double x, const LogProbConst& c) {
  double a0, a1;
  log_probs(x, c, &a0, &a1);
  const double mx = a0 > a1 ? a0 : a1, mn = a0 > a1 ? a1 : a0;
  const double lse = mx == mn ? mx + kLog2 : mx + log1p(exp(mn - mx));
  return Resp{exp(a1 - lse), lse};
}

// M-step from the responsibilities of component 1 (x(i) in float64): the sums over i in
// ascending order, the variances in a second pass once the means are known. first(i)
// returns the point's Resp (its responsibility and its log-sum-exp, the point's share of
// the E-step's log-likelihood, summed into *lsum); again(i) returns the responsibility
// once more for the second pass (stored or recomputed: the same number).
template <typename X, typename R1, typename R2>
MG_HD Gmm2 m_step(X x, R1 first, R2 again, int n, double eps, double reg, bool init,
                  double* lsum) {
  double nk0 = 0, nk1 = 0, sx0 = 0, sx1 = 0, ls = 0;
  for (int i = 0; i < n; ++i) {
    const Resp ri = first(i);
    const double a1 = ri.r1, a0 = 1.0 - a1;
    ls += ri.lse;
    nk0 += a0; nk1 += a1; sx0 += a0 * x(i); sx1 += a1 * x(i);
  }
  *lsum = ls;
  nk0 += 10.0 * eps;
  nk1 += 10.0 * eps;
  Gmm2 g;
  g.mu0 = sx0 / nk0;
  g.mu1 = sx1 / nk1;
  double q0 = 0, q1 = 0;
  for (int i = 0; i < n; ++i) {
    const double a1 = again(i), a0 = 1.0 - a1;
    const double e0 = x(i) - g.mu0, e1 = x(i) - g.mu1;
    q0 += a0 * (e0 * e0); q1 += a1 * (e1 * e1);
  }
  g.v0 = q0 / nk0 + reg;
  g.v1 = q1 / nk1 + reg;
  const double den = init ? (double)n : nk0 + nk1;
  g.w0 = nk0 / den;
  g.w1 = nk1 / den;
  return g;
}

// Accept mask acc[0:n] of one row xs[0:n] sorted descending (entries past n untouched).
// Per-point quantities (centred value, k-means++ distance, label) are recomputed from xs
// when needed, so a GPU thread keeps only registers (the row itself can live in shared
// memory). kKeep: keep the EM responsibilities of a pass in a per-thread array of M
// doubles for its second half (the CPU kernels: the array is in L1) instead of
// recomputing them (the CUDA kernel: no local memory); the masks are the same bits.
// M: see kmeans_centres.
template <typename T, int M, bool kKeep>
MG_HD void gmm1d_row(const T* xs, int n, int idx0, const GmmParams& p, uint8_t* acc) {
  if (n < 2) {  // scikit-learn would raise: accept every valid point
    for (int i = 0; i < n; ++i) acc[i] = 1;
    return;
  }
  const T nf = (T)n;
  const T mean = np_sum<T>(n, [&](int i) -> T { return xs[i]; }) / nf;
  auto xc = [&](int i) -> T { return xs[i] - mean; };  // KMeans centres the data
  const T tol_abs = (np_sum<T>(n, [&](int i) -> T {
                       const T c = xc(i);
                       return c * c;
                     }) / nf) * (T)p.km_tol;  // var(x) * tol
  const Centres<T> km = kmeans_centres<T, M>(xc, n, idx0, tol_abs, p.km_max_iter);
  auto x64 = [&](int i) -> double { return (double)xs[i]; };
  auto label = [&](int i) -> double { return km.label(xc(i)) ? 1.0 : 0.0; };
  double lsum = 0;
  Gmm2 g = m_step(x64, [&](int i) -> Resp { return Resp{label(i), 0.0}; }, label, n, p.eps,
                  p.reg, true, &lsum);
  double kept[kKeep ? M : 1];
  double lower = -INFINITY;
  for (int it = 0; it < p.max_iter; ++it) {  // {E-step, M-step} of scikit-learn's EM
    const LogProbConst c = log_prob_const(g);
    g = m_step(
        x64,
        [&](int i) -> Resp {
          const Resp q = responsibility(x64(i), c);
          if constexpr (kKeep) kept[i] = q.r1;
          return q;
        },
        [&](int i) -> double {
          if constexpr (kKeep) return kept[i];
          else return responsibility(x64(i), c).r1;
        },
        n, p.eps, p.reg, false, &lsum);
    const double nl = lsum / (double)n;  // mean log-likelihood of the E-step's model
    const double change = fabs(nl - lower);
    lower = nl;
    if (change < p.tol) break;
  }
  const bool high1 = g.mu1 > g.mu0;
  const LogProbConst c = log_prob_const(g);
  for (int i = 0; i < n; ++i) {
    double a0, a1;
    log_probs(x64(i), c, &a0, &a1);
    acc[i] = (a1 > a0) == high1;
  }
}

}  // namespace memgas
