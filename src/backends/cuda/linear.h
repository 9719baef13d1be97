// Linear layers on the GPU: y[m, n] = x[m, k] . w[n, k]^T with bf16 operands, f32 accumulation
// and an f32 result.
//   - Few token rows (decode, small decode batches): SkinnyLinear, a hand-written kernel that
//     streams W from device memory exactly once; the time is the bytes of W over the bandwidth.
//   - Many token rows (prefill): cuBLASLt, where the product is bound by the tensor cores.
// LinearEngine::Run picks between the two by the row count (kSkinnyMaxRows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/cuda/quant_linear.h"
#include "core/status.h"

namespace kestrel::cuda {

// Row counts up to which Run uses the skinny kernel (its default variant); cuBLASLt above.
// Measured on the H200 (bench_cuda_linear, Qwen3-8B shapes, weights rotated past L2): at m = 1
// the CUDA-core variant fma_r1_ks4_u4 beats cuBLASLt on q|k|v (18.1 vs 18.7 us), o_proj (13.8 vs
// 15.7), down (29.4 vs 31.9) and the LM head (296 vs 299), and trails on gate|up (54.4 vs 52.5);
// the default "auto" streams the matrices of 35 MB and more (gate|up 51.4, LM head 279 us); from
// m = 2 cuBLASLt wins everywhere (m = 4: 18.4 vs 27.6 us on q|k|v). The rule depends on m only,
// so every run of a shape takes the same path and gives the same bits.
inline constexpr int64_t kSkinnyMaxRows = 1;

// The largest m SkinnyLinear accepts (8 tensor-core column tiles of 8 rows).
inline constexpr int64_t kSkinnyKernelMaxRows = 64;

// The skinny variant LinearEngine's batch-invariant mode runs at every m: 0, "tc16".
inline constexpr int kBatchInvariantSkinnyVariant = 0;

// The hand-written kernel, forced (tests and benchmark; Run calls it for m <= kSkinnyMaxRows).
//   x [m, k] bf16 row-major;  w [n, k] bf16 row-major;  y [m, n] f32 row-major
// Preconditions (KCHECK): 1 <= m <= kSkinnyKernelMaxRows, k > 0 and a multiple of 8, n > 0,
// x and w 16-byte aligned. Runs the default variant (DefaultSkinnyVariant()) when m is within
// its SkinnyVariantMaxRows, else variant 0 ("tc16", the tensor-core kernel, m <= 64).
// Deterministic (no atomics) and batch invariant within one variant: row i of y is bitwise the
// same whatever m is, for m in [1, SkinnyVariantMaxRows(DefaultSkinnyVariant())] and, when that
// is less than 64, separately for m in (that, 64] (see linear.cu).
void SkinnyLinear(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w, int64_t n,
                  float* y, cudaStream_t stream);

// Variants of the skinny kernel, selectable at run time (benchmark, tests, tuning). Indices are
// 0 .. SkinnyVariantCount()-1; 0 is "tc16", the original tensor-core kernel; then CUDA-core GEMV
// kernels named "fma_r{rows per warp}_ks{warps splitting k}_u{chunks unrolled}" (m <= 8);
// "stream", one block per SM streaming its rows through shared memory by bulk copies (m = 1);
// and "auto" (the default, m = 1): "stream" for matrices of 35 MB or more, fma_r1_ks4_u4 below.
// All are deterministic; SkinnyVariantBatchInvariant says whether row i of y is bitwise
// independent of m (for m up to the variant's max rows).
int SkinnyVariantCount();
const char* SkinnyVariantName(int v);
// Max m the variant supports.
int64_t SkinnyVariantMaxRows(int v);
bool SkinnyVariantBatchInvariant(int v);
// The index of the variant with this name, or -1.
int FindSkinnyVariant(const char* name);
// y = x . w^T by variant v; same arguments and preconditions as SkinnyLinear, with
// 1 <= m <= SkinnyVariantMaxRows(v).
void SkinnyLinearVariant(int v, const __nv_bfloat16* x, int64_t m, int64_t k,
                         const __nv_bfloat16* w, int64_t n, float* y, cudaStream_t stream);
// The variant SkinnyLinear (and so LinearEngine::Run for m <= kSkinnyMaxRows) uses. Process-wide.
// On first read it comes from the environment variable KESTREL_SKINNY_VARIANT (a variant name or
// index) when that is set and valid, else the built-in choice; SetDefaultSkinnyVariant overrides
// it. Not meant to be changed while kernels are being captured into a graph.
void SetDefaultSkinnyVariant(int v);
int DefaultSkinnyVariant();

class LinearEngine {
 public:
  // Creates the cuBLASLt handle and a device workspace of workspace_bytes (cuBLASLt uses it for
  // split-K partial sums), and dequant_bytes of device memory for the bf16 tiles of quantized
  // weights at m > kQuantGemvMaxRows (0 when the model has none). Errors (no GPU, out of
  // memory) come back as a Status.
  static Result<std::unique_ptr<LinearEngine>> Create(size_t workspace_bytes = 32 << 20,
                                                      size_t dequant_bytes = 0);
  ~LinearEngine();
  LinearEngine(const LinearEngine&) = delete;
  LinearEngine& operator=(const LinearEngine&) = delete;

