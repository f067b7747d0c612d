// Batched PPR on the CPU: the Q reset columns are cut into tiles of TQ columns; one
// OpenMP thread runs one tile to convergence (fused SpMV + teleport + dangling mass +
// L1 residual per iteration) in node-major [n, TQ] buffers that it reuses for its next
// tile. Neighbour sums run in CSR order (as the torch op), two nodes interleaved to hide
// the add latency. Per (block, column) convergence exactly as the torch op: a converged
// pair is frozen while the others go on. With fewer tiles than threads (one question per
// conversation, LongMemEval's shape) a block-diagonal graph is also cut into node ranges
// at block boundaries, one (tile, range) per task: a block's iterations only read its
// own nodes, so the split gives the same bits. No atomics; results do not depend on
// threads.
#include "ppr_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace memgas {

namespace {

constexpr int kTile = 16;  // columns per tile: 4 AVX2 vectors per gathered neighbour
constexpr size_t kKeepBytes = size_t(16) << 20;  // per-thread buffers kept up to this

// AVX2 clone chosen at load time where the CPU has it (plain adds and multiplies only:
// the same IEEE results as the baseline clone, just wider).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MG_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MG_CLONES
#endif

typedef double v4d __attribute__((vector_size(32), aligned(8)));

struct Work {  // one thread's tile buffers, [n, TQ] and [n_blocks, TQ]
  std::vector<double> p, y, nw, rt, dmass, change;
  std::vector<uint8_t> active;
};

// acc[0:TQ] = sum of y[j, 0:TQ] over the neighbours j of node i, in CSR order
template <typename I, int TQ>
inline void gather(const int64_t* indptr, const I* indices, const double* y, int64_t i,
                   int64_t base, double* out) {
  // indptr is offset to the range's first node; indices are global, y is range-local
  y -= base * TQ;
  if constexpr (TQ % 4 == 0) {
    constexpr int NV = TQ / 4;
    v4d a[NV], b[NV];  // nodes i and i + 1, interleaved: two independent add chains
    for (int k = 0; k < NV; ++k) a[k] = b[k] = v4d{0, 0, 0, 0};
    int64_t e = indptr[i], f = indptr[i + 1];
    const int64_t ea = indptr[i + 1], fb = indptr[i + 2];
    for (; e < ea && f < fb; ++e, ++f) {
      const v4d* ya = (const v4d*)(y + (int64_t)indices[e] * TQ);
      const v4d* yb = (const v4d*)(y + (int64_t)indices[f] * TQ);
      for (int k = 0; k < NV; ++k) { a[k] += ya[k]; b[k] += yb[k]; }
    }
    for (; e < ea; ++e) {
      const v4d* ya = (const v4d*)(y + (int64_t)indices[e] * TQ);
      for (int k = 0; k < NV; ++k) a[k] += ya[k];
    }
    for (; f < fb; ++f) {
      const v4d* yb = (const v4d*)(y + (int64_t)indices[f] * TQ);
      for (int k = 0; k < NV; ++k) b[k] += yb[k];
    }
    std::memcpy(out, a, sizeof(a));
    std::memcpy(out + TQ, b, sizeof(b));
  } else if constexpr (TQ == 1) {
    // one column (one question per conversation): nodes i and i + 1 interleaved, two
    // independent add chains (one chain waited on the add latency at every edge); each
    // node still sums in CSR order, so the bits are those of the one-chain loop
    double a = 0.0, b = 0.0;
    int64_t e = indptr[i], f = indptr[i + 1];
    const int64_t ea = indptr[i + 1], fb = indptr[i + 2];
    for (; e < ea && f < fb; ++e, ++f) {
      a += y[(int64_t)indices[e]];
      b += y[(int64_t)indices[f]];
    }
    for (; e < ea; ++e) a += y[(int64_t)indices[e]];
    for (; f < fb; ++f) b += y[(int64_t)indices[f]];
    out[0] = a;
    out[1] = b;
  } else {
    for (int64_t k = 0; k < 2; ++k) {
      double s[TQ] = {};
      for (int64_t e = indptr[i + k]; e < indptr[i + k + 1]; ++e)
        for (int c = 0; c < TQ; ++c) s[c] += y[(int64_t)indices[e] * TQ + c];
      std::memcpy(out + k * TQ, s, sizeof(s));
    }
  }
}

// Nodes [lo, lo + n) of the graph (a union of whole blocks), columns [q0, q0 + cols).
// blocks: the range's block ids in [0, nb) (nullptr: one block); dang: its dangling nodes.
template <typename I, int TQ>
MG_CLONES void tile(const int64_t* indptr, const I* indices, int64_t lo, int64_t n,
                    const double* r, int64_t Q, int64_t q0, int cols, const int64_t* blocks,
                    int64_t nb, double d, double tol, int64_t max_iter,
                    const double* inv_deg, const int64_t* dang, int64_t n_dang, Work& w,
                    double* out) {
  indptr += lo;
  inv_deg += lo;
  r += lo * Q;
  out += lo * Q;
  // columns [cols, TQ) are zero padding: they converge at once and are never written
  w.p.assign(n * TQ, 0.0);
  w.rt.assign(n * TQ, 0.0);
  w.y.resize(n * TQ);
  w.nw.resize(n * TQ);
  w.dmass.resize(nb * TQ);
  w.change.resize(nb * TQ);
  w.active.assign(nb * TQ, 1);
  double *p = w.p.data(), *y = w.y.data(), *nw = w.nw.data(), *rt = w.rt.data();
  double *dmass = w.dmass.data(), *change = w.change.data();
  uint8_t* active = w.active.data();
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < cols; ++c) p[i * TQ + c] = rt[i * TQ + c] = r[i * Q + q0 + c];
  const double keep = 1.0 - d;
  const bool has_dang = n_dang > 0;
  double acc[2 * TQ];
  for (int64_t it = 0; it < max_iter; ++it) {
    for (int64_t i = 0; i < n; ++i)
      for (int c = 0; c < TQ; ++c) y[i * TQ + c] = p[i * TQ + c] * inv_deg[i];
    std::fill(dmass, dmass + nb * TQ, 0.0);
    for (int64_t k = 0; k < n_dang; ++k) {  // mass on dangling nodes, per block
      const int64_t i = dang[k] - lo;
      const int64_t b = blocks ? blocks[i] : 0;
      for (int c = 0; c < TQ; ++c) dmass[b * TQ + c] += p[i * TQ + c];
    }
    std::fill(change, change + nb * TQ, 0.0);
    double chg[TQ] = {};  // residual of the current block run (blocks are contiguous runs)
    int64_t cur = blocks ? blocks[0] : 0;
    for (int64_t i = 0; i < n; ++i) {
      if ((i & 1) == 0) {
        if (i + 1 < n) {
          gather<I, TQ>(indptr, indices, y, i, lo, acc);
        } else if (i > 0) {  // last node alone: gather it as the second of (i - 1, i)
          gather<I, TQ>(indptr, indices, y, i - 1, lo, acc);
          std::memcpy(acc, acc + TQ, sizeof(double) * TQ);
        } else {  // a range of one node: the pair (0, 1) would read past the range
          for (int c = 0; c < TQ; ++c) acc[c] = 0.0;
          for (int64_t e = indptr[0]; e < indptr[1]; ++e)
            for (int c = 0; c < TQ; ++c) acc[c] += y[((int64_t)indices[e] - lo) * TQ + c];
        }
      }
      const double* a = acc + (i & 1) * TQ;
      const int64_t b = blocks ? blocks[i] : 0;
      if (b != cur) {
        for (int c = 0; c < TQ; ++c) { change[cur * TQ + c] += chg[c]; chg[c] = 0.0; }
        cur = b;
      }
      const double* __restrict ri = rt + i * TQ;
      const double* __restrict pi = p + i * TQ;
      const double* __restrict dm = dmass + b * TQ;
      const uint8_t* __restrict act = active + b * TQ;
      double* __restrict ni = nw + i * TQ;
      for (int c = 0; c < TQ; ++c) {
        double v = a[c] * d + keep * ri[c];
        if (has_dang) v = v + (d * ri[c]) * dm[c];
        chg[c] += std::fabs(v - pi[c]);
        ni[c] = act[c] ? v : pi[c];
      }
    }
    for (int c = 0; c < TQ; ++c) change[cur * TQ + c] += chg[c];
    std::swap(p, nw);
    bool any = false;
    for (int64_t k = 0; k < nb * TQ; ++k) {
      active[k] = active[k] && !(change[k] < tol);
      any = any || active[k];
    }
    if (!any) break;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < cols; ++c) out[i * Q + q0 + c] = p[i * TQ + c];
}

