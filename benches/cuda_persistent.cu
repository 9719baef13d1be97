// The two figures a persistent per-layer decode kernel depends on (docs/cuda.md, "What the
// batch-1 goals still need"), measured before building one:
//   grid_barrier   the time of a barrier among the blocks of one resident grid (one block per
//                  SM, the shape such a kernel would have): `rounds` barriers in one kernel,
//                  us per barrier.
//   layer_stream   a layer's weight bytes (the products of a one-row decode layer) streamed
//                  through a shared-memory ring per SM by bulk copies, the consumers doing no
//                  arithmetic: "separate", one kernel per product (each fills and drains its
//                  ring, as the GEMVs do today); "chained", one kernel for the whole layer whose
//                  producer runs on across products while the consumers wait at a grid barrier
//                  after each product (as they would for the next product's activations); "free",
//                  the same without the barriers. us per layer against the bytes at copy
//                  bandwidth: the bound of what a persistent kernel could reach.
// Weights rotate over copies that together exceed L2 (as bench_cuda_linear's). Median of --reps
// timed layers (CUDA events, launches with programmatic dependent launch as the model's).
// Usage: bench_cuda_persistent [--reps N] [--only grid_barrier|layer_stream]
//                              [--layer qwen3-8b-fp8|qwen3-8b-bf16|moe-bf16] [--rounds N]
//                              [--barrier-blocks-per-sm N] [--barrier-threads T]
// Layers (bytes per product): qwen3-8b-fp8 q|k|v 25.2 MB, o_proj 16.8, gate|up 100.7, down 50.3;
// qwen3-8b-bf16 twice those; moe-bf16 the 35B-A3B's delta-net in_proj 50.6, out_proj 16.8,
// router 1.1, nine experts' gate|up 37.7 and down 18.9.
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/async_copy.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/roofline.h"
#include "cuda_timing.h"

namespace kestrel::cuda {
namespace {

constexpr int kConsumerWarps = 16;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // warp 0 produces
constexpr int kStageBytes = 32 << 10;
constexpr int kSlots = 4;                  // a 128 KB ring, as the streaming GEMV's
constexpr int kMaxProducts = 8;
constexpr int kConsumerBarrier = 1;        // named barrier of the consumer warps

struct Layer {
  int n = 0;
  const unsigned char* base[kMaxProducts] = {};
  int64_t bytes[kMaxProducts] = {};
};

// Acquire load of a counter another block raises.
__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Thread 0 of the calling group raises `counter` (release) and waits until every block of the
// grid has: target = the value the counter reaches when all have arrived this time.
__device__ __forceinline__ void ArriveAndWait(unsigned* counter, unsigned target) {
  __threadfence();
  atomicAdd(counter, 1u);
  while (LoadAcquire(counter) < target) {
  }
}

__device__ __forceinline__ void ConsumersSync() {
  asm volatile("bar.sync %0, %1;" ::"n"(kConsumerBarrier), "n"(kConsumers) : "memory");
}

__global__ void __launch_bounds__(kThreads)
    GridBarrierKernel(unsigned* counter, int rounds, unsigned epoch_base) {
  PdlWait();
  for (int r = 0; r < rounds; ++r) {
    __syncthreads();
    if (threadIdx.x == 0) ArriveAndWait(counter, epoch_base + (r + 1) * gridDim.x);
    __syncthreads();
  }
  PdlLaunchDependents();
}

// Block b streams bytes [bytes * b / B, bytes * (b + 1) / B) of each product of `layer` (rounded
// to 16 bytes) in stages of kStageBytes through a ring of kSlots. kChained: after each product
// the consumers of every block meet at a grid barrier (counters[p]) before taking the next one.
template <bool kChained>
__global__ void __launch_bounds__(kThreads, 1)
    LayerStreamKernel(const Layer layer, unsigned* counters, unsigned epoch_base) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kSlots], done[kSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto range = [&](int p, int64_t* begin, int64_t* end) {
    const int64_t units = layer.bytes[p] / 16;
    *begin = units * blockIdx.x / gridDim.x * 16;
    *end = units * (blockIdx.x + 1) / gridDim.x * 16;
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      MbarrierInit(&full[s], 1);
      MbarrierInit(&done[s], kConsumers);
    }
    MbarrierInitFence();
  }
  __syncthreads();
  if (warp == 0) {
    // Producer: every stage of every product, in order; stage i goes to slot i % kSlots once
    // the consumers are done with stage i - kSlots. The first ring-full goes before PdlWait.
    int i = 0;
    bool waited = false;
    for (int p = 0; p < layer.n; ++p) {
      int64_t begin, end;
      range(p, &begin, &end);
      for (int64_t at = begin; at < end; at += kStageBytes, ++i) {
        const int slot = i % kSlots;
        if (i >= kSlots) {
          if (!waited) {
            PdlWait();
            waited = true;
          }
          MbarrierWait(&done[slot], static_cast<uint32_t>(i / kSlots - 1) & 1u);
        }
        if (lane == 0) {
          const uint32_t n = static_cast<uint32_t>(std::min<int64_t>(kStageBytes, end - at));
          BulkCopyToShared(ring + slot * kStageBytes, layer.base[p] + at, n, &full[slot]);
        }
        __syncwarp();
      }
    }
    if (!waited) PdlWait();
  } else {
    PdlWait();
    int i = 0;
    for (int p = 0; p < layer.n; ++p) {
      int64_t begin, end;
      range(p, &begin, &end);
      for (int64_t at = begin; at < end; at += kStageBytes, ++i) {
        const int slot = i % kSlots;
        MbarrierWait(&full[slot], static_cast<uint32_t>(i / kSlots) & 1u);
        MbarrierArrive(&done[slot]);  // read nothing: the bound of the streaming alone
      }
      if (kChained && p + 1 < layer.n) {
        ConsumersSync();
        if (threadIdx.x == 32) ArriveAndWait(&counters[p], epoch_base + gridDim.x);
        ConsumersSync();
      }
    }
  }
  PdlLaunchDependents();
}

