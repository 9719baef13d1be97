// Inline-PTX helpers shared by the tensor-core kernels (linear.cu, moe.cu, moe_gemm.cu).
#pragma once

#include <cstdint>

#ifdef __CUDACC__

namespace kestrel::cuda {

// 16 bytes of weights that no other thread will read again: skip L1, ask L2 to fetch 256 B
// around them (the same warp reads the rest of that 256 B within its step).
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// d += A(16x16, row) . B(16x8, col), bf16 inputs, f32 accumulators (mma.sync m16n8k16). Not
// volatile: it only touches registers, so the compiler may interleave it with loads.
__device__ __forceinline__ void MmaBf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace kestrel::cuda

#endif  // __CUDACC__
