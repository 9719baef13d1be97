// Programmatic dependent launch (PDL, sm_90): a kernel launched with LaunchPdl may be scheduled
// while the kernel before it on the stream is still finishing, so its launch and its blocks'
// start overlap the predecessor's tail. A decode step is ~430 kernels at batch 1.
//
// The contract every kernel launched through LaunchPdl keeps (each such kernel says where):
//   - PdlWait() runs in every thread before it reads anything an earlier kernel wrote and before
//     it writes any global memory (an earlier kernel may still be reading what it overwrites).
//     Only immutable data (weights, tables uploaded at load) may be touched before it.
//   - PdlWait() runs before any early return, so a grid never completes before its predecessor
//     has; completion therefore chains, and PdlWait() waits for every earlier kernel, not just
//     the one before.
//   - PdlLaunchDependents() may come anywhere (the dependent still waits for this grid to
//     complete in its own PdlWait); it only lets the next grid be scheduled early.
// A kernel launched without the attribute (plain <<<>>>, cuBLASLt) is ordered as usual; in it
// PdlWait() and PdlLaunchDependents() are no-ops. So every kernel here is correct under either
// launch, and KESTREL_PDL=0 turns the attribute off everywhere (SetPdlEnabled for tests).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backends/cuda/cuda_check.h"

namespace kestrel::cuda {

// Process-wide: whether LaunchPdl sets the attribute. First read: KESTREL_PDL ("0" = off),
// default on. Not to be changed while a stream is being captured.
bool PdlEnabled();
void SetPdlEnabled(bool on);

// Turns PDL off for a scope (per-stage event timing, where overlapping stages would blur the
// times), restoring the previous setting after.
class ScopedPdlOff {
 public:
  ScopedPdlOff() : saved_(PdlEnabled()) { SetPdlEnabled(false); }
  ~ScopedPdlOff() { SetPdlEnabled(saved_); }
  ScopedPdlOff(const ScopedPdlOff&) = delete;
  ScopedPdlOff& operator=(const ScopedPdlOff&) = delete;

 private:
  bool saved_;
};

#ifdef __CUDACC__

// Waits until every earlier grid on the stream has completed and its writes are visible.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next grid on the stream be scheduled once every block of this one has called it
// (or exited).
__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialisation when
// PdlEnabled(). The caller checks the launch (KCUDA_CHECK_LAUNCH) as after any launch.
template <typename... Params, typename... Args>
void LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
               cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = PdlEnabled() ? 1 : 0;
  KCUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

#endif  // __CUDACC__

}  // namespace kestrel::cuda
