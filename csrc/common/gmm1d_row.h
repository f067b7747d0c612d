// One row of the batched 1-D two-component GMM (MemGAS edge test), shared verbatim by
// the CPU kernel (one row per OpenMP thread) and the CUDA kernel (one row per thread).
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

// numpy's pairwise float sum of a[0:n] for n <= 128 (8 interleaved accumulators).
template <typename T>
MG_HD T np_sum(const T* a, int n) {
  int n8 = n >= 8 ? n - n % 8 : 0;
  T r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n8; ++i) r[i % 8] = r[i % 8] + a[i];
  T res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (int i = n8; i < n; ++i) res = res + a[i];
  return res;
}

// scikit-learn KMeans(2, n_init=1, random_state=0) labels of xc (centred, length n).
template <typename T>
MG_HD void kmeans_labels(const T* xc, int n, int idx0, T tol_abs, int max_iter,
                         uint8_t* lab, T* tmp) {
  const double c0d = (double)xc[idx0];
  double acc = 0.0;
  for (int i = 0; i < n; ++i) {  // d2 = (x - c0)^2 in float64, stored in T
    double d = (double)xc[i] - c0d;
    tmp[i] = (T)(d * d);
  }
  const double pot = (double)np_sum(tmp, n);
  const double v0 = kUTrial0 * pot, v1 = kUTrial1 * pot;
  int cand[2] = {0, 0};
  for (int i = 0; i < n; ++i) {  // searchsorted(cumsum(d2), u * pot), side="left"
    acc += (double)tmp[i];
    const double cum = (double)(T)acc;  // float64 cumsum, stored in T
    cand[0] += cum < v0;
    cand[1] += cum < v1;
  }
  // zero entries past n keep the cumsum at its total: counted as "not below" either way
  T pots[2];
  for (int t = 0; t < 2; ++t) {
    if (cand[t] > n - 1) cand[t] = n - 1;
    const double xcand = (double)xc[cand[t]];
    // sum(min(d2, dist^2 to the trial)), numpy's order
    T r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int n8 = n >= 8 ? n - n % 8 : 0;
    T res;
    for (int i = 0; i < n8; ++i) {
      double d = (double)xc[i] - xcand;
      T dc = (T)(d * d);
      r[i % 8] = r[i % 8] + (dc < tmp[i] ? dc : tmp[i]);
    }
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (int i = n8; i < n; ++i) {
      double d = (double)xc[i] - xcand;
      T dc = (T)(d * d);
      res = res + (dc < tmp[i] ? dc : tmp[i]);
    }
    pots[t] = res;
  }
  T c0 = xc[idx0];
  T c1 = xc[cand[pots[1] < pots[0] ? 1 : 0]];
  const T two = (T)2;
  for (int it = 0; it < max_iter; ++it) {  // Lloyd
    const T d0c = c0 * c0, d1c = c1 * c1;
    T s0 = 0, s1 = 0;
    int cnt1 = 0;
    bool same = it > 0;
    for (int i = 0; i < n; ++i) {
      const T x = xc[i];
      const uint8_t l = (d1c - two * (x * c1)) < (d0c - two * (x * c0));
      if (l) { s1 = s1 + x; ++cnt1; } else { s0 = s0 + x; }
      same = same && (l == lab[i]);
      lab[i] = l;
    }
    const T f1 = (T)cnt1, f0 = (T)n - f1;
    T n0 = s0 * ((T)1 / (f0 < (T)1 ? (T)1 : f0));
    T n1 = s1 * ((T)1 / (f1 < (T)1 ? (T)1 : f1));
    if (!(f0 > 0)) n0 = n1;  // an empty cluster sits on the other one
    if (!(f1 > 0)) n1 = n0;
    const T sh0 = sqrt((n0 - c0) * (n0 - c0)), sh1 = sqrt((n1 - c1) * (n1 - c1));
    const T shift = sh0 * sh0 + sh1 * sh1;
    c0 = n0;
    c1 = n1;
    if (same || shift <= tol_abs) break;
  }
  const T d0c = c0 * c0, d1c = c1 * c1;
  for (int i = 0; i < n; ++i)
    lab[i] = (d1c - two * (xc[i] * c1)) < (d0c - two * (xc[i] * c0));
}

struct Gmm2 { double w0, w1, mu0, mu1, v0, v1; };

