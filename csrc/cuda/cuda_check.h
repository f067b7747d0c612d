// Checks of CUDA calls shared by the kernel files: each error is thrown as the class that
// says what it is (common/errors.h), with the kernel's name and the step.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/errors.h"

namespace memgas {

// Errors after which the context is unusable ("sticky"): every later CUDA call fails.
inline bool cuda_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

inline std::string cuda_message(const char* kernel, const char* step, cudaError_t e) {
  return std::string(kernel) + ": " + step + ": " + cudaGetErrorName(e) + " (" +
         cudaGetErrorString(e) + ")";
}

// A CUDA call of this kernel: out of memory, a fault, or "cannot run here" (the rest).
inline void cuda_check(cudaError_t e, const char* kernel, const char* step) {
  if (e == cudaSuccess) return;
  if (e == cudaErrorMemoryAllocation) throw CudaOutOfMemory(cuda_message(kernel, step, e));
  if (cuda_sticky(e)) throw CudaFault(cuda_message(kernel, step, e));
  throw CudaUnavailable(cuda_message(kernel, step, e));
}

// Before the first launch: an error that earlier work left (an asynchronous fault of
// another kernel, a failed launch nobody checked) is reported as such, not blamed on
// this kernel. Driver / device problems stay "cannot run here".
inline void cuda_check_entry(const char* kernel, cudaStream_t s) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) return;
  if (cuda_sticky(e) || e == cudaErrorLaunchOutOfResources || e == cudaErrorInvalidValue ||
      e == cudaErrorInvalidConfiguration)
    throw CudaPriorError(cuda_message(kernel, "error left by earlier CUDA work", e));
  cuda_check(e, kernel, "entry");
}

}  // namespace memgas