// Node ranges [cuts[k], cuts[k + 1]) for splitting one row across threads: whole blocks
// only, about equal work (nodes + edges) each, and no edge between ranges; each range
// gets its blocks renumbered from 0 in `local` (nb_of[k] of them). Returns {0, n} when
// the graph cannot be split that way (a block in two runs, or an edge across blocks).
template <typename I>
std::vector<int64_t> block_ranges(const int64_t* indptr, const I* indices, int64_t n,
                                  const int64_t* blocks, int64_t nb, int parts,
                                  std::vector<int64_t>& local, std::vector<int64_t>& nb_of) {
  std::vector<int64_t> cuts{0};
  std::vector<uint8_t> seen(nb, 0);
  const double total = (double)n + (double)indptr[n];
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0 && blocks[i] == blocks[i - 1]) continue;
    if (seen[blocks[i]]) return {0, n};  // a block in two runs: keep one range
    seen[blocks[i]] = 1;
    const double done = (double)i + (double)indptr[i];
    if (i > 0 && done >= total * (double)cuts.size() / parts) cuts.push_back(i);
  }
  cuts.push_back(n);
  local.assign(n, 0);
  nb_of.assign(cuts.size() - 1, 0);
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    int64_t id = -1;
    for (int64_t i = cuts[k]; i < cuts[k + 1]; ++i) {
      if (i == cuts[k] || blocks[i] != blocks[i - 1]) ++id;
      local[i] = id;
      for (int64_t e = indptr[i]; e < indptr[i + 1]; ++e)
        if ((int64_t)indices[e] < cuts[k] || (int64_t)indices[e] >= cuts[k + 1])
          return {0, n};  // an edge leaves the range: not block-diagonal
    }
    nb_of[k] = id + 1;
  }
  return cuts;
}

