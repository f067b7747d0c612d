// Exceptions the kernels throw, beyond std::invalid_argument (a bad input: ValueError).
// bindings.cpp
// registers each as a Python class in memgas_gpu._C, so the Python wrappers
// (memgas_gpu/ops/_kernels.py) can tell what happened without parsing messages.
#pragma once
#include <stdexcept>
#include <string>

namespace memgas {

// The device ran out of memory (Python: _C.CudaOutOfMemory, a MemoryError): not a
// kernel failure; the wrapper frees torch's cached blocks and retries once.
struct CudaOutOfMemory : std::runtime_error {
  explicit CudaOutOfMemory(const std::string& m) : std::runtime_error(m) {}
};

// A fault while this kernel ran (illegal address, launch failure, ...): the CUDA context
// is unusable from now on (Python: _C.CudaFault, a RuntimeError). Never a fallback.
struct CudaFault : std::runtime_error {
  explicit CudaFault(const std::string& m) : std::runtime_error(m) {}
};

// The kernel cannot run here: no kernel image for this GPU, a driver older than the
// runtime, no device (Python: _C.CudaUnavailable, a RuntimeError): with backend="auto"
// memgas_gpu disables the kernel on that device and runs the torch op.
struct CudaUnavailable : std::runtime_error {
  explicit CudaUnavailable(const std::string& m) : std::runtime_error(m) {}
};

// An error left by earlier work on the device, found before this kernel was launched
// (Python: _C.CudaPriorError, a RuntimeError): reported as not this kernel's.
struct CudaPriorError : std::runtime_error {
  explicit CudaPriorError(const std::string& m) : std::runtime_error(m) {}
};

}  // namespace memgas