// M-step from responsibilities r1 of component 1 (x in float64, length n).
MG_HD Gmm2 m_step(const double* x, const double* r1, int n, double eps, double reg,
                  bool init) {
  double nk0 = 0, nk1 = 0, sx0 = 0, sx1 = 0;
  for (int i = 0; i < n; ++i) {
    const double a1 = r1[i], a0 = 1.0 - a1;
    nk0 += a0; nk1 += a1; sx0 += a0 * x[i]; sx1 += a1 * x[i];
  }
  nk0 += 10.0 * eps;
  nk1 += 10.0 * eps;
  Gmm2 g;
  g.mu0 = sx0 / nk0;
  g.mu1 = sx1 / nk1;
  double q0 = 0, q1 = 0;
  for (int i = 0; i < n; ++i) {
    const double a1 = r1[i], a0 = 1.0 - a1;
    const double e0 = x[i] - g.mu0, e1 = x[i] - g.mu1;
    q0 += a0 * (e0 * e0); q1 += a1 * (e1 * e1);
  }
  g.v0 = q0 / nk0 + reg;
  g.v1 = q1 / nk1 + reg;
  const double den = init ? (double)n : nk0 + nk1;
  g.w0 = nk0 / den;
  g.w1 = nk1 / den;
  return g;
}

// Per-component constants of the weighted log-probability (computed once per step).
struct LogProbConst { double p0, p1, m0, m1, k0, k1; };

MG_HD LogProbConst log_prob_const(const Gmm2& g) {
  LogProbConst c;
  c.p0 = 1.0 / sqrt(g.v0);  // precision Cholesky factor (1-D)
  c.p1 = 1.0 / sqrt(g.v1);
  c.m0 = g.mu0 * c.p0;
  c.m1 = g.mu1 * c.p1;
  c.k0 = log(c.p0);
  c.k1 = log(c.p1);
  return c;
}

// -0.5 (log 2pi + y^2) + log(pc) + log(w), in the torch op's order of operations
MG_HD void log_probs(double x, const LogProbConst& c, double lw0, double lw1, double* a0,
                     double* a1) {
  const double y0 = x * c.p0 - c.m0, y1 = x * c.p1 - c.m1;
  *a0 = -0.5 * (kLog2Pi + y0 * y0) + c.k0 + lw0;
  *a1 = -0.5 * (kLog2Pi + y1 * y1) + c.k1 + lw1;
}

// E-step: writes r1 and returns the mean log-likelihood lower bound.
MG_HD double e_step(const double* x, int n, const Gmm2& g, double* r1) {
  const LogProbConst c = log_prob_const(g);
  const double lw0 = log(g.w0), lw1 = log(g.w1);
  double lsum = 0;
  for (int i = 0; i < n; ++i) {
    double a0, a1;
    log_probs(x[i], c, lw0, lw1, &a0, &a1);
    const double mx = a0 > a1 ? a0 : a1, mn = a0 > a1 ? a1 : a0;
    const double lse = mx == mn ? mx + kLog2 : mx + log1p(exp(mn - mx));
    lsum += lse;
    r1[i] = exp(a1 - lse);
  }
  return lsum / (double)n;
}

// Accept mask (acc[0:n]) of one row x[0:n] sorted descending; entries past n untouched.
// Scratch: xc (T[m]), x64 and r1 (double[m]), lab (uint8[m]).
template <typename T>
MG_HD void gmm1d_row(const T* xs, int n, int idx0, const GmmParams& p, uint8_t* acc,
                     T* xc, double* x64, double* r1, uint8_t* lab) {
  if (n < 2) {  // scikit-learn would raise: accept every valid point
    for (int i = 0; i < n; ++i) acc[i] = 1;
    return;
  }
  const T nf = (T)n;
  const T mean = np_sum(xs, n) / nf;
  for (int i = 0; i < n; ++i) xc[i] = xs[i] - mean;
  T* tmp = (T*)r1;  // the double scratch doubles as T storage until the EM starts
  for (int i = 0; i < n; ++i) tmp[i] = xc[i] * xc[i];
  const T tol_abs = (np_sum(tmp, n) / nf) * (T)p.km_tol;  // var(x) * tol
  kmeans_labels(xc, n, idx0, tol_abs, p.km_max_iter, lab, tmp);
  for (int i = 0; i < n; ++i) { x64[i] = (double)xs[i]; r1[i] = (double)lab[i]; }
  Gmm2 g = m_step(x64, r1, n, p.eps, p.reg, true);
  double lower = -INFINITY;
  for (int it = 0; it < p.max_iter; ++it) {
    const double nl = e_step(x64, n, g, r1);
    g = m_step(x64, r1, n, p.eps, p.reg, false);
    const double change = fabs(nl - lower);
    lower = nl;
    if (change < p.tol) break;
  }
  const bool high1 = g.mu1 > g.mu0;
  const LogProbConst c = log_prob_const(g);
  const double lw0 = log(g.w0), lw1 = log(g.w1);
  for (int i = 0; i < n; ++i) {
    double a0, a1;
    log_probs(x64[i], c, lw0, lw1, &a0, &a1);
    acc[i] = (a1 > a0) == high1;
  }
}

}  // namespace memgas
