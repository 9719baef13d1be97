// Grouped expert GEMM (moe_gemm.h): a multistage mma.sync GEMM whose block row index names one
// expert's tile.
//
// Block tile 128 rows (of one expert) x 128 output columns, k in steps of 32. 256 threads = 8
// warps as 2 (rows) x 4 (columns), each warp owning a 64 x 32 sub-tile: 4 x 4 accumulator
// fragments of mma.sync m16n8k16 (bf16 in, f32 accumulate), 64 floats per thread.
//
// Operands. A = the expert's x rows, B = rows of W_e; both are stored with k contiguous, which is
// row-major A and, for B[k][n] = W_e[n][k], the column-major ("col") B that mma wants. So both
// tiles are copied as they are (128 rows x 32 k = 64 bytes per row) and read with the plain
// (untransposed) ldmatrix.x4: per 16-wide k step a warp takes 4 A fragments (16 rows x 16 k,
// matrices: rows 0-7/8-15 x k 0-7/8-15) and 2 B loads (16 W rows x 16 k, each giving b0/b1 of
// two 8-column n-tiles).
//
// Shared memory: 4 stages of (A 8 KiB + B 8 KiB) = 64 KiB (dynamic, opted into). Global tiles
// arrive with 16-byte cp.async, one commit group per k step, 3 groups in flight while a stage is
// consumed. Rows past the expert's row count, W rows past n_out and 16-byte chunks past k are
// zero-filled (src-size 0: no read), so tails need no other special case.
//
// Swizzle. A tile row is 64 bytes, four 16-byte chunks; two rows share one 128-byte bank line.
// An ldmatrix phase reads 8 consecutive rows at the same logical chunk, which unswizzled hit
// only 2 distinct 16-byte bank groups (4-way conflict). Chunk c of row r is stored at chunk
// c ^ ((r >> 1) & 3): over 8 consecutive rows (from a multiple of 8) the pair (r & 1, chunk)
// then takes all 8 values, i.e. 8 distinct bank groups. The same holds for the cp.async stores
// (8 threads = 2 rows x 4 chunks).
//
// Finding the tile: block y is tile y of the whole list; expert e owns tiles [tile_begin[e],
// tile_begin[e + 1]), so the thread looking at the one e whose range contains y (empty experts
// have an empty range) publishes that expert's rows through shared memory. Blocks with
// y >= tile_begin[n_experts] (the host's grid is an upper bound) exit.
//
// Output: accumulators go straight to y as float2 (columns 2t, 2t + 1 of an n-tile), rows past
// the expert's count and columns past n_out not written.
#include "backends/cuda/moe_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/ptx.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kTileM = kMoeGemmTileRows;  // rows of one expert per block
constexpr int kTileN = 128;               // output columns per block
constexpr int kTileK = 32;                // k per pipeline stage
constexpr int kStages = 4;
constexpr int kWarpsM = 2;
constexpr int kWarpsN = 4;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kWarpM = kTileM / kWarpsM;  // 64
constexpr int kWarpN = kTileN / kWarpsN;  // 32
constexpr int kFragsM = kWarpM / 16;      // m16 fragments per warp
constexpr int kFragsN = kWarpN / 8;       // n8 fragments per warp
constexpr int kChunks = kTileK / 8;       // 16-byte chunks per tile row
constexpr int kSteps = kTileK / 16;       // mma k steps per stage
constexpr int kRowBytes = kTileK * 2;
constexpr int kTileBytes = kTileM * kRowBytes;  // one operand tile of one stage
constexpr int kStageBytes = 2 * kTileBytes;     // A tile, then B tile
constexpr int kSmemBytes = kStages * kStageBytes;
constexpr int kCopyRows = kThreads / kChunks;    // rows one pass of the block's copies covers
constexpr int kCopyPasses = kTileM / kCopyRows;  // passes per operand tile
// The A and B tiles share one shape (one copy loop, one offset table), and the swizzle permutes
// exactly 4 chunks per row.
static_assert(kTileM == kTileN && kChunks == 4 && kTileM % kCopyRows == 0);
static_assert(kFragsN % 2 == 0);

// Byte offset of 16-byte chunk `chunk` of tile row `row` (see the swizzle at the top). Rows
// that differ by a multiple of 8 have the same pattern, so fragment bases (multiples of 16 rows)
// just add row * kRowBytes.
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ ((row >> 1) & 3)) * 16));
}

