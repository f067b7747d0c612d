// The only pybind11 file: memgas_gpu._C. Every op takes raw pointers (tensor.data_ptr()),
// sizes and, for CUDA, the stream handle, all as Python ints: the extension never sees
// a torch type, so it builds without torch headers and works with any torch version.
// Inputs are prepared (dtype, contiguity, device) by the Python wrappers in
// memgas_gpu/ops; the kernels validate sizes and ranges.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "cpu/gmm1d_cpu.h"
#include "cpu/graph_cpu.h"
#include "cpu/ppr_cpu.h"
#include "common/errors.h"
#include "common/ppr_workspace.h"
#ifdef MEMGAS_WITH_CUDA
#include "cuda/gmm1d_cuda.h"
#include "cuda/ppr_cuda.h"
#endif

namespace py = pybind11;
using memgas::GmmParams;

namespace {

template <typename T>
T* ptr(uintptr_t p) { return reinterpret_cast<T*>(p); }

GmmParams params(py::tuple t) {
  if (t.size() != 6) throw std::invalid_argument("gmm params: (eps, tol, reg, max_iter, "
                                                 "kmeans_tol, kmeans_max_iter)");
  return GmmParams{t[0].cast<double>(), t[1].cast<double>(), t[2].cast<double>(),
                   t[3].cast<int>(), t[4].cast<double>(), t[5].cast<int>()};
}

py::dict build_info() {
  py::dict d;
#ifdef _OPENMP
  d["openmp"] = _OPENMP;
#else
  d["openmp"] = 0;
#endif
#ifdef MEMGAS_WITH_CUDA
  d["cuda"] = true;
  d["cuda_runtime"] = memgas::cuda_runtime_version();
#else
  d["cuda"] = false;
#endif
  d["compiler"] = std::string(__VERSION__);
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "memgas_gpu native kernels (raw-pointer API; use memgas_gpu.ops)";
  m.def("build_info", &build_info, "Build facts: OpenMP version, CUDA, compiler.");
  // what a failed CUDA call was (common/errors.h); registered in every build so that
  // the Python wrappers can name them without a CUDA build
  py::register_exception<memgas::CudaOutOfMemory>(m, "CudaOutOfMemory", PyExc_MemoryError);
  py::register_exception<memgas::CudaFault>(m, "CudaFault", PyExc_RuntimeError);
  py::register_exception<memgas::CudaPriorError>(m, "CudaPriorError", PyExc_RuntimeError);
  py::register_exception<memgas::CudaUnavailable>(m, "CudaUnavailable", PyExc_RuntimeError);
  m.def("gmm1d_cpu",
        [](uintptr_t x, bool is_double, uintptr_t n, uintptr_t table, uintptr_t out,
           int64_t B, int64_t M, py::tuple p, int threads, bool cuda_layout) {
          GmmParams gp = params(p);
          py::gil_scoped_release nogil;
          memgas::gmm1d_cpu(ptr<const void>(x), is_double, ptr<const int64_t>(n),
                            ptr<const int64_t>(table), ptr<uint8_t>(out), B, M, gp, threads,
                            cuda_layout);
        },
        py::arg("x"), py::arg("is_double"), py::arg("n"), py::arg("table"), py::arg("out"),
        py::arg("B"), py::arg("M"), py::arg("params"), py::arg("threads"),
        py::arg("cuda_layout") = false);
  m.def("graph_topm_cpu",
        [](uintptr_t sims, bool is_double, int64_t R, int64_t W, uintptr_t ncand, int64_t M,
           bool gmm, uintptr_t table, py::tuple p, uintptr_t out_idx, uintptr_t out_acc,
           int threads) {
          GmmParams gp = params(p);
          py::gil_scoped_release nogil;
          memgas::graph_topm_cpu(ptr<const void>(sims), is_double, R, W,
                                 ptr<const int64_t>(ncand), M, gmm, ptr<const int64_t>(table),
                                 gp, ptr<int64_t>(out_idx), ptr<uint8_t>(out_acc), threads);
        });
  m.def("ppr_cpu",
        [](uintptr_t indptr, uintptr_t indices, bool idx64, int64_t n, uintptr_t r, int64_t Q,
           uintptr_t blocks, int64_t n_blocks, double damping, double tol, int64_t max_iter,
           uintptr_t out, int threads) {
          py::gil_scoped_release nogil;
          memgas::ppr_cpu(ptr<const int64_t>(indptr), ptr<const void>(indices), idx64, n,
                          ptr<const double>(r), Q, ptr<const int64_t>(blocks), n_blocks,
                          damping, tol, max_iter, ptr<double>(out), threads);
        });
  m.def("ppr_cuda_workspace", &memgas::ppr_cuda_workspace,
        "(float64, int32) scratch lengths of ppr_cuda for (n, Q, n_blocks).");
#ifdef MEMGAS_WITH_CUDA
  m.attr("has_cuda") = true;
  m.def("gmm1d_cuda",
        [](uintptr_t x, bool is_double, uintptr_t n, uintptr_t table, uintptr_t out,
           int64_t B, int64_t M, py::tuple p, uintptr_t err, uintptr_t stream) {
          GmmParams gp = params(p);
          py::gil_scoped_release nogil;
          memgas::gmm1d_cuda(ptr<const void>(x), is_double, ptr<const int64_t>(n),
                             ptr<const int64_t>(table), ptr<uint8_t>(out), B, M, gp,
                             ptr<int32_t>(err), ptr<void>(stream));
        });
  m.def("ppr_cuda",
        [](uintptr_t indptr, uintptr_t indices, bool idx64, int64_t n, uintptr_t r, int64_t Q,
           uintptr_t blocks, int64_t n_blocks, double damping, double tol, int64_t max_iter,
           uintptr_t out, uintptr_t work, int64_t work_len, uintptr_t iwork, int64_t iwork_len,
           uintptr_t stream) {
          py::gil_scoped_release nogil;
          return memgas::ppr_cuda(ptr<const int64_t>(indptr), ptr<const void>(indices), idx64,
                                  n, ptr<const double>(r), Q, ptr<const int64_t>(blocks),
                                  n_blocks, damping, tol, max_iter, ptr<double>(out),
                                  ptr<double>(work), work_len, ptr<int32_t>(iwork), iwork_len,
                                  ptr<void>(stream));
        });
#else
  m.attr("has_cuda") = false;
#endif
}
