// cp.async (sm_80+): 16-byte copies from global to shared memory that complete in the background,
// grouped by commit and waited for by group count. Shared by the kernels that stage tiles
// (attention, MoE GEMM).
#pragma once

#include <cstdint>

namespace kestrel::cuda {

__device__ __forceinline__ uint32_t SmemAddress(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16 bytes global -> shared at shared address `smem`, bypassing L1 (.cg); zero-filled, the
// source not read, when !pred.
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem, bool pred = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(pred ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool pred = true) {
  CpAsync16(SmemAddress(smem), gmem, pred);
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Asks L2 for `bytes` (a multiple of 16) of global memory from `gmem` (16-byte aligned): a bulk
// prefetch (sm_90), nothing waited for or written; later loads of those bytes then hit L2.
__device__ __forceinline__ void PrefetchL2Bulk(const void* gmem, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace kestrel::cuda