struct Options {
  int reps = 30;
  int rounds = 1000;
  int barrier_blocks_per_sm = 1;
  int barrier_threads = kThreads;
  std::string only;
  std::string layer = "qwen3-8b-fp8";
};

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_cuda_persistent: %s needs a value\n", flag.c_str());
      return false;
    }
    const std::string value = argv[++i];
    if (flag == "--reps") {
      o->reps = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--rounds") {
      o->rounds = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--barrier-blocks-per-sm") {
      o->barrier_blocks_per_sm = std::clamp(std::atoi(value.c_str()), 1, 8);
    } else if (flag == "--barrier-threads") {
      o->barrier_threads = std::clamp(std::atoi(value.c_str()) / 32 * 32, 32, kThreads);
    } else if (flag == "--only" && (value == "grid_barrier" || value == "layer_stream")) {
      o->only = value;
    } else if (flag == "--layer" &&
               (value == "qwen3-8b-fp8" || value == "qwen3-8b-bf16" || value == "moe-bf16")) {
      o->layer = value;
    } else {
      std::fprintf(stderr, "bench_cuda_persistent: unknown flag or value: %s %s\n", flag.c_str(),
                   value.c_str());
      return false;
    }
  }
  return true;
}

std::vector<int64_t> LayerBytes(const std::string& name) {
  if (name == "moe-bf16") {
    return {50'593'792, 16'777'216, 1'052'672, 37'748'736, 18'874'368};
  }
  const std::vector<int64_t> fp8 = {25'165'824, 16'777'216, 100'663'296, 50'331'648};
  if (name == "qwen3-8b-fp8") return fp8;
  std::vector<int64_t> bf16;
  for (int64_t b : fp8) bf16.push_back(2 * b);
  return bf16;
}

