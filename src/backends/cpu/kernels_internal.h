// Internal interface between the op dispatch (ops.cpp, baseline x86-64) and the kernel files.
// Functions in namespace avx2 live in *_avx2.cpp (compiled with -mavx2 -mfma -mf16c) and may only
// be called after CpuHasAvx2Fma() returned true. The avx2 files keep their helpers in anonymous
// namespaces and avoid shared inline helpers, so that no AVX-encoded copy of an inline function
// can be picked by the linker for baseline code.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#include "backends/cpu/ops.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace kestrel::cpu {

// Element i of a weight tensor as f32; the data may be unaligned (memcpy loads).
template <DType T>
inline float LoadWeight(const void* base, int64_t i) {
  if constexpr (T == DType::kF32) {
    float f;
    std::memcpy(&f, static_cast<const uint8_t*>(base) + 4 * i, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(base) + 2 * i, 2);
    if constexpr (T == DType::kBF16) {
      return Bf16ToF32(h);
    } else {
      return F16ToF32(h);
    }
  }
}

// Calls fn.template operator()<T>() with the weight dtype as a template argument.
template <class Fn>
inline void DispatchWeightDType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: fn.template operator()<DType::kF32>(); return;
    case DType::kF16: fn.template operator()<DType::kF16>(); return;
    case DType::kBF16: fn.template operator()<DType::kBF16>(); return;
    default: KCHECK_MSG(false, "weight dtype must be F32, F16 or BF16");
  }
}

namespace reference {
// int8_activations: block-quantized w multiplies int8-quantized x (core/quant_blocks.h).
void Linear(const float* x, int64_t m_rows, const TensorView& w, const TensorView& bias, float* y,
            bool int8_activations);
void PagedAttention(const AttentionShape& shape, const AttentionBatch& batch, const float* q,
                    const KvRows& k_cache, const KvRows& v_cache, float* out,
                    std::span<float> scratch);
}  // namespace reference

namespace avx2 {
// avx512: the packed (prefill) kernel's register tiles in 512-bit registers (CpuHasAvx512() must
// hold); the same bits.
void LinearGroup(ThreadPool* pool, int64_t m_rows, std::span<const LinearJob> jobs,
                 bool int8_activations, bool batch_invariant = false,
                 Int8DotIsa int8_isa = Int8DotIsa::kAvx2, bool avx512 = false);
// avx512: the products in 512-bit registers (CpuHasAvx512() must hold); the same bits.
void PagedAttention(ThreadPool* pool, const AttentionShape& shape, const AttentionBatch& batch,
                    const float* q, const KvRows& k_cache, const KvRows& v_cache, float* out,
                    std::span<float> scratch, bool avx512 = false);
void SiluMul(const float* gate, const float* up, int64_t n, float* out);
// Floats of scratch per thread that PagedAttention needs.
int64_t AttentionScratchPerThread(const AttentionShape& shape, int64_t max_context_tokens);

// linear_int8_kernels.inc (built as linear_int8_avx2.cpp and its VNNI variants): block-quantized
// weights against int8 activations (LinearGroup's default for the formats with HasIntDot).
struct ActsView {  // one row's activation blocks (Q8_0: d per 32; Q8_K: d per 256 and bsums)
  const int8_t* q;
  const float* d;
  const int16_t* bsum;
  // Q8_0 activations for the VNNI builds' packed kernels: -128 x the sum of each block of 32
  // (k / 32 values, Sum32Offsets), which unsigned weights w + 128 owe.
  const int32_t* sum32 = nullptr;
};
void QuantizeActsQ8_0(const float* x, int64_t k, int8_t* q, float* d);
void Sum32Offsets(const int8_t* q, int64_t k, int32_t* sum32);
void QuantizeActsQ8_K(const float* x, int64_t k, int8_t* q, float* d, int16_t* bsum);
// y[t, n] for rows [n_begin, n_end) of w (dtype t, HasIntDot) and every token row t < m_rows.
// packed: w's rows interleaved by 8 (TensorView::cpu_packed; n_begin and n_end are then multiples
// of 8), or null.
void IntDotRange(DType t, const void* w, const void* packed, int64_t k_in, int64_t n_out,
                 int64_t n_begin, int64_t n_end, const ActsView* acts, int64_t m_rows, float* y);
}  // namespace avx2

// The same integer kernels built with a VNNI extension (linear_int8_kernels.inc): the same bits,
// fewer instructions for the formats of 32-element blocks (Q8_0, Q4_0, Q5_0, IQ4_NL).
namespace avxvnni {
void IntDotRange(DType t, const void* w, const void* packed, int64_t k_in, int64_t n_out,
                 int64_t n_begin, int64_t n_end, const avx2::ActsView* acts, int64_t m_rows,
                 float* y);
}  // namespace avxvnni
namespace avx512vnni {
void IntDotRange(DType t, const void* w, const void* packed, int64_t k_in, int64_t n_out,
                 int64_t n_begin, int64_t n_end, const avx2::ActsView* acts, int64_t m_rows,
                 float* y);
}  // namespace avx512vnni
// Which build of the integer kernels runs (Int8DotIsa, ops.h); the AVX2 one when `isa` is not
// supported here.
void IntDotRangeOn(Int8DotIsa isa, DType t, const void* w, const void* packed, int64_t k_in,
                   int64_t n_out, int64_t n_begin, int64_t n_end, const avx2::ActsView* acts,
                   int64_t m_rows, float* y);

}  // namespace kestrel::cpu
