// Internal to the paged-attention kernels (included by the .cu files only): the head-dim
// dispatch and the prefill launcher, called by PagedAttention (attention_decode.cu) after the
// shared preconditions are checked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/attention.h"
#include "core/check.h"

namespace kestrel::cuda::detail {

// Calls f.template operator()<D>() for the supported head dims; one switch for both paths.
template <class F>
void DispatchHeadDim(int32_t head_dim, F&& f) {
  switch (head_dim) {
    case 16:
      f.template operator()<16>();
      return;
    case 32:
      f.template operator()<32>();
      return;
    case 64:
      f.template operator()<64>();
      return;
    case 128:
      f.template operator()<128>();
      return;
    case 256:
      f.template operator()<256>();
      return;
    default:
      KCHECK_MSG(false, "unsupported head_dim");
  }
}

inline bool SupportedHeadDim(int32_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// FlashAttention-2 style path for batches with max_query_len > 1 (attention_prefill.cu).
void LaunchPrefillAttention(const PagedAttentionParams& p, cudaStream_t stream);

// The decode split kernel on tensor cores (attention_decode_mma.cu): DecodeSplitKernel's
// geometry and partial outputs. Supported for head_dim 64 and 128 and GQA groups of up to 16
// heads, every cache type.
bool DecodeSplitMmaSupported(const PagedAttentionParams& p);
// Positions per split of the tensor-core kernel for p's cache and head dim: kDecodeSplitTokens, or
// a multiple of it (its partials and the combine follow). A constant of the model and cache, so a
// sequence's result stays independent of the batch.
int32_t DecodeSplitMmaTokens(const PagedAttentionParams& p);
void LaunchDecodeSplitMma(const PagedAttentionParams& p, int32_t n_splits, float* part_o,
                          float* part_m, float* part_l, cudaStream_t stream);

}  // namespace kestrel::cuda::detail