int Main(int argc, char** argv) {
  Options opt;
  if (!Parse(argc, argv, &opt)) return 2;
  auto info = OpenDevice(0);
  if (!info.ok()) {
    std::printf("{\"skipped\": \"%s\"}\n", info.status().message().c_str());
    return 0;
  }
  auto roof_or = MeasureRoofline();
  if (!roof_or.ok()) {
    std::fprintf(stderr, "%s\n", roof_or.status().message().c_str());
    return 1;
  }
  const double copy_gb_s = roof_or.value().copy_gb_per_s;
  std::printf("{\"device\": \"%s\", \"copy_gb_per_s\": %.1f}\n", DescribeDevice(*info).c_str(),
              copy_gb_s);
  std::fflush(stdout);
  const int sms = CurrentDeviceSmCount();
  cudaStream_t stream;
  KCUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t delay_bytes = size_t{256} << 20;
  auto delay_src = DeviceBuffer::Allocate(delay_bytes, "delay copies");
  auto delay_dst = DeviceBuffer::Allocate(delay_bytes, "delay copies");
  auto counters_or = DeviceBuffer::Allocate(kMaxProducts * sizeof(unsigned), "barrier counters");
  if (!delay_src.ok() || !delay_dst.ok() || !counters_or.ok()) {
    std::fprintf(stderr, "bench_cuda_persistent: out of device memory\n");
    return 1;
  }
  DeviceBuffer& counters = counters_or.value();
  KCUDA_CHECK(cudaMemset(counters.get(), 0, kMaxProducts * sizeof(unsigned)));
  // Barrier targets grow with every launch, so the counters are never reset between launches:
  // counter 0 is grid_barrier's, counters 1.. the chained layer's product boundaries (each
  // reaches the same count).
  unsigned barrier_arrivals = 0, chain_arrivals = 0;
  auto timed = [&](auto&& fn) {
    return bench::MedianSeconds(opt.reps, stream, delay_src.value(), delay_dst.value(),
                                delay_bytes, 2, fn);
  };

  if (opt.only.empty() || opt.only == "grid_barrier") {
    // All blocks must be resident at once: --barrier-blocks-per-sm times --barrier-threads
    // within an SM's 2,048 threads.
    const int blocks = sms * opt.barrier_blocks_per_sm;
    if (opt.barrier_blocks_per_sm * opt.barrier_threads > 2048) {
      std::fprintf(stderr, "bench_cuda_persistent: %d blocks of %d threads do not fit an SM\n",
                   opt.barrier_blocks_per_sm, opt.barrier_threads);
      return 2;
    }
    const double sec = timed([&](int) {
      LaunchPdl(&GridBarrierKernel, dim3(blocks), dim3(opt.barrier_threads), 0, stream,
                counters.as<unsigned>(), opt.rounds, barrier_arrivals);
      barrier_arrivals += static_cast<unsigned>(opt.rounds * blocks);
      KCUDA_CHECK_LAUNCH();
    });
    std::printf("{\"bench\": \"grid_barrier\", \"blocks\": %d, \"threads\": %d, \"rounds\": %d, "
                "\"us_per_barrier\": %.3f}\n",
                blocks, opt.barrier_threads, opt.rounds, sec * 1e6 / opt.rounds);
    std::fflush(stdout);
  }

  if (opt.only.empty() || opt.only == "layer_stream") {
    const std::vector<int64_t> bytes = LayerBytes(opt.layer);
    int64_t layer_bytes = 0;
    for (int64_t b : bytes) layer_bytes += b;
    const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t{400} << 20) / layer_bytes + 1));
    std::vector<DeviceBuffer> weights;
    for (int c = 0; c < copies; ++c) {
      auto w = DeviceBuffer::Allocate(static_cast<size_t>(layer_bytes), "layer weights");
      if (!w.ok()) {
        std::fprintf(stderr, "bench_cuda_persistent: out of device memory\n");
        return 1;
      }
      KCUDA_CHECK(cudaMemset(w.value().get(), 1, static_cast<size_t>(layer_bytes)));
      weights.push_back(std::move(w).value());
    }
    auto layer_of = [&](int copy) {
      Layer l;
      l.n = static_cast<int>(bytes.size());
      int64_t off = 0;
      for (int p = 0; p < l.n; ++p) {
        l.base[p] = static_cast<const unsigned char*>(weights[static_cast<size_t>(copy)].get()) + off;
        l.bytes[p] = bytes[static_cast<size_t>(p)];
        off += (bytes[static_cast<size_t>(p)] + 255) / 256 * 256;
      }
      return l;
    };
    const size_t smem = size_t{kSlots} * kStageBytes;
    KCUDA_CHECK(cudaFuncSetAttribute(&LayerStreamKernel<true>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
    KCUDA_CHECK(cudaFuncSetAttribute(&LayerStreamKernel<false>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
    const double ideal_us = static_cast<double>(layer_bytes) / (copy_gb_s * 1e3);
    for (const char* mode : {"separate", "chained", "free"}) {
      const std::string m = mode;
      const double sec = timed([&](int r) {
        const Layer l = layer_of(r % copies);
        if (m == "separate") {
          for (int p = 0; p < l.n; ++p) {
            Layer one;
            one.n = 1;
            one.base[0] = l.base[p];
            one.bytes[0] = l.bytes[p];
            LaunchPdl(&LayerStreamKernel<false>, dim3(sms), dim3(kThreads), smem, stream, one,
                      counters.as<unsigned>(), 0u);
            KCUDA_CHECK_LAUNCH();
          }
        } else if (m == "chained") {
          LaunchPdl(&LayerStreamKernel<true>, dim3(sms), dim3(kThreads), smem, stream, l,
                    counters.as<unsigned>() + 1, chain_arrivals);
          KCUDA_CHECK_LAUNCH();
          chain_arrivals += static_cast<unsigned>(sms);
        } else {
          LaunchPdl(&LayerStreamKernel<false>, dim3(sms), dim3(kThreads), smem, stream, l,
                    counters.as<unsigned>(), 0u);
          KCUDA_CHECK_LAUNCH();
        }
      });
      std::printf("{\"bench\": \"layer_stream\", \"layer\": \"%s\", \"mode\": \"%s\", "
                  "\"products\": %zu, \"bytes\": %ld, \"us\": %.2f, \"us_at_copy_bw\": %.2f, "
                  "\"frac_copy_bw\": %.3f}\n",
                  opt.layer.c_str(), mode, bytes.size(), static_cast<long>(layer_bytes), sec * 1e6,
                  ideal_us, ideal_us / (sec * 1e6));
      std::fflush(stdout);
    }
  }
  KCUDA_CHECK(cudaStreamSynchronize(stream));
  KCUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace kestrel::cuda

int main(int argc, char** argv) { return kestrel::cuda::Main(argc, argv); }
