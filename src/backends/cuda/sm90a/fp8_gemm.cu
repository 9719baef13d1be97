// Fp8BlockGemm (fp8_gemm.h): compiled for sm_90a only (wgmma, setmaxnreg), as its own object
// library; every other CUDA file keeps the build's architectures.
//
// Persistent 128 x 128 output tiles, one block per SM, the blocks in clusters of CM x CN (m
// fastest over the tile groups, so the clusters resident at once share their weight tiles
// through L2). Warpgroup 0 produces: one thread walks the tiles' 128-wide k blocks and has the
// tensor-copy engine bring each x and W tile (rows of 128 bytes, 128-byte swizzle) and the
// block's scales into a ring of kStages stages, each completing a `full` barrier. Within a
// cluster the blocks of one tile row share its x tile and those of one tile column its W tile:
// each block loads 1/CN of its x tile and 1/CM of its W tile and multicasts them to the blocks
// that share them (L2 reads per block and stage: 16 KB x (1/CN + 1/CM) instead of 32 KB).
// Warpgroups 1 and 2 consume rows [0, 64) and [64, 128) of the tile: per k block four wgmma
// m64n128k32 (e4m3 x e4m3 -> f32) into a block accumulator, then, once they are done (each warp
// arrives on the `empty` barrier of every block of the cluster, as any of them may write the
// stage next), the block's sum times x's row scale times W's block scale is added to the tile's
// f32 result. The producer runs ahead into the next tile while the consumers store the last.
//
// Measured on the H200 (docs/quantization.md): correct in every cluster shape, but slower than
// cuBLASLt's block-scaled GEMM (0.65-0.85 of its speed at 1 x 1, clusters slower still): each
// block is held by its own chain of waits (the time per stage does not change with the number
// of blocks), the two consumer warpgroups scaling their sums in step while the tensor cores
// wait.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/env_setting.h"
#include "backends/cuda/fp8_gemm.h"
#include "backends/cuda/pdl.cuh"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

constexpr int kTile = 128;                 // rows of x, rows of W, and k per stage
constexpr int kStages = 6;                 // 32 KB each
constexpr int kTileBytes = kTile * kTile;  // one operand's stage: 128 rows x 128 bytes
constexpr int kThreads = 384;              // producer warpgroup + two consumer warpgroups
constexpr int kConsumerWarps = 8;
// setmaxnreg: the block starts at 168 registers a thread (65,536 / 384, rounded down to 8); the
// producer warpgroup gives back what the two consumer warpgroups take (an .inc that the pool
// cannot cover waits forever).
constexpr int kEntryRegs = 168, kProducerRegs = 56, kConsumerRegs = 224;
static_assert((kEntryRegs - kProducerRegs) * 128 >= (kConsumerRegs - kEntryRegs) * 256);

struct Smem {
  uint8_t a[kStages][kTileBytes];  // 1024-byte aligned (the swizzle's atom)
  uint8_t b[kStages][kTileBytes];
  float x_scale[kStages][kTile];  // the tile rows' x scales for the stage's k block
  float w_scale[kStages][4];      // the 16 aligned bytes of W's scales holding the block's
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
constexpr uint32_t kStageBytes = 2 * kTileBytes + kTile * 4 + 16;  // what lands per stage
constexpr size_t kSmemBytes = sizeof(Smem) + 1024;                 // + room to align the base

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KESTREL_FP8_GEMM_DEVICE 1
#endif

// wgmma shared-memory descriptor for a K-major tile of 128-byte rows with the 128-byte swizzle:
// start address >> 4, leading byte offset 1 (unused by this layout), stride byte offset 1024
// (8 rows to the next 8), layout type 1 (128B swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t SwizzledDescriptor(const void* smem) {
  const uint64_t addr = SmemAddress(smem);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// d (+)= A(64 x 32, K-major in shared memory) . B(128 x 32, K-major)^T, e4m3 -> f32; d is set,
// not added to, when `accumulate` is 0.
__device__ __forceinline__ void WgmmaE4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                          int accumulate) {
#ifdef KESTREL_FP8_GEMM_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 "
      "}, %64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#endif
}

// Keeps the compiler from moving accesses of r across the wgmma fence / wait.
__device__ __forceinline__ void FenceOperand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}

