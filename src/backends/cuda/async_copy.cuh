// cp.async (sm_80+): 16-byte copies from global to shared memory that complete in the background,
// grouped by commit and waited for by group count. Shared by the kernels that stage tiles
// (attention, MoE GEMM). And bulk copies completed through mbarriers (sm_90; the streaming GEMV).
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
// Bulk copies (sm_90, the TMA engine without a tensor map) into shared memory, completed through
// an mbarrier: one thread arms the barrier with the bytes to expect and issues the copy; every
// thread that reads the destination first waits for the barrier's phase to complete.
//
// Initialises the barrier at `bar` for `count` arrivals per phase (a bulk copy's arming thread
// counts as one). The caller fences (MbarrierInitFence) and synchronises the block before any
// thread uses it.
__device__ __forceinline__ void MbarrierInit(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddress(bar)), "r"(count)
               : "memory");
#endif
}
// One arrival on the barrier (release: this thread's earlier writes to shared memory are seen
// by a thread whose wait returns for the completed phase).
__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddress(bar)) : "memory");
#endif
}
// Makes initialised barriers visible to the bulk-copy engine.
__device__ __forceinline__ void MbarrierInitFence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arms the barrier's current phase for `bytes` more to land (one arrival).
__device__ __forceinline__ void MbarrierExpectBytes(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddress(bar)),
               "r"(bytes)
               : "memory");
#endif
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global `gmem` to shared `smem`,
// completing on the barrier, which the caller has armed for them (MbarrierExpectBytes, possibly
// together with other copies').
__device__ __forceinline__ void BulkCopyToSharedArmed(void* smem, const void* gmem, uint32_t bytes,
                                                      uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(SmemAddress(smem)), "l"(gmem), "r"(bytes), "r"(SmemAddress(bar))
      : "memory");
#endif
}
// The same, the barrier's current phase armed here for these bytes alone.
__device__ __forceinline__ void BulkCopyToShared(void* smem, const void* gmem, uint32_t bytes,
                                                 uint64_t* bar) {
  MbarrierExpectBytes(bar, bytes);
  BulkCopyToSharedArmed(smem, gmem, bytes, bar);
}
// Waits until the barrier's phase with this parity (0 for its first, 1 for the next, ...) has
// completed.
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SmemAddress(bar)),
      "r"(parity)
      : "memory");
#endif
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace kestrel::cuda