// Four 8x8 b16 matrices; lane i gives the row address of matrix i / 8, row i % 8, and receives
// in r[j] the elements (row lane / 4, cols 2 * (lane % 4), +1) of matrix j.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

// Two blocks per SM (128 KiB of shared memory, at most 128 registers per thread), so one
// block's barrier and epilogue overlap the other's main loop.
__global__ void __launch_bounds__(kThreads, 2)
    MoeGroupedGemmKernel(const __nv_bfloat16* __restrict__ x,  // [*, k]
                         const int32_t* __restrict__ x_rows,   // [rows] or null
                         int k,
                         const __nv_bfloat16* __restrict__ w,  // [n_experts, n_out, k]
                         int n_out, const int32_t* __restrict__ expert_begin,
                         const int32_t* __restrict__ tile_begin, int n_experts,
                         float* __restrict__ y) {  // [*, n_out]
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int32_t s_expert, s_first, s_end;
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int tile = static_cast<int>(blockIdx.y);
  const int n0 = static_cast<int>(blockIdx.x) * kTileN;
  PdlWait();

  // The expert owning this tile: one load round, every thread checking its share of experts.
  const int n_tiles = tile_begin[n_experts];
  for (int e = tid; e < n_experts; e += kThreads) {
    const int t0 = tile_begin[e];
    if (t0 <= tile && tile < tile_begin[e + 1]) {
      s_expert = e;
      s_first = expert_begin[e] + (tile - t0) * kTileM;
      s_end = expert_begin[e + 1];
    }
  }
  __syncthreads();
  if (tile >= n_tiles) return;  // uniform: the grid's spare tiles
  const int expert = s_expert;
  const int first = s_first;                 // permuted row of the tile's row 0
  const int m = min(kTileM, s_end - first);  // rows of this tile

  // This thread's copies: chunk `c_chunk` of tile rows c_row + p * kCopyRows, of A and of B.
  // A copy that is not loaded (zero fill) still gets a valid address: its row's start, or row 0.
  const int c_chunk = tid % kChunks;
  const int c_row = tid / kChunks;
  const int k_chunks = k / 8;
  const __nv_bfloat16* a_src[kCopyPasses];
  const __nv_bfloat16* b_src[kCopyPasses];
  bool a_ok[kCopyPasses], b_ok[kCopyPasses];
  uint32_t c_dst[kCopyPasses];
  const __nv_bfloat16* w_e = w + static_cast<int64_t>(expert) * n_out * k;
#pragma unroll
  for (int p = 0; p < kCopyPasses; ++p) {
    const int r = c_row + p * kCopyRows;
    a_ok[p] = r < m;
    const int x_row = !a_ok[p] ? 0 : x_rows != nullptr ? x_rows[first + r] : first + r;
    a_src[p] = x + static_cast<int64_t>(x_row) * k;
    b_ok[p] = n0 + r < n_out;
    b_src[p] = w_e + static_cast<int64_t>(b_ok[p] ? n0 + r : 0) * k;
    c_dst[p] = SwizzledOffset(r, c_chunk);
  }
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto load_stage = [&](int kt, int stage) {
    const bool in_k = kt * kChunks + c_chunk < k_chunks;
    const int k_off = in_k ? kt * kTileK + c_chunk * 8 : 0;
    const uint32_t a_dst = smem_base + stage * kStageBytes;
#pragma unroll
    for (int p = 0; p < kCopyPasses; ++p) {
      CpAsync16(a_dst + c_dst[p], a_src[p] + k_off, a_ok[p] && in_k);
      CpAsync16(a_dst + kTileBytes + c_dst[p], b_src[p] + k_off, b_ok[p] && in_k);
    }
  };

  // ldmatrix row addresses of this lane, per 16-wide k step kk of a stage. A: matrices (rows
  // 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0..a3 of the
  // m16n8k16 A fragment. B (W rows = n): (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
  // (n 8-15, k 8-15) = b0, b1 of n-tile 2j, then b0, b1 of n-tile 2j + 1.
  const int warp_m = warp / kWarpsN;
  const int warp_n = warp % kWarpsN;
  const int a_row = warp_m * kWarpM + lane % 16;
  const int b_row = warp_n * kWarpN + lane % 8 + (lane / 16) * 8;
  uint32_t a_ld[kSteps], b_ld[kSteps];
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    a_ld[kk] = SwizzledOffset(a_row, kk * 2 + lane / 16);
    b_ld[kk] = kTileBytes + SwizzledOffset(b_row, kk * 2 + (lane / 8) % 2);
  }

  float acc[kFragsM][kFragsN][4];
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
    }
  }

  // Pipeline: stage s holds k step s mod kStages; one commit group per k step (empty past the
  // end, so the wait count stays fixed).
  const int k_tiles = (k_chunks + kChunks - 1) / kChunks;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    CpAsyncCommit();
  }