template <typename I>
void run(const int64_t* indptr, const I* indices, int64_t n, const double* r, int64_t Q,
         const int64_t* blocks, int64_t nb, double d, double tol, int64_t max_iter,
         double* out, int n_threads) {
  std::vector<double> inv_deg(n);
  std::vector<int64_t> dang;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t deg = indptr[i + 1] - indptr[i];
    inv_deg[i] = deg > 0 ? 1.0 / (double)deg : 0.0;
    if (deg == 0) dang.push_back(i);
  }
  // tile width: 16 columns, 4 for a few columns, 1 for a single one (e.g. one query
  // per conversation in blocks mode); the last tile is zero-padded
  const int width = Q >= kTile ? kTile : (Q > 1 ? 4 : 1);
  const int64_t n_tiles = (Q + width - 1) / width;
  // fewer tiles than threads on a block-diagonal graph: also split the nodes (4 ranges
  // per thread for balance) so that every thread has work
  std::vector<int64_t> cuts{0, n}, local, nb_of;
  if (blocks && nb > 1 && n_threads > 1 && n_tiles < n_threads)
    cuts = block_ranges(indptr, indices, n, blocks, nb, 4 * n_threads, local, nb_of);
  const int64_t n_ranges = (int64_t)cuts.size() - 1;
  std::vector<int64_t> dang_at(n_ranges + 1, 0);  // dang[dang_at[k]:dang_at[k+1]] in range k
  for (int64_t k = 0; k < n_ranges; ++k)
    dang_at[k + 1] = std::lower_bound(dang.begin(), dang.end(), cuts[k + 1]) - dang.begin();
  const int64_t n_tasks = n_tiles * n_ranges;
  const int threads = (int)std::max<int64_t>(1, std::min<int64_t>(n_threads, n_tasks));
