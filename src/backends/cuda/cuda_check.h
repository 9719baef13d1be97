// Two error paths for CUDA calls (STYLE.md rule 6):
//   KCUDA_CHECK(expr)   a failing call is a bug (bad launch configuration, illegal address):
//                       abort with file, line and the CUDA error string.
//   CudaStatus(err, w)  a failure the user can cause (no GPU, driver too old, out of memory):
//                       a Status whose message says what was being done, never a bare code.
// Every launcher ends with KCUDA_CHECK_LAUNCH() so a bad configuration is caught at its source.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kestrel::cuda::detail {
[[noreturn]] inline void CudaCheckFailed(const char* file, int line, const char* expr,
                                         cudaError_t err) {
  std::fprintf(stderr, "CUDA call failed at %s:%d: %s: %s (%s)\n", file, line, expr,
               cudaGetErrorString(err), cudaGetErrorName(err));
  std::fflush(stderr);
  std::abort();
}
}  // namespace kestrel::cuda::detail

#define KCUDA_CHECK(expr)                                                                     \
  do {                                                                                        \
    const cudaError_t kestrel_cuda_err_ = (expr);                                             \
    if (kestrel_cuda_err_ != cudaSuccess) [[unlikely]]                                        \
      ::kestrel::cuda::detail::CudaCheckFailed(__FILE__, __LINE__, #expr, kestrel_cuda_err_); \
  } while (0)

// After a kernel launch: catches invalid configurations (grid, shared memory) immediately.
#define KCUDA_CHECK_LAUNCH() KCUDA_CHECK(cudaGetLastError())

namespace kestrel::cuda {

// "what: <CUDA message>" with a status code fitting the error (out of memory -> exhausted,
// no device / driver mismatch -> unavailable).
inline Status CudaStatus(cudaError_t err, std::string_view what) {
  std::string msg = std::string(what) + ": " + cudaGetErrorString(err);
  switch (err) {
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(std::move(msg));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return Unavailable(std::move(msg));
    default:
      return Internal(std::move(msg));
  }
}

}  // namespace kestrel::cuda