#pragma unroll 1
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();  // this thread's copies of step kt have landed
    // Everyone's copies of step kt are visible, and every warp is done with step kt - 1, whose
    // stage the next load overwrites.
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next, next % kStages);
    CpAsyncCommit();

    const uint32_t stage = smem_base + (kt % kStages) * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      uint32_t a[kFragsM][4], b[kFragsN][2];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) LdMatrixX4(a[i], stage + a_ld[kk] + i * 16 * kRowBytes);
#pragma unroll
      for (int j = 0; j < kFragsN / 2; ++j) {
        uint32_t r[4];
        LdMatrixX4(r, stage + b_ld[kk] + j * 16 * kRowBytes);
        b[2 * j][0] = r[0];
        b[2 * j][1] = r[1];
        b[2 * j + 1][0] = r[2];
        b[2 * j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j)
          MmaBf16(acc[i][j], a[i][0], a[i][1], a[i][2], a[i][3], b[j][0], b[j][1]);
      }
    }
  }
  PdlLaunchDependents();

  // Accumulator q of fragment (i, j): tile row warp_m * 64 + i * 16 + lane / 4 + 8 * (q / 2),
  // column warp_n * 32 + j * 8 + 2 * (lane % 4) + q % 2. n_out is even, so a column pair is
  // either wholly inside or wholly past n_out.
  const int col0 = n0 + warp_n * kWarpN + 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_m * kWarpM + i * 16 + lane / 4 + 8 * h;
      if (row >= m) continue;
      float* y_row = y + static_cast<int64_t>(first + row) * n_out;
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int col = col0 + j * 8;
        if (col < n_out) {
          *reinterpret_cast<float2*>(y_row + col) =
              make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
    }
  }
}

}  // namespace

void MoeGroupedGemm(const __nv_bfloat16* x, const int32_t* x_rows, int32_t k,
                    const __nv_bfloat16* w, int32_t n_out, const int32_t* expert_begin,
                    const int32_t* tile_begin, int32_t n_experts, int32_t max_tiles, float* y,
                    cudaStream_t stream) {
  KCHECK_MSG(k > 0 && k % 8 == 0, "k must be a positive multiple of 8");
  KCHECK_MSG(n_out > 0 && n_out % 2 == 0, "n_out must be positive and even");
  KCHECK(n_experts >= 1 && max_tiles >= 1 && max_tiles <= 65535);
  KCHECK(x != nullptr && w != nullptr && y != nullptr && expert_begin != nullptr &&
         tile_begin != nullptr);
  KCHECK_MSG(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0,
             "x and w must be 16-byte aligned");
  KCHECK(reinterpret_cast<uintptr_t>(y) % 8 == 0);
  // Above 48 KiB a kernel must opt in: a host call, once (the engine uses one device), fine
  // during graph capture as it is not a stream operation.
  static std::once_flag once;
  std::call_once(once, [] {
    KCUDA_CHECK(cudaFuncSetAttribute(MoeGroupedGemmKernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  });
  const dim3 grid(static_cast<unsigned>((n_out + kTileN - 1) / kTileN),
                  static_cast<unsigned>(max_tiles));
  LaunchPdl(&MoeGroupedGemmKernel, grid, dim3(kThreads), kSmemBytes, stream, x, x_rows,
            static_cast<int>(k), w, static_cast<int>(n_out), expert_begin, tile_begin,
            static_cast<int>(n_experts), y);
  KCUDA_CHECK_LAUNCH();
}

}  // namespace kestrel::cuda