  // y[m, n] = x[m, k] . w[n, k]^T
  //   x [m, k] bf16 row-major;  w [n, k] bf16 row-major (the safetensors layout);
  //   y [m, n] f32 row-major, must not alias x or w.
  // m >= 1, k a multiple of 8. Rows m <= kSkinnyMaxRows take SkinnyLinear, larger m cuBLASLt.
  // Capturable in a CUDA graph: no allocation on the device, no synchronisation. The cuBLASLt
  // algorithm is chosen once per (m, n, k, pointer alignments) and cached on the host; call Run
  // once per shape before capturing so the heuristic query happens outside the capture.
  // Thread-safe (the cache is behind a mutex), but the cuBLASLt workspace is shared by all calls:
  // calls on different streams must not overlap in time (use one engine per stream for that).
  void Run(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w, int64_t n,
           float* y, cudaStream_t stream);

  // The same with a weight of row segments (quant_linear.h): bf16 segments as above, quantized
  // ones through QuantGemv for m <= kQuantGemvMaxRows, else dequantized to bf16 tiles (whole
  // 128-row blocks that fit the engine's dequantization buffer) for cuBLASLt. Segment i writes
  // columns [row0_i, row0_i + rows_i) of y.
  void Run(const __nv_bfloat16* x, int64_t m, int64_t k, const Weight& w, int64_t n, float* y,
           cudaStream_t stream);

  // The cuBLASLt path forced, for any m >= 1 (same arguments as Run).
  void RunCublasLt(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w,
                   int64_t n, float* y, cudaStream_t stream);

  // Benchmarks: cuBLASLt's heuristic candidates for a shape, best first by its own ranking (Run
  // takes candidate 0). Runs candidate i of at most kMaxCublasLtCandidates and returns true, or
  // returns false (nothing run) when the heuristic offers fewer than i + 1 algorithms.
  static constexpr int kMaxCublasLtCandidates = 16;
  bool RunCublasLtCandidate(int i, const __nv_bfloat16* x, int64_t m, int64_t k,
                            const __nv_bfloat16* w, int64_t n, float* y, cudaStream_t stream);
  // Candidate i's configuration ("algo 21 tile 18 stages 8 split-k 1 ..."), without running it;
  // empty when there is no candidate i.
  std::string CublasLtCandidateName(int i, const __nv_bfloat16* x, int64_t m, int64_t k,
                                    const __nv_bfloat16* w, int64_t n, const float* y);

  // The same writing y[i * ldy + j] (ldy >= n).
  void RunCublasLtStrided(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w,
                          int64_t n, float* y, int64_t ldy, cudaStream_t stream);

  // FP8 block-quantized weights at m > kQuantGemvMaxRows: W8A8 on the FP8 tensor cores
  // (QuantizeActivationsFp8, then cuBLASLt with 128x128 / 1x128 block scales) instead of bf16
  // tiles. Off by default: faster prefill, but the activations lose bits the float32 reference
  // keeps. A shape cuBLASLt has no algorithm for falls back to the tiles.
  void set_fp8_activations(bool on);
  // Which FP8 GEMM the W8A8 path runs: cuBLASLt's block-scaled one (the default) or Kestrel's
  // own (Fp8BlockGemm, fp8_gemm.h: wgmma with the block scales applied per 128-wide k block;
  // H200 only, slower than cuBLASLt so far: docs/quantization.md). First value:
  // KESTREL_FP8_GEMM ("cublaslt" or "wgmma").
  enum class Fp8Gemm { kCublasLt, kWgmma };
  void set_fp8_gemm(Fp8Gemm which);
  // The setting, with kWgmma read as kCublasLt where the own kernel is not available.
  Fp8Gemm fp8_gemm() const;
  // The W8A8 product of one FP8 segment; false (nothing written) when cuBLASLt has no algorithm
  // or the dequantization buffer holds no chunk of rows.
  bool RunFp8(const __nv_bfloat16* x, int64_t m, int64_t k, const WeightSegment& w, int64_t n,
              float* y, int64_t ldy, cudaStream_t stream);

  // Benchmarks: the W8A8 cuBLASLt path takes the heuristic's candidate i (0, the default: its
  // first) for the shapes it meets from now on; a shape with fewer candidates makes RunFp8
  // return false. Fp8CublasLtLastAlgo: the configuration of the last candidate run at i > 0.
  void set_fp8_cublaslt_candidate(int i);
  std::string Fp8CublasLtLastAlgo() const;

  // Batch-invariant mode (`--deterministic`): Run takes one kernel at every m, the tensor-core
  // skinny kernel ("tc16", whose row i is bitwise independent of the other rows) over chunks of
  // kSkinnyKernelMaxRows rows, so a token's output does not depend on how many rows share its
  // call. Prefill-sized m reads W once per chunk (slower than cuBLASLt). bf16 weights only:
  // Run with a quantized Weight fails a check. Off by default; not to be switched during a
  // graph capture.
  void set_batch_invariant(bool on);

  // "skinny" or "cublaslt": the path Run takes for m rows (labels in the benchmark).
  static const char* PathName(int64_t m);

 private:
  struct Impl;
  explicit LinearEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel::cuda