#pragma omp parallel num_threads(threads)
  {
    // buffers kept per thread between calls (no page faults on every batch of
    // queries); released after a call on a very large graph
    static thread_local Work w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tasks; ++task) {
      const int64_t t = task / n_ranges, k = task % n_ranges;
      const int64_t q0 = t * width;
      const int cols = (int)std::min<int64_t>(Q - q0, width);
      const int64_t lo = cuts[k], len = cuts[k + 1] - cuts[k];
      const bool split = n_ranges > 1;
      const int64_t* blk = split ? local.data() + lo : blocks;
      const int64_t nbk = split ? nb_of[k] : nb;
      const int64_t* dg = dang.data() + dang_at[k];
      const int64_t nd = dang_at[k + 1] - dang_at[k];
      if (width == kTile)
        tile<I, kTile>(indptr, indices, lo, len, r, Q, q0, cols, blk, nbk, d, tol, max_iter,
                       inv_deg.data(), dg, nd, w, out);
      else if (width == 4)
        tile<I, 4>(indptr, indices, lo, len, r, Q, q0, cols, blk, nbk, d, tol, max_iter,
                   inv_deg.data(), dg, nd, w, out);
      else
        tile<I, 1>(indptr, indices, lo, len, r, Q, q0, cols, blk, nbk, d, tol, max_iter,
                   inv_deg.data(), dg, nd, w, out);
    }
    if (w.p.capacity() > kKeepBytes / sizeof(double)) w = Work();
  }
}

}  // namespace

void ppr_cpu(const int64_t* indptr, const void* indices, bool idx64, int64_t n,
             const double* r, int64_t Q, const int64_t* blocks, int64_t n_blocks,
             double damping, double tol, int64_t max_iter, double* out, int n_threads) {
  if (n < 0 || Q < 0 || n_blocks < 1) throw std::invalid_argument("ppr_cpu: bad sizes");
  if (indptr[0] != 0) throw std::invalid_argument("ppr_cpu: indptr[0] must be 0");
  for (int64_t i = 0; i < n; ++i)
    if (indptr[i + 1] < indptr[i]) throw std::invalid_argument("ppr_cpu: indptr decreases");
  if (blocks)
    for (int64_t i = 0; i < n; ++i)
      if (blocks[i] < 0 || blocks[i] >= n_blocks)
        throw std::invalid_argument("ppr_cpu: block id out of range");
  const int64_t nnz = indptr[n];
  for (int64_t e = 0; e < nnz; ++e) {
    const int64_t j = idx64 ? static_cast<const int64_t*>(indices)[e]
                            : static_cast<const int32_t*>(indices)[e];
    if (j < 0 || j >= n) throw std::invalid_argument("ppr_cpu: column index out of range");
  }
  if (n == 0 || Q == 0) return;
  if (idx64)
    run(indptr, static_cast<const int64_t*>(indices), n, r, Q, blocks, n_blocks, damping,
        tol, max_iter, out, n_threads);
  else
    run(indptr, static_cast<const int32_t*>(indices), n, r, Q, blocks, n_blocks, damping,
        tol, max_iter, out, n_threads);
}

}  // namespace memgas
