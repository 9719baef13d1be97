// Benchmark of the CUDA linear layers (LinearEngine, SkinnyLinear) on the Qwen3-8B shapes, printed
// as JSON lines next to the device's own ceilings measured in the same run:
//   copy_bw     device-to-device cudaMemcpy of 2 GiB, bytes read + written over time
//   gemm_peak   cuBLASLt 8192^3 bf16 -> f32 product, TFLOP/s
// Then per (n, k, m, path): median microseconds of one call, GB/s of the bytes that must move
// (n*k*2 weights + m*k*2 input + m*n*4 output) and the fractions of the two ceilings. For m up to
// kSkinnyKernelMaxRows both paths are timed ("run": true marks the one LinearEngine::Run takes),
// so the crossover kSkinnyMaxRows can be chosen from these lines.
// The weights rotate over >= 4 copies (> 200 MB in all) so the 60 MB L2 never serves them
// (unless --warm-l2).
// Then the quantized GEMV (QuantGemv) at m = 1 and 8 for FP8 block-128, 4-bit affine (groups
// 64 and 128) and 8-bit affine (groups 16 and 32) codes on the same shapes: bytes = codes +
// scales (+ biases) + x + y.
// Usage: bench_cuda_linear [--reps N] [--quant-only | --bf16-only | --fp8-prefill-only]
//                          [--shapes MODEL]
//                          [--m LIST] [--lt-candidates N] [--warm-l2]
//   --shapes MODEL       the per-layer shapes of qwen3-8b (default), qwen3.5-27b or
//                        qwen3.5-35b-a3b (its fused projections as CudaDecoder places them)
//   --m LIST             token rows of the bf16 table, comma-separated (default 1,2,4,8,16;
//                        at most kSkinnyKernelMaxRows)
//   --lt-candidates N    also time cuBLASLt's first N heuristic algorithms at each m > 1
//                        ("path": "cublaslt_candidate", with the algorithm's configuration)
//                        and its block-scaled FP8 ones for the prefill products
//                        ("fp8_cublaslt_candidate")
//   --bf16-only          skip the quantized GEMVs and the FP8 prefill products
//   --fp8-prefill-only   only the FP8 prefill products
//   --warm-l2            one copy of each weight instead of rotating copies: after the first
//                        timed call a matrix that fits in L2 is read from there (the bound of
//                        any scheme that prefetches the next product's weights into L2)
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef KESTREL_HAS_CUDA

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/fp8_gemm.h"
#include "backends/cuda/linear.h"
#include "backends/cuda/quant_linear.h"
#include "core/check.h"
#include "core/dtype.h"
#include "cuda_timing.h"

namespace kestrel::cuda {
namespace {

DeviceBuffer MustAllocate(size_t bytes, const char* what) {
  auto buf = DeviceBuffer::Allocate(bytes, what);
  if (!buf.ok()) {
    std::fprintf(stderr, "%s\n", buf.status().message().c_str());
    std::exit(1);
  }
  return std::move(buf).value();
}

// Fills a device buffer with random bf16 in (-1, 1) (never zeros: a product on zeros can run
// faster than on real data). One 32 MiB random block is generated and tiled, which keeps start-up
// short; the data is still random to the kernels.
void FillRandomBf16(DeviceBuffer& buf, uint64_t seed) {
  constexpr size_t kBlockElems = 16 << 20;
  static std::vector<uint16_t> block;
  if (block.empty()) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    block.resize(kBlockElems);
    for (uint16_t& b : block) {
      b = F32ToBf16(dist(rng));
      if ((b & 0x7FFF) == 0) b = 0x3C00;
    }
  }
  const size_t n_elems = buf.size_bytes() / 2;
  // Start each buffer at a different offset of the block so copies differ.
  size_t offset = (seed * 7919) % kBlockElems;
  for (size_t done = 0; done < n_elems;) {
    const size_t chunk = std::min(n_elems - done, kBlockElems - offset);
    KCUDA_CHECK(cudaMemcpy(buf.as<uint16_t>() + done, block.data() + offset, chunk * 2,
                           cudaMemcpyHostToDevice));
    done += chunk;
    offset = 0;
  }
}

using bench::Median;

// Random bytes (mask applied to each), tiled from one 32 MiB host block like FillRandomBf16.
void FillRandomBytes(DeviceBuffer& buf, uint64_t seed, uint8_t mask) {
  constexpr size_t kBlock = 32 << 20;
  std::vector<uint8_t> block(kBlock);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < kBlock; i += 8) {
    const uint64_t r = rng();
    for (int b = 0; b < 8; ++b) block[i + b] = static_cast<uint8_t>(r >> (8 * b)) & mask;
  }
  for (size_t done = 0; done < buf.size_bytes();) {
    const size_t chunk = std::min(buf.size_bytes() - done, kBlock);
    KCUDA_CHECK(cudaMemcpy(buf.as<uint8_t>() + done, block.data(), chunk, cudaMemcpyHostToDevice));
    done += chunk;
  }
}