__device__ __forceinline__ void WgmmaFence() {
#ifdef KESTREL_FP8_GEMM_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#ifdef KESTREL_FP8_GEMM_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N of this warpgroup's committed wgmma groups are still running.
template <int N>
__device__ __forceinline__ void WgmmaWait() {
#ifdef KESTREL_FP8_GEMM_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

template <int kRegs>
__device__ __forceinline__ void SetMaxRegistersDec() {
#ifdef KESTREL_FP8_GEMM_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegistersInc() {
#ifdef KESTREL_FP8_GEMM_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// The box of `map` at (c0 = column, c1 = row) into shared memory, completing on `bar`.
__device__ __forceinline__ void TensorCopy2d(void* smem, const CUtensorMap* map, int c0, int c1,
                                             uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(SmemAddress(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(SmemAddress(bar))
      : "memory");
}

// The same box, landing at the same offset in every block of `mask` (cluster ranks), each
// block's barrier at `bar`'s offset completing for its bytes.
__device__ __forceinline__ void TensorCopy2dMulticast(void* smem, const CUtensorMap* map, int c0,
                                                      int c1, uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(SmemAddress(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(SmemAddress(bar)), "h"(mask)
      : "memory");
}

template <int kBlocks>
__device__ __forceinline__ void TensorCopy2dTo(void* smem, const CUtensorMap* map, int c0, int c1,
                                               uint64_t* bar, uint16_t mask) {
  if constexpr (kBlocks == 1) {
    TensorCopy2d(smem, map, c0, c1, bar);
  } else {
    TensorCopy2dMulticast(smem, map, c0, c1, bar, mask);
  }
}

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t ClusterId() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t ClusterCount() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
  return r;
}
// Every thread of every block of the cluster (release / acquire).
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
// One arrival on the barrier at `bar`'s offset in the cluster's block `rank`.
__device__ __forceinline__ void MbarrierArriveCluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(SmemAddress(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote)
               : "memory");
}

template <int CM, int CN>
__global__ void __launch_bounds__(kThreads, 1)
    Fp8BlockGemmKernel(const __grid_constant__ CUtensorMap map_x,
                       const __grid_constant__ CUtensorMap map_w,
                       const __grid_constant__ CUtensorMap map_xs, const float* __restrict__ ws,
                       int ws_ld, int m, int k, int n, float* __restrict__ y, int64_t ldy) {
  extern __shared__ uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  constexpr int kCluster = CM * CN;
  const int warpgroup = threadIdx.x / 128;
  // This block's place in its cluster's CM x CN tile group, and the groups (m fastest).
  const int rank = kCluster == 1 ? 0 : static_cast<int>(ClusterRank());
  const int cm = rank % CM, cn = rank / CM;
  const int first_group = kCluster == 1 ? blockIdx.x : static_cast<int>(ClusterId());
  const int group_step = kCluster == 1 ? gridDim.x : static_cast<int>(ClusterCount());
  const int m_groups = (m + CM * kTile - 1) / (CM * kTile);
  const int groups = m_groups * ((n + CN * kTile - 1) / (CN * kTile));
  const int k_blocks = k / kTile;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      MbarrierInit(&s.full[i], 1);
      MbarrierInit(&s.empty[i], kConsumerWarps * kCluster);
    }
    MbarrierInitFence();
  }
  if constexpr (kCluster == 1) {
    __syncthreads();
  } else {
    ClusterSync();  // the peers' barriers are ready before anything multicasts into them
  }
  PdlWait();

  if (warpgroup == 0) {
    SetMaxRegistersDec<kProducerRegs>();
    if (threadIdx.x == 0) {
      int stage = 0;
      uint32_t phase = 0;
      // This block's share of the x tile (rows part cn of CN) goes to the blocks of its tile
      // row (same cm), its share of the W tile (part cm of CM) to those of its tile column.
      uint16_t x_mask = 0, w_mask = 0;
      for (int j = 0; j < CN; ++j) x_mask |= static_cast<uint16_t>(1u << (cm + CM * j));
      for (int j = 0; j < CM; ++j) w_mask |= static_cast<uint16_t>(1u << (j + CM * cn));
      constexpr int kXPart = kTile / CN, kWPart = kTile / CM;
      for (int group = first_group; group < groups; group += group_step) {
        const int tile_x = ((group % m_groups) * CM + cm) * kTile;
        const int w_block = (group / m_groups) * CN + cn;
        const int row_x = tile_x + cn * kXPart;
        const int row_w = w_block * kTile + cm * kWPart;
        // The scales come by the copy engine too (a load here would hold each stage back by a
        // round trip): x's as a box (rows past m zeros), W's as the 16 aligned bytes holding
        // the block's (row 0's for a cluster's spare tile past n, whose results are not stored).
        const float* w_scales =
            ws + static_cast<int64_t>(w_block * kTile < n ? w_block : 0) * ws_ld;
        for (int kb = 0; kb < k_blocks; ++kb) {
          MbarrierWait(&s.empty[stage], phase ^ 1);
          MbarrierExpectBytes(&s.full[stage], kStageBytes);
          TensorCopy2d(s.x_scale[stage], &map_xs, tile_x, kb, &s.full[stage]);
          BulkCopyToSharedArmed(s.w_scale[stage], w_scales + (kb & ~3), 16, &s.full[stage]);
          TensorCopy2dTo<CN>(s.a[stage] + cn * kXPart * kTile, &map_x, kb * kTile, row_x,
                             &s.full[stage], x_mask);
          TensorCopy2dTo<CM>(s.b[stage] + cm * kWPart * kTile, &map_w, kb * kTile, row_w,
                             &s.full[stage], w_mask);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    SetMaxRegistersInc<kConsumerRegs>();
    const int half = warpgroup - 1;  // rows [64 half, 64 half + 64) of the tile
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int row_in_tile = half * 64 + warp * 16 + lane / 4;  // and row_in_tile + 8
    int stage = 0;
    uint32_t phase = 0;
    for (int group = first_group; group < groups; group += group_step) {
      const int w_block = (group / m_groups) * CN + cn;
      const int row0 = ((group % m_groups) * CM + cm) * kTile + row_in_tile, row1 = row0 + 8;
      float result[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) result[i] = 0.0f;
      for (int kb = 0; kb < k_blocks; ++kb) {
        MbarrierWait(&s.full[stage], phase);
        // The scales, read before the stage is released (rows past m have zero scales).
        const float sw = s.w_scale[stage][kb & 3];
        const float s0 = s.x_scale[stage][row_in_tile] * sw;
        const float s1 = s.x_scale[stage][row_in_tile + 8] * sw;
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) FenceOperand(acc[i]);
        WgmmaFence();
        const uint64_t desc_a = SwizzledDescriptor(s.a[stage] + half * 64 * kTile);
        const uint64_t desc_b = SwizzledDescriptor(s.b[stage]);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {  // 32 bytes of k each: the start address moves by 2
          WgmmaE4m3(acc, desc_a + 2 * kk, desc_b + 2 * kk, kk);
        }
        WgmmaCommit();
        WgmmaWait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) FenceOperand(acc[i]);
        if (lane == 0) {
          if constexpr (kCluster == 1) {
            MbarrierArrive(&s.empty[stage]);
          } else {
#pragma unroll
            for (int r = 0; r < kCluster; ++r) MbarrierArriveCluster(&s.empty[stage], r);
          }
        }
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          result[4 * j + 0] = fmaf(acc[4 * j + 0], s0, result[4 * j + 0]);
          result[4 * j + 1] = fmaf(acc[4 * j + 1], s0, result[4 * j + 1]);
          result[4 * j + 2] = fmaf(acc[4 * j + 2], s1, result[4 * j + 2]);
          result[4 * j + 3] = fmaf(acc[4 * j + 3], s1, result[4 * j + 3]);
        }
      }
      // acc[4 j + {0, 1}]: row row0, columns 8 j + 2 (lane % 4) + {0, 1}; {2, 3}: row row1.
      const int col_base = w_block * kTile + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = col_base + 8 * j;
        if (row0 < m) {
          float* out = y + static_cast<int64_t>(row0) * ldy + col;
          if (col < n) out[0] = result[4 * j + 0];
          if (col + 1 < n) out[1] = result[4 * j + 1];
        }
        if (row1 < m) {
          float* out = y + static_cast<int64_t>(row1) * ldy + col;
          if (col < n) out[0] = result[4 * j + 2];
          if (col + 1 < n) out[1] = result[4 * j + 3];
        }
      }
    }
  }
  PdlLaunchDependents();
  // No block leaves while a peer may still multicast into its stages or arrive on its barriers.
  if constexpr (kCluster > 1) ClusterSync();
}

PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A [rows, cols] matrix of `type` (rows ld_bytes apart) read in boxes of box_cols x box_rows;
// elements past the end read as zeros.
CUtensorMap TileMap(const void* base, CUtensorMapDataType type, int64_t rows, int64_t cols,
                    int64_t ld_bytes, int box_cols, int box_rows, CUtensorMapSwizzle swizzle) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      TensorMapEncoder()(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  KCHECK_MSG(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed for an FP8 GEMM operand");
  return map;
}

}  // namespace

bool Fp8BlockGemmAvailable() {
  static const bool ok = [] {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
      return false;
    }
    return prop.major == 9 && prop.minor == 0 && TensorMapEncoder() != nullptr;
  }();
  return ok;
}

bool Fp8BlockGemmTakesScales(const float* ws, int64_t ws_ld) {
  return reinterpret_cast<uintptr_t>(ws) % 16 == 0 && ws_ld % 4 == 0;
}

namespace {

// KESTREL_FP8_GEMM_CLUSTER: "CMxCN" of 1x1 (the default: the fastest measured), 2x1, 1x2, 2x2,
// as 10 CM + CN.
EnvSetting g_cluster{"KESTREL_FP8_GEMM_CLUSTER", [](const char* env) {
                       const std::string v = env != nullptr ? env : "";
                       if (v == "2x1") return 21;
                       if (v == "1x2") return 12;
                       if (v == "2x2") return 22;
                       return 11;
                     }};

constexpr CUtensorMapSwizzle kSwizzle128 = CU_TENSOR_MAP_SWIZZLE_128B;

template <int CM, int CN>
void Launch(const uint8_t* xq, const float* xs, int64_t ld_xs, int64_t m, int64_t k,
            const uint8_t* w, const float* ws, int64_t ws_ld, int64_t n, float* y, int64_t ldy,
            cudaStream_t stream) {
  constexpr int kCluster = CM * CN;
  auto* kernel = &Fp8BlockGemmKernel<CM, CN>;
  cudaLaunchAttribute attr[2];
  int n_attr = 0;
  attr[n_attr].id = cudaLaunchAttributeClusterDimension;
  attr[n_attr].val.clusterDim.x = kCluster;
  attr[n_attr].val.clusterDim.y = 1;
  attr[n_attr].val.clusterDim.z = 1;
  ++n_attr;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  config.attrs = attr;
  // The clusters resident at once (a cluster's blocks share a GPC), found once.
  static const int max_clusters = [&] {
    KCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmemBytes)));
    cudaLaunchConfig_t probe = config;
    probe.gridDim = dim3(static_cast<unsigned>(CurrentDeviceSmCount() / kCluster * kCluster));
    probe.numAttrs = 1;
    int clusters = 0;
    KCUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe));
    KCHECK_MSG(clusters >= 1, "the FP8 GEMM's clusters do not fit an SM group");
    return clusters;
  }();
  if (PdlEnabled()) {
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
    ++n_attr;
  }
  config.numAttrs = static_cast<unsigned>(n_attr);
  const int64_t groups =
      ((m + CM * kTile - 1) / (CM * kTile)) * ((n + CN * kTile - 1) / (CN * kTile));
  KCHECK(groups <= INT32_MAX);
  const int64_t clusters = groups < max_clusters ? groups : max_clusters;
  config.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  // x and W: 128-byte rows of codes, the 128-byte swizzle wgmma reads; x's scales: the tile's
  // 128 rows of one k block.
  const CUtensorMap map_x =
      TileMap(xq, CU_TENSOR_MAP_DATA_TYPE_UINT8, m, k, k, kTile, kTile / CN, kSwizzle128);
  const CUtensorMap map_w =
      TileMap(w, CU_TENSOR_MAP_DATA_TYPE_UINT8, n, k, k, kTile, kTile / CM, kSwizzle128);
  const CUtensorMap map_xs = TileMap(xs, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, k / kTile, m, ld_xs * 4,
                                     kTile, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
  KCUDA_CHECK(cudaLaunchKernelEx(&config, kernel, map_x, map_w, map_xs, ws, static_cast<int>(ws_ld),
                                 static_cast<int>(m), static_cast<int>(k), static_cast<int>(n), y,
                                 ldy));
  KCUDA_CHECK_LAUNCH();
}

}  // namespace

