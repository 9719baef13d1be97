// W8A8 FP8 GEMM with block scales on the H200's FP8 tensor cores (wgmma, sm_90a): the own
// kernel of the --fp8-activations path of FP8 block-128 checkpoints (LinearEngine::RunFp8 with
// KESTREL_FP8_GEMM=wgmma; cuBLASLt's is the default, faster so far).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kestrel::cuda {

// Whether Fp8BlockGemm can run here: the kernel was built for sm_90a (CMake's architectures
// include 90 or 90a) and the current device is compute capability 9.0.
bool Fp8BlockGemmAvailable();

// Whether W's block scales (rows of ws_ld floats from ws) suit Fp8BlockGemm: 16-byte aligned,
// ws_ld a multiple of 4 (CudaWeightPlan pads its rows so).
bool Fp8BlockGemmTakesScales(const float* ws, int64_t ws_ld);

// y[i * ldy + j] = sum over k of (xq[i, c] * xs[(c / 128) * ld_xs + i]) *
//                                (w[j, c] * ws[(j / 128) * ws_ld + c / 128]),  i < m, j < n,
// xq [m, k] and w [n, k] e4m3 codes in rows of k bytes (16-byte aligned), xs and ws f32 scales
// (QuantizeActivationsFp8's layout for x, the checkpoint's weight_scale_inv for w; both
// 16-byte aligned with rows of a multiple of 4 floats: Fp8BlockGemmTakesScales), y f32.
// Each 128-wide k block is summed by the tensor cores in f32 and then scaled into the f32
// result (the order of the sums is fixed: the same bits on every run). k a multiple of 128.
// Persistent tiles of 128 x 128 on every SM in clusters that share their operand tiles, fed by
// the tensor-copy engine; PDL-launched.
void Fp8BlockGemm(const uint8_t* xq, const float* xs, int64_t ld_xs, int64_t m, int64_t k,
                  const uint8_t* w, const float* ws, int64_t ws_ld, int64_t n, float* y,
                  int64_t ldy, cudaStream_t stream);

// The blocks of a cluster: cm along m by cn along n (1 or 2 each; default 1 x 1, or
// KESTREL_FP8_GEMM_CLUSTER="CMxCN"), sharing their x and W tiles by multicast. Every shape gives
// the same bits (so far the larger clusters are slower: docs/quantization.md). For tests and
// benchmarks; not while a stream is being captured.
void SetFp8BlockGemmCluster(int cm, int cn);

}  // namespace kestrel::cuda