void FillConstantF32(DeviceBuffer& buf, float v) {
  std::vector<float> host(buf.size_bytes() / 4, v);
  KCUDA_CHECK(cudaMemcpy(buf.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
}

// Copies of a weight of w_bytes the timed calls rotate over: at least 4 and over 200 MB in all,
// so that L2 never serves them; one with --warm-l2.
int WeightCopies(size_t w_bytes, bool warm_l2) {
  return warm_l2 ? 1 : std::max<int>(4, static_cast<int>((size_t{200} << 20) / w_bytes) + 1);
}

// Median seconds of one call of fn(rep), behind one 1 GiB device copy (cuda_timing.h).
template <class Fn>
double MedianSeconds(int reps, cudaStream_t stream, DeviceBuffer& delay_src,
                     DeviceBuffer& delay_dst, Fn&& fn) {
  return bench::MedianSeconds(reps, stream, delay_src, delay_dst,
                              std::min<size_t>(delay_src.size_bytes(), size_t{1} << 30), 1, fn);
}

int Main(int argc, char** argv) {
  const int reps = bench::ParseReps(argc, argv);
  bool quant_only = false, bf16_only = false, warm_l2 = false, fp8_prefill_only = false;
  std::string shape_set = "qwen3-8b";
  std::vector<int64_t> ms = {1, 2, 4, 8, 16};
  int lt_candidates = 0;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--quant-only") == 0) {
      quant_only = true;
    } else if (std::strcmp(argv[i], "--fp8-prefill-only") == 0) {
      quant_only = fp8_prefill_only = true;
    } else if (std::strcmp(argv[i], "--bf16-only") == 0) {
      bf16_only = true;
    } else if (std::strcmp(argv[i], "--warm-l2") == 0) {
      warm_l2 = true;
    } else if (std::strcmp(argv[i], "--shapes") == 0 && has_value) {
      shape_set = argv[++i];
    } else if (std::strcmp(argv[i], "--lt-candidates") == 0 && has_value) {
      lt_candidates = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--m") == 0 && has_value) {
      ms.clear();
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long v = std::strtol(p, &end, 10);
        if (end == p || v < 1 || v > kSkinnyKernelMaxRows) {
          std::fprintf(stderr, "bench_cuda_linear: --m wants row counts in 1..%ld, got '%s'\n",
                       static_cast<long>(kSkinnyKernelMaxRows), argv[i]);
          return 2;
        }
        ms.push_back(v);
        p = *end == ',' ? end + 1 : end;
      }
    } else if (std::strcmp(argv[i], "--reps") == 0 && has_value) {
      ++i;  // bench::ParseReps
    } else {
      std::fprintf(stderr, "bench_cuda_linear: unknown or incomplete argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (ms.empty() || (quant_only && bf16_only)) {
    std::fprintf(stderr, "bench_cuda_linear: nothing to run\n");
    return 2;
  }
  auto info = OpenDevice(0);
  if (!info.ok()) {
    std::printf("{\"skipped\": \"%s\"}\n", info.status().message().c_str());
    return 0;
  }
  std::printf("{\"device\": \"%s\", \"weights\": \"%s\"}\n", DescribeDevice(*info).c_str(),
              warm_l2 ? "one copy (warm L2)" : "rotated past L2");
  auto engine_or = LinearEngine::Create();
  if (!engine_or.ok()) {
    std::fprintf(stderr, "%s\n", engine_or.status().message().c_str());
    return 1;
  }
  LinearEngine& engine = *engine_or.value();
  cudaStream_t stream;
  KCUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Roofline 1: device-to-device copy of 2 GiB (read + written).
  const size_t copy_bytes = size_t{2} << 30;
  DeviceBuffer copy_src = MustAllocate(copy_bytes, "copy source");
  DeviceBuffer copy_dst = MustAllocate(copy_bytes, "copy destination");
  KCUDA_CHECK(cudaMemset(copy_src.get(), 0x3C, copy_bytes));
  std::vector<double> copy_s;
  {
    cudaEvent_t e0, e1;
    KCUDA_CHECK(cudaEventCreate(&e0));
    KCUDA_CHECK(cudaEventCreate(&e1));
    for (int r = 0; r < 12; ++r) {
      KCUDA_CHECK(cudaEventRecord(e0, stream));
      KCUDA_CHECK(cudaMemcpyAsync(copy_dst.get(), copy_src.get(), copy_bytes,
                                  cudaMemcpyDeviceToDevice, stream));
      KCUDA_CHECK(cudaEventRecord(e1, stream));
      KCUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      KCUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 2) copy_s.push_back(ms * 1e-3);  // first two are warm-up
    }
    KCUDA_CHECK(cudaEventDestroy(e0));
    KCUDA_CHECK(cudaEventDestroy(e1));
  }
  const double copy_gb_s = 2.0 * copy_bytes / Median(copy_s) / 1e9;
  std::printf("{\"roofline\": \"copy_bw\", \"bytes\": %zu, \"gb_s\": %.1f}\n", 2 * copy_bytes,
              copy_gb_s);

  struct Shape {
    int64_t n, k;
    const char* name;
  };
  // The first four are a layer's products (the layer sums below add them); the LM head last.
  std::vector<Shape> shapes;
  if (shape_set == "qwen3-8b") {
    shapes = {{6144, 4096, "qkv"},
              {4096, 4096, "o_proj"},
              {24576, 4096, "gate_up"},
              {4096, 12288, "down"},
              {151936, 4096, "lm_head"}};
  } else if (shape_set == "qwen3.5-27b") {
    // Delta-net q|k|v|z|b|a and out_proj, dense gate|up and down, attention q(+gate)|k|v and
    // o_proj, the LM head.
    shapes = {{16480, 5120, "dn_in_proj"}, {5120, 6144, "dn_out_proj"},
              {34816, 5120, "gate_up"},    {5120, 17408, "down"},
              {14336, 5120, "attn_qkv"},   {5120, 6144, "attn_o_proj"},
              {248320, 5120, "lm_head"}};
  } else if (shape_set == "qwen3.5-35b-a3b") {
    // Delta-net q|k|v|z|b|a and out_proj, router|shared gate, shared expert gate|up and down,
    // attention q(+gate)|k|v and o_proj, the LM head.
    shapes = {{12352, 2048, "dn_in_proj"},  {2048, 4096, "dn_out_proj"},
              {257, 2048, "router"},        {1024, 2048, "shared_gate_up"},
              {2048, 512, "shared_down"},   {9216, 2048, "attn_qkv"},
              {2048, 4096, "attn_o_proj"},  {248320, 2048, "lm_head"}};
  } else {
    std::fprintf(stderr,
                 "bench_cuda_linear: --shapes wants qwen3-8b, qwen3.5-27b or qwen3.5-35b-a3b, "
                 "got '%s'\n",
                 shape_set.c_str());
    return 2;
  }

  // Quantized GEMV: each shape in FP8 block-128, 4-bit affine (groups 64 and 128, with the
  // scale-bias pairs unscaled and scaled: quant_linear.h, scaled_codes) and 8-bit affine (groups
  // 16 and 32: GGUF Q6_K / Q2_K / Q3_K and Q8_0 / Q5_K / IQ4_* as the loader places them; with the
  // bias from the scale as the symmetric formats have it ("scaled" in the table below,
  // "bias_from_scale" in the output) or a bias array; through the CUDA-core GEMV or, "mma", the
  // tensor-core one), m = 1 and 8.
  struct QuantCase {
    WeightFormat format;
    int group;
    bool scaled;
    bool mma = false;  // 8-bit: the tensor-core GEMV (codes in mma order)
  };
  const QuantCase quant_cases[] = {
      {WeightFormat::kFp8Block, 128, false},    {WeightFormat::kAffine4, 64, false},
      {WeightFormat::kAffine4, 64, true},       {WeightFormat::kAffine4, 128, false},
      {WeightFormat::kAffine4, 128, true},      {WeightFormat::kAffine8, 16, true},
      {WeightFormat::kAffine8, 16, true, true}, {WeightFormat::kAffine8, 16, false, true},
      {WeightFormat::kAffine8, 32, true},       {WeightFormat::kAffine8, 32, true, true}};
  if (!bf16_only) {
    for (const QuantCase& qc : quant_cases) {
      if (fp8_prefill_only) break;
      const WeightFormat format = qc.format;
      for (const Shape& shape : shapes) {
        const int64_t n = shape.n, k = shape.k;
        const bool fp8 = format == WeightFormat::kFp8Block;
        const bool eight = format == WeightFormat::kAffine8;
        const size_t code_bytes = static_cast<size_t>(fp8 || eight ? n * k : n * k / 2);
        const size_t scale_floats = static_cast<size_t>(fp8 ? (n + 127) / 128 * (k / 128)
                                                            : n * (k / qc.group));
        // f32 scales; bf16 scale-bias pairs; 8-bit: f32 scales (and f32 biases unless the bias
        // comes from the scale)
        const size_t scale_bytes = scale_floats * (eight && !qc.scaled ? 8 : 4);
        const size_t w_bytes = code_bytes + scale_bytes;
        const int n_copies = WeightCopies(w_bytes, warm_l2);
        std::vector<DeviceBuffer> codes, scales;
        std::vector<WeightSegment> segs;
        for (int c = 0; c < n_copies; ++c) {
          codes.push_back(MustAllocate(code_bytes, "codes"));
          // e4m3: exponent <= 14 (no NaN codes); 4-bit: any byte.
          FillRandomBytes(codes.back(), 300 + c, fp8 ? 0xF7 : 0xFF);
          scales.push_back(MustAllocate(scale_bytes, "scales"));
          // FP8: 0.01 per block; 4-bit: the bf16 pair (s, b) = (0.01, -0.08) in each word, scaled
          // (0.01 * 2^133, -0.08); 8-bit: 0.01 for the scales and the biases.
          FillConstantF32(scales.back(), fp8 || eight ? 0.01f
                                         : qc.scaled  ? std::bit_cast<float>(0xBDA47EA4u)
                                                      : std::bit_cast<float>(0xBDA43C24u));
          WeightSegment w;
          w.format = format;
          w.rows = n;
          w.data = codes.back().get();
          w.scale = scales.back().as<float>();
          if (fp8) {
            w.group = 128;
            w.scale_ld = static_cast<int32_t>(k / 128);
          } else if (eight) {
            if (qc.scaled) {
              w.bias_from_scale = true;
              w.bias_ratio = -1.5f;
            } else {
              w.bias = scales.back().as<float>() + scale_floats;
            }
            w.mma_order = qc.mma;
            w.group = qc.group;
          } else {
            w.scale = nullptr;
            w.scale_bias = scales.back().as<uint32_t>();
            w.scaled_codes = qc.scaled;
            w.group = qc.group;
          }
          segs.push_back(w);
        }
        DeviceBuffer x = MustAllocate(static_cast<size_t>(8 * k * 2), "x");
        DeviceBuffer y = MustAllocate(static_cast<size_t>(8 * n * 4), "y");
        FillRandomBf16(x, 7);
        for (const int64_t m : {int64_t{1}, int64_t{8}}) {
          const double sec = MedianSeconds(reps, stream, copy_src, copy_dst, [&](int r) {
            QuantGemv(x.as<__nv_bfloat16>(), m, k, segs[r % n_copies], n, y.as<float>(), n, stream);
          });
          const double bytes = static_cast<double>(w_bytes) + static_cast<double>(m) * k * 2 +
                               static_cast<double>(m) * n * 4;
          const double gb_s = bytes / sec / 1e9;
          std::printf(
              "{\"quant\": \"%s\", \"group\": %d, \"%s\": %s, \"mma\": %s, "
              "\"shape\": \"%s\", \"n\": %ld, "
              "\"k\": %ld, \"m\": %ld, \"weight_bytes\": %zu, \"us\": %.2f, "
              "\"gb_s\": %.1f, \"frac_bw\": %.3f}\n",
              WeightFormatName(format), qc.group, eight ? "bias_from_scale" : "scaled_codes",
              qc.scaled ? "true" : "false", !eight || qc.mma ? "true" : "false", shape.name,
              static_cast<long>(n), static_cast<long>(k), static_cast<long>(m), w_bytes, sec * 1e6,
              gb_s, gb_s / copy_gb_s);
          std::fflush(stdout);
        }
      }
    }
    // Prefill-sized products (m = 2048, then 512) of the per-layer shapes: bf16 weights through
    // cuBLASLt against FP8 block-128 weights through the W8A8 path (--fp8-activations: the
    // activations quantized per token and 128 columns, then cuBLASLt's block-scaled FP8 GEMM or
    // Kestrel's wgmma kernel), each timed as LinearEngine::Run does it, f32 output.
    {
      auto fp8_engine_or = LinearEngine::Create(32 << 20, size_t{512} << 20);
      if (!fp8_engine_or.ok()) {
        std::fprintf(stderr, "%s\n", fp8_engine_or.status().message().c_str());
        return 1;
      }
      LinearEngine& fp8_engine = *fp8_engine_or.value();
      fp8_engine.set_fp8_activations(true);
      for (int si = 0; si < 8; ++si) {
        const int64_t m = si < 4 ? 2048 : 512;
        const int64_t n = shapes[si % 4].n, k = shapes[si % 4].k;
        DeviceBuffer wb = MustAllocate(static_cast<size_t>(n * k * 2), "bf16 weights");
        FillRandomBf16(wb, 500 + si % 4);
        DeviceBuffer codes = MustAllocate(static_cast<size_t>(n * k), "fp8 codes");
        FillRandomBytes(codes, 600 + si % 4, 0xF7);
        const size_t scale_floats = static_cast<size_t>((n + 127) / 128 * (k / 128));
        DeviceBuffer scales = MustAllocate(scale_floats * 4, "fp8 scales");
        FillConstantF32(scales, 0.01f);
        Weight w8;
        w8.n_segments = 1;
        w8.seg[0].format = WeightFormat::kFp8Block;
        w8.seg[0].rows = n;
        w8.seg[0].data = codes.get();
        w8.seg[0].scale = scales.as<float>();
        w8.seg[0].group = 128;
        w8.seg[0].scale_ld = static_cast<int32_t>(k / 128);
        DeviceBuffer x = MustAllocate(static_cast<size_t>(m * k * 2), "x");
        DeviceBuffer y = MustAllocate(static_cast<size_t>(m * n * 4), "y");
        FillRandomBf16(x, 8);
        const double bf16_s = MedianSeconds(reps, stream, copy_src, copy_dst, [&](int) {
          engine.RunCublasLt(x.as<__nv_bfloat16>(), m, k, wb.as<__nv_bfloat16>(), n, y.as<float>(),
                             stream);
        });
        // Both FP8 GEMMs: cuBLASLt's block-scaled one and Kestrel's wgmma kernel (H200 only)
        // in each cluster shape, the default (1 x 1) last.
        const double flop = 2.0 * m * n * k;
        fp8_engine.set_fp8_gemm(LinearEngine::Fp8Gemm::kCublasLt);
        const double lt_s = MedianSeconds(reps, stream, copy_src, copy_dst, [&](int) {
          fp8_engine.Run(x.as<__nv_bfloat16>(), m, k, w8, n, y.as<float>(), stream);
        });
        std::printf(
            "{\"prefill_gemm\": \"%s\", \"m\": %ld, \"n\": %ld, \"k\": %ld, "
            "\"bf16_us\": %.1f, \"bf16_tflops\": %.1f, \"fp8_cublaslt_us\": %.1f, "
            "\"fp8_cublaslt_tflops\": %.1f, \"fp8_cublaslt_speedup\": %.3f",
            shapes[si % 4].name, static_cast<long>(m), static_cast<long>(n), static_cast<long>(k),
            bf16_s * 1e6, flop / bf16_s / 1e12, lt_s * 1e6, flop / lt_s / 1e12, bf16_s / lt_s);
        fp8_engine.set_fp8_gemm(LinearEngine::Fp8Gemm::kWgmma);
        if (fp8_engine.fp8_gemm() == LinearEngine::Fp8Gemm::kWgmma) {
          for (const auto& [cm, cn] :
               {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 1}}) {
            SetFp8BlockGemmCluster(cm, cn);
            const double sec = MedianSeconds(reps, stream, copy_src, copy_dst, [&](int) {
              fp8_engine.Run(x.as<__nv_bfloat16>(), m, k, w8, n, y.as<float>(), stream);
            });
            std::printf(
                ", \"fp8_wgmma_%dx%d_us\": %.1f, \"fp8_wgmma_%dx%d_tflops\": %.1f, "
                "\"fp8_wgmma_%dx%d_speedup\": %.3f",
                cm, cn, sec * 1e6, cm, cn, flop / sec / 1e12, cm, cn, bf16_s / sec);
          }
        }
        std::printf("}\n");
        std::fflush(stdout);
        // cuBLASLt's other block-scaled candidates (--lt-candidates N: up to N in all).
        fp8_engine.set_fp8_gemm(LinearEngine::Fp8Gemm::kCublasLt);
        for (int c = 1; c < lt_candidates; ++c) {
          fp8_engine.set_fp8_cublaslt_candidate(c);
          if (!fp8_engine.RunFp8(x.as<__nv_bfloat16>(), m, k, w8.seg[0], n, y.as<float>(), n,
                                 stream)) {
            break;
          }
          const double sec = MedianSeconds(reps, stream, copy_src, copy_dst, [&](int) {
            fp8_engine.RunFp8(x.as<__nv_bfloat16>(), m, k, w8.seg[0], n, y.as<float>(), n, stream);
          });
          std::printf(
              "{\"prefill_gemm\": \"%s\", \"m\": %ld, \"fp8_cublaslt_candidate\": %d, "
              "\"algo\": \"%s\", \"us\": %.1f, \"tflops\": %.1f, "
              "\"speedup_vs_bf16\": %.3f}\n",
              shapes[si % 4].name, static_cast<long>(m), c,
              fp8_engine.Fp8CublasLtLastAlgo().c_str(), sec * 1e6, flop / sec / 1e12, bf16_s / sec);
          std::fflush(stdout);
        }
        fp8_engine.set_fp8_cublaslt_candidate(0);
      }
    }
  }
  if (quant_only) {
    KCUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
  }

  // Roofline 2: cuBLASLt 8192^3, bf16 inputs, f32 accumulation and output.
  double gemm_tflops = 0;
  {
    const int64_t s = 8192;
    DeviceBuffer a = MustAllocate(s * s * 2, "gemm a");
    DeviceBuffer b = MustAllocate(s * s * 2, "gemm b");
    DeviceBuffer c = MustAllocate(s * s * 4, "gemm c");
    FillRandomBf16(a, 11);
    FillRandomBf16(b, 12);
    const double sec = MedianSeconds(10, stream, copy_src, copy_dst, [&](int) {
      engine.RunCublasLt(a.as<__nv_bfloat16>(), s, s, b.as<__nv_bfloat16>(), s, c.as<float>(),
                         stream);
    });
    gemm_tflops = 2.0 * s * s * s / sec / 1e12;
    std::printf("{\"roofline\": \"gemm_peak\", \"m\": %ld, \"n\": %ld, \"k\": %ld, "
                "\"tflops\": %.1f}\n",
                static_cast<long>(s), static_cast<long>(s), static_cast<long>(s), gemm_tflops);
  }

  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  const int n_variants = SkinnyVariantCount();
  // us[shape][m index][variant], variant n_variants = cuBLASLt; < 0 where not timed.
  std::vector<std::vector<std::vector<double>>> us_table;

  for (const Shape& shape : shapes) {
    const int64_t n = shape.n, k = shape.k;
    const size_t w_bytes = static_cast<size_t>(n * k * 2);
    const int n_copies = WeightCopies(w_bytes, warm_l2);
    std::vector<DeviceBuffer> weights;
    for (int c = 0; c < n_copies; ++c) {
      weights.push_back(MustAllocate(w_bytes, "weights"));
      FillRandomBf16(weights.back(), 100 + c);
    }
    DeviceBuffer x = MustAllocate(static_cast<size_t>(max_m * k * 2), "x");  // [max_m, k]
    DeviceBuffer y = MustAllocate(static_cast<size_t>(max_m * n * 4), "y");  // [max_m, n]
    FillRandomBf16(x, 7);
    us_table.emplace_back();

    for (const int64_t m : ms) {
      const double bytes = static_cast<double>(n) * k * 2 + static_cast<double>(m) * k * 2 +
                           static_cast<double>(m) * n * 4;
      auto report = [&](const char* path, const char* name, bool is_default, double sec) {
        const double gb_s = bytes / sec / 1e9;
        const double tflops = 2.0 * m * n * k / sec / 1e12;
        std::printf(
            "{\"shape\": \"%s\", \"n\": %ld, \"k\": %ld, \"m\": %ld, \"path\": \"%s\", "
            "\"variant\": \"%s\", \"default\": %s, \"us\": %.2f, \"gb_s\": %.1f, "
            "\"frac_bw\": %.3f, \"tflops\": %.2f, \"frac_gemm_peak\": %.3f}\n",
            shape.name, static_cast<long>(n), static_cast<long>(k), static_cast<long>(m), path,
            name, is_default ? "true" : "false", sec * 1e6, gb_s, gb_s / copy_gb_s, tflops,
            tflops / gemm_tflops);
        std::fflush(stdout);
      };
      us_table.back().emplace_back(n_variants + 1, -1.0);
      for (int v = 0; v <= n_variants; ++v) {
        const bool lt = v == n_variants;
        if (!lt && m > SkinnyVariantMaxRows(v)) continue;
        const double sec = MedianSeconds(reps, stream, copy_src, copy_dst, [&](int r) {
          const auto* w = weights[r % n_copies].as<__nv_bfloat16>();
          if (lt) {
            engine.RunCublasLt(x.as<__nv_bfloat16>(), m, k, w, n, y.as<float>(), stream);
          } else {
            SkinnyLinearVariant(v, x.as<__nv_bfloat16>(), m, k, w, n, y.as<float>(), stream);
          }
        });
        us_table.back().back()[v] = sec * 1e6;
        report(lt ? "cublaslt" : "skinny", lt ? "cublaslt" : SkinnyVariantName(v),
               !lt && v == DefaultSkinnyVariant(), sec);
      }
      // cuBLASLt's other candidates (m > 1; candidate 0 is the "cublaslt" line above, its
      // configuration the "cublaslt_choice" line). The copies share their alignment, so copy
      // 0's pointers name every copy's candidates.
      for (int c = 0; m > 1 && c < lt_candidates; ++c) {
        const std::string desc = engine.CublasLtCandidateName(
            c, x.as<__nv_bfloat16>(), m, k, weights[0].as<__nv_bfloat16>(), n, y.as<float>());
        if (desc.empty()) break;
        if (c == 0) {
          std::printf("{\"shape\": \"%s\", \"m\": %ld, \"cublaslt_choice\": \"%s\"}\n",
                      shape.name, static_cast<long>(m), desc.c_str());
          continue;
        }
        const double sec = MedianSeconds(reps, stream, copy_src, copy_dst, [&](int r) {
          const auto* w = weights[r % n_copies].as<__nv_bfloat16>();
          engine.RunCublasLtCandidate(c, x.as<__nv_bfloat16>(), m, k, w, n, y.as<float>(), stream);
        });
        report("cublaslt_candidate", (std::to_string(c) + ": " + desc).c_str(), false, sec);
      }
    }
  }

  // Per variant: sum of us over a layer's shapes (all but the LM head) at m = 1 and m = 8 (when
  // both were timed), alone and with each shape taking the better of (variant, cuBLASLt).
  const auto m1 = std::find(ms.begin(), ms.end(), 1), m8 = std::find(ms.begin(), ms.end(), 8);
  const size_t n_layer_shapes = shapes.size() - 1;
  if (m1 != ms.end() && m8 != ms.end()) {
    const size_t m_idx[2] = {static_cast<size_t>(m1 - ms.begin()),
                             static_cast<size_t>(m8 - ms.begin())};
    for (int v = 0; v < n_variants; ++v) {
      double sum[2] = {0, 0}, best[2] = {0, 0};
      bool ok[2] = {true, true};
      for (int t = 0; t < 2; ++t) {
        for (size_t s = 0; s < n_layer_shapes; ++s) {
          const double vu = us_table[s][m_idx[t]][v];
          const double lu = us_table[s][m_idx[t]][n_variants];
          if (vu < 0) {
            ok[t] = false;
            continue;
          }
          sum[t] += vu;
          best[t] += std::min(vu, lu);
        }
      }
      std::printf("{\"summary\": \"layer_sum\", \"variant\": \"%s\", \"us_m1\": %.2f, "
                  "\"us_m8\": %.2f, \"best_of_with_cublaslt_us_m1\": %.2f, "
                  "\"best_of_with_cublaslt_us_m8\": %.2f, \"complete\": %s}\n",
                  SkinnyVariantName(v), sum[0], sum[1], best[0], best[1],
                  ok[0] && ok[1] ? "true" : "false");
    }
    double lt[2] = {0, 0};
    for (int t = 0; t < 2; ++t) {
      for (size_t s = 0; s < n_layer_shapes; ++s) lt[t] += us_table[s][m_idx[t]][n_variants];
    }
    std::printf("{\"summary\": \"layer_sum\", \"variant\": \"cublaslt\", \"us_m1\": %.2f, "
                "\"us_m8\": %.2f}\n",
                lt[0], lt[1]);
  }
  KCUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace kestrel::cuda

int main(int argc, char** argv) { return kestrel::cuda::Main(argc, argv); }

#else  // !KESTREL_HAS_CUDA

int main() {
  std::printf("{\"skipped\": \"no CUDA build\"}\n");
  return 0;
}

#endif  // KESTREL_HAS_CUDA