void Fp8BlockGemm(const uint8_t* xq, const float* xs, int64_t ld_xs, int64_t m, int64_t k,
                  const uint8_t* w, const float* ws, int64_t ws_ld, int64_t n, float* y,
                  int64_t ldy, cudaStream_t stream) {
  KCHECK(Fp8BlockGemmAvailable());
  KCHECK(m >= 1 && n >= 1 && k >= kTile && k % kTile == 0 && m <= INT32_MAX && n <= INT32_MAX &&
         k <= INT32_MAX);
  KCHECK(ld_xs >= m && ld_xs <= INT32_MAX && ws_ld >= k / kTile && ws_ld <= INT32_MAX && ldy >= n);
  KCHECK(reinterpret_cast<uintptr_t>(xq) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(xs) % 16 == 0 && ld_xs % 4 == 0 &&
         Fp8BlockGemmTakesScales(ws, ws_ld));
  switch (g_cluster.Get()) {
    case 21:
      return Launch<2, 1>(xq, xs, ld_xs, m, k, w, ws, ws_ld, n, y, ldy, stream);
    case 12:
      return Launch<1, 2>(xq, xs, ld_xs, m, k, w, ws, ws_ld, n, y, ldy, stream);
    case 22:
      return Launch<2, 2>(xq, xs, ld_xs, m, k, w, ws, ws_ld, n, y, ldy, stream);
    default:
      return Launch<1, 1>(xq, xs, ld_xs, m, k, w, ws, ws_ld, n, y, ldy, stream);
  }
}

void SetFp8BlockGemmCluster(int cm, int cn) {
  KCHECK((cm == 1 || cm == 2) && (cn == 1 || cn == 2));
  g_cluster.Set(10 * cm + cn);
}

}  // namespace kestrel::cuda
