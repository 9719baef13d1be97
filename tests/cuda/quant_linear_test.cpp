// Quantized linear layers on the GPU against the CPU definitions of each format.
//
// Weights are built on the host in the checkpoints' own layouts (FP8 block-128 with
// weight_scale_inv, MLX affine 4/8-bit, GGUF Q8_0 / Q4_K / Q6_K), placed through CudaWeightPlan
// (the loader's conversion into the device formats), uploaded, and run through
// LinearEngine::Run. The reference is float64 dot products of the bf16 inputs with
// quant::DequantizeMatrixRow, the CPU backend's dequantization, so a conversion or kernel that
// misreads a code, a scale or a group fails. Both device paths are covered: QuantGemv (m <= 8,
// f32 arithmetic on the exact weights) and the bf16 tiles + cuBLASLt (larger m, weights rounded
// to bf16 once, several tiles per segment).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/fp8_gemm.h"
#include "backends/cuda/linear.h"
#include "backends/cuda/quant_linear.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "cuda_test_util.h"
#include "models/cuda_weight_plan.h"

namespace kestrel {
namespace {

namespace kt = ::kestrel::cuda::testing;

// A host tensor in a checkpoint layout and the buffers its view points at.
struct HostWeight {
  std::vector<uint8_t> data;
  std::vector<float> scale, bias;
  std::vector<int32_t> perm;  // GPTQ act-order column order, or empty
  TensorView view;
};

uint16_t F16Bits(float f) { return F32ToF16(f); }

HostWeight MakeWeight(DType dtype, int64_t rows, int64_t k, int group, uint64_t seed,
                      float mlx_scale_mult = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> pos(0.002f, 0.02f), sym(-0.05f, 0.05f);
  HostWeight w;
  w.view.dtype = dtype;
  w.view.n_dims = 2;
  w.view.shape[0] = rows;
  w.view.shape[1] = k;
  const int64_t row_bytes = DTypeRowBytes(dtype, k);
  w.data.resize(static_cast<size_t>(rows * row_bytes));
  for (uint8_t& b : w.data) b = static_cast<uint8_t>(byte(rng));
  auto put_f16 = [&](uint8_t* p, float v) {
    const uint16_t h = F16Bits(v);
    std::memcpy(p, &h, 2);
  };
  switch (dtype) {
    case DType::kQ8_0:
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < k / 32; ++b) put_f16(&w.data[r * row_bytes + b * 34], pos(rng));
      }
      break;
    case DType::kQ4_K:
    case DType::kQ5_K:
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < k / 256; ++b) {
          uint8_t* blk = &w.data[r * row_bytes + b * (dtype == DType::kQ4_K ? 144 : 176)];
          put_f16(blk, pos(rng) / 8);
          put_f16(blk + 2, pos(rng) / 8);
        }
      }
      break;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const quant::LegacyBlock l = quant::LegacyLayout(dtype);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < k / 32; ++b) {
          uint8_t* blk = &w.data[r * row_bytes + b * l.bytes];
          put_f16(blk, pos(rng) / 4);
          if (l.has_min) put_f16(blk + 2, sym(rng));
        }
      }
      break;
    }
    case DType::kQ6_K:
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < k / 256; ++b) put_f16(&w.data[r * row_bytes + b * 210 + 208], pos(rng) / 64);
      }
      break;
    case DType::kQ2_K:
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < k / 256; ++b) {
          put_f16(&w.data[r * row_bytes + b * 84 + 80], pos(rng) / 8);
          put_f16(&w.data[r * row_bytes + b * 84 + 82], pos(rng) / 8);
        }
      }
      break;
    case DType::kQ3_K:
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < k / 256; ++b)
          put_f16(&w.data[r * row_bytes + b * 110 + 108], pos(rng) / 32);
      }
      break;
    case DType::kIQ4_NL:
    case DType::kIQ4_XS: {
      const bool nl = dtype == DType::kIQ4_NL;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < k / (nl ? 32 : 256); ++b) {
          put_f16(&w.data[r * row_bytes + b * (nl ? 18 : 136)], pos(rng) / (nl ? 64 : 1024));
        }
      }
      break;
    }
    case DType::kF8E4M3: {
      for (uint8_t& b : w.data) {
        if ((b & 0x7F) == 0x7F) b &= 0xFE;  // no NaN codes
      }
      const int64_t rb = (rows + 127) / 128, kb = (k + 127) / 128;
      for (int64_t i = 0; i < rb * kb; ++i) w.scale.push_back(pos(rng) / 16);
      w.view.block_scale = w.scale.data();
      w.view.block_rows = 128;
      w.view.block_cols = 128;
      break;
    }
    case DType::kMlxQ4:
    case DType::kMlxQ8:
      for (int64_t i = 0; i < rows * (k / group); ++i) {
        w.scale.push_back(pos(rng) / 4 * mlx_scale_mult);
        w.bias.push_back(sym(rng));
      }
      w.view.block_scale = w.scale.data();
      w.view.group_bias = w.bias.data();
      w.view.block_rows = 1;
      w.view.block_cols = group;
      break;
    case DType::kBF16: {
      auto* h = reinterpret_cast<uint16_t*>(w.data.data());
      for (int64_t i = 0; i < rows * k; ++i) h[i] = F32ToBf16(sym(rng));
      break;
    }
    default: KCHECK(false);
  }
  w.view.data = w.data.data();
  return w;
}

// The plan uploaded as the runner does: a device copy of every piece, then the 4-bit codes
// rearranged on the device.
struct Uploaded {
  cuda::DeviceBuffer buf;
  cuda::Weight weight;
};

Uploaded Upload(const CudaWeightPlan& plan, const CudaWeightPlan::Linear& lin) {
  Uploaded u;
  auto b = cuda::DeviceBuffer::Allocate(plan.total_bytes(), "test weights");
  KCHECK(b.ok());
  u.buf = std::move(b).value();
  for (const CudaWeightPlan::Piece& p : plan.pieces()) {
    KCUDA_CHECK(cudaMemcpy(u.buf.as<uint8_t>() + p.offset, p.data, p.bytes, cudaMemcpyHostToDevice));
  }
  plan.ArrangeOnDevice(u.buf.as<uint8_t>(), nullptr);
  KCUDA_CHECK(cudaDeviceSynchronize());
  u.weight = CudaWeightPlan::Bind(lin, u.buf.as<uint8_t>());
  return u;
}

// y_ref[i, j] = x[i, :] . W[j, :] in double over the parts' rows, W from the CPU dequantization.
std::vector<double> Reference(const std::vector<const TensorView*>& parts,
                              const std::vector<float>& x, int64_t m, int64_t k) {
  int64_t n = 0;
  for (const TensorView* t : parts) n += t->shape[0];
  std::vector<double> y(static_cast<size_t>(m * n));
  std::vector<float> row(static_cast<size_t>(k));
  int64_t j = 0;
  for (const TensorView* t : parts) {
    for (int64_t r = 0; r < t->shape[0]; ++r, ++j) {
      quant::DequantizeMatrixRow(*t, r, row.data());
      for (int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (int64_t c = 0; c < k; ++c) acc += static_cast<double>(row[c]) * x[i * k + c];
        y[i * n + j] = acc;
      }
    }
  }
  return y;
}

double RelError(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

struct Case {
  std::string name;
  std::vector<std::pair<DType, int64_t>> parts;  // (dtype, rows)
  int group;                                    // MLX group size
  int64_t k;
  std::string formats;  // CudaWeightPlan::formats() expected
  int segments;
  // Per part: 0, or the seed of a GPTQ act-order column order (kMlxQ4 parts, input_perm).
  std::vector<uint64_t> perm_seeds = {};
  // MLX scales times this (1: 0.0005-0.005; 16 puts some at or above 2^-5, where the 4-bit pairs
  // stay unscaled), and whether the 4-bit segments must be scaled_codes (1), not (0), or either.
  float mlx_scale_mult = 1.0f;
  int expect_scaled = -1;
};

void RunCase(const Case& c) {
  SCOPED_TRACE(c.name);
  std::vector<HostWeight> host;
  host.reserve(c.parts.size());
  std::vector<const TensorView*> views;
  int64_t n = 0, n_quantized = 0;  // bf16 parts come last in a case
  bool four_bit = false;
  uint64_t seed = 7;
  for (size_t i = 0; i < c.parts.size(); ++i) {
    const auto& [dtype, rows] = c.parts[i];
    host.push_back(MakeWeight(dtype, rows, c.k, c.group, seed++, c.mlx_scale_mult));
    if (i < c.perm_seeds.size() && c.perm_seeds[i] != 0) {
      HostWeight& h = host.back();
      h.perm.resize(static_cast<size_t>(c.k));
      std::iota(h.perm.begin(), h.perm.end(), 0);
      std::shuffle(h.perm.begin(), h.perm.end(), std::mt19937_64(c.perm_seeds[i]));
      h.view.input_perm = h.perm.data();
    }
    n += rows;
    if (dtype != DType::kBF16 && c.formats != "bf16") n_quantized += rows;
    four_bit |= dtype == DType::kQ4_K || dtype == DType::kMlxQ4 || dtype == DType::kQ4_0 ||
                dtype == DType::kQ4_1;
  }
  for (const HostWeight& h : host) views.push_back(&h.view);
  CudaWeightPlan plan;
  const CudaWeightPlan::Linear lin = plan.PlaceLinear(views);
  EXPECT_EQ(plan.formats(), c.formats);
  EXPECT_EQ(static_cast<int>(lin.size()), c.segments);
  for (const CudaWeightPlan::Segment& seg : lin) {
    if (seg.format == cuda::WeightFormat::kAffine4 && c.expect_scaled >= 0) {
      EXPECT_EQ(seg.scaled_codes, c.expect_scaled == 1);
    }
  }
  Uploaded dev = Upload(plan, lin);

  // A 256 KiB tile buffer: the dequantizing path takes several 128-row tiles per segment.
  auto engine = cuda::LinearEngine::Create(32 << 20, 256 << 10);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  const int64_t max_m = 37;
  std::vector<uint16_t> xb = kt::RandomBf16(static_cast<size_t>(max_m * c.k), 99);
  const std::vector<float> xf = kt::Bf16ToF32(xb);
  cuda::DeviceBuffer x = kt::Upload(xb);
  const std::vector<double> ref = Reference(views, xf, max_m, c.k);

  std::vector<float> one_row;  // m = 1 result, for batch invariance
  for (int64_t m : {1, 2, 3, 8, 9, 37}) {
    SCOPED_TRACE("m=" + std::to_string(m));
    cuda::DeviceBuffer y = kt::Poisoned<float>(static_cast<size_t>(m * n));
    (*engine)->Run(x.as<__nv_bfloat16>(), m, c.k, dev.weight, n, y.as<float>(), nullptr);
    const std::vector<float> out = kt::Download<float>(y, static_cast<size_t>(m * n));
    const std::vector<double> r(ref.begin(), ref.begin() + m * n);
    // QuantGemv: f32 sums of the exact weights, except 4-bit codes (the tensor-core kernel's
    // fragments, like the tiles, hold the weights rounded to bf16, 2^-9).
    const double tol = m <= cuda::kQuantGemvMaxRows && !four_bit ? 2e-5 : 4e-3;
    EXPECT_LT(RelError(out, r), tol);
    if (m == 1) one_row = out;
    if (m <= cuda::kQuantGemvMaxRows) {
      // Batch invariance of the quantized segments (a bf16 one switches from the skinny kernel
      // to cuBLASLt past one row, linear.h).
      for (int64_t j = 0; j < n_quantized; ++j) {
        ASSERT_EQ(out[j], one_row[j]) << "row 0 of an m-row call differs from the 1-row call";
      }
      // Deterministic: a second run gives the same bits.
      cuda::DeviceBuffer y2 = kt::Poisoned<float>(static_cast<size_t>(m * n));
      (*engine)->Run(x.as<__nv_bfloat16>(), m, c.k, dev.weight, n, y2.as<float>(), nullptr);
      const std::vector<float> out2 = kt::Download<float>(y2, static_cast<size_t>(m * n));
      EXPECT_EQ(0, std::memcmp(out.data(), out2.data(), out.size() * 4));
    }
  }
}

TEST(CudaQuantLinear, Fp8BlockScales) {
  KESTREL_REQUIRE_CUDA();
  RunCase({"fp8 300 rows", {{DType::kF8E4M3, 300}}, 0, 640, "fp8-block128", 1});
  // Parts on whole 128-row blocks share one segment; after a ragged part a new one starts.
  RunCase({"fp8 q|k|v", {{DType::kF8E4M3, 256}, {DType::kF8E4M3, 128}, {DType::kF8E4M3, 128}},
           0, 512, "fp8-block128", 1});
  RunCase({"fp8 ragged", {{DType::kF8E4M3, 200}, {DType::kF8E4M3, 100}}, 0, 512,
           "fp8-block128", 2});
}

TEST(CudaQuantLinear, MlxAffine) {
  KESTREL_REQUIRE_CUDA();
  for (int g : {32, 64, 128}) {
    RunCase({"mlx4 g" + std::to_string(g), {{DType::kMlxQ4, 200}}, g, 512, "int4-affine", 1, {},
             1.0f, 1});
    // Scales up to 0.08: the pairs stay (s, b) and the kernels take the unscaled form.
    RunCase({"mlx4 large scales g" + std::to_string(g), {{DType::kMlxQ4, 200}}, g, 512,
             "int4-affine", 1, {}, 16.0f, 0});
    RunCase({"mlx8 g" + std::to_string(g), {{DType::kMlxQ8, 200}}, g, 512, "int8-affine", 1});
  }
  RunCase({"mlx8 g16", {{DType::kMlxQ8, 70}}, 16, 256, "int8-affine", 1});
}

// GPTQ act-order: 4-bit parts whose stored columns are the inputs in a permuted order. One
// shared order keeps the codes (x gathered for the GEMV, tile columns scattered for larger m);
// parts in different orders, or beside a part without one, become one bf16 weight in the inputs'
// order. The reference dequantizes rows in the inputs' order (DequantizeMatrixRow).
TEST(CudaQuantLinear, GptqActOrder) {
  KESTREL_REQUIRE_CUDA();
  RunCase({"act-order q|k|v g128", {{DType::kMlxQ4, 256}, {DType::kMlxQ4, 64}, {DType::kMlxQ4, 64}},
           128, 512, "int4-affine", 1, {5, 5, 5}});
  RunCase({"act-order g32", {{DType::kMlxQ4, 200}}, 32, 768, "int4-affine", 1, {9}});
  RunCase({"act-order g32, large scales", {{DType::kMlxQ4, 200}}, 32, 768, "int4-affine", 1, {9},
           16.0f, 0});
  RunCase({"act-order, two orders", {{DType::kMlxQ4, 128}, {DType::kMlxQ4, 64}}, 64, 512, "bf16",
           1, {5, 6}});
  RunCase({"act-order beside a plain part", {{DType::kMlxQ4, 128}, {DType::kMlxQ4, 64}}, 64, 512,
           "bf16", 1, {5, 0}});
}

// `w` placed by a plan that `configure` set up, then run through LinearEngine::Run at each m of
// `ms` (x holds enough rows of k): the outputs in order, the plan's one segment and its bytes.
struct Placed {
  std::vector<std::vector<float>> outs;
  CudaWeightPlan::Segment segment;
  size_t bytes = 0;
};
Placed RunPlaced(const TensorView& w, int64_t k, int64_t n, const cuda::DeviceBuffer& x,
                 cuda::LinearEngine& engine, std::initializer_list<int64_t> ms,
                 const std::function<void(CudaWeightPlan*)>& configure) {
  Placed p;
  CudaWeightPlan plan;
  configure(&plan);
  const CudaWeightPlan::Linear lin = plan.PlaceLinear({&w});
  EXPECT_EQ(lin.size(), 1u);
  if (lin.size() != 1) return p;
  p.segment = lin[0];
  p.bytes = plan.total_bytes();
  Uploaded dev = Upload(plan, lin);
  for (int64_t m : ms) {
    cuda::DeviceBuffer y = kt::Poisoned<float>(static_cast<size_t>(m * n));
    engine.Run(x.as<__nv_bfloat16>(), m, k, dev.weight, n, y.as<float>(), nullptr);
    p.outs.push_back(kt::Download<float>(y, static_cast<size_t>(m * n)));
  }
  return p;
}

// Two placements' outputs, call by call: finite and the same bits.
void ExpectSameBits(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("call " + std::to_string(i));
    for (float v : a[i]) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4));
  }
}

// 4-bit pairs placed scaled (s * 2^133: the codes read as bf16 subnormals) and unscaled are the
// same weights: every path (the GEMV at 1-8 rows, the tiles past 8, act-order gathers and
// scatters) gives the same bits. Fails if bf16 arithmetic flushed the subnormal codes or a
// kernel read a scaled pair as an unscaled one.
TEST(CudaQuantLinear, ScaledCodesGiveTheSameBits) {
  KESTREL_REQUIRE_CUDA();
  const int64_t k = 768;
  struct Part {
    DType dtype;
    int64_t rows;
    int group;
    uint64_t perm_seed;
  };
  for (const Part& part : {Part{DType::kMlxQ4, 300, 64, 0}, Part{DType::kMlxQ4, 200, 128, 0},
                           Part{DType::kQ4_0, 150, 0, 0}, Part{DType::kMlxQ4, 200, 32, 9}}) {
    SCOPED_TRACE(std::string(DTypeName(part.dtype)) + " g" + std::to_string(part.group) +
                 (part.perm_seed != 0 ? " act-order" : ""));
    HostWeight h = MakeWeight(part.dtype, part.rows, k, part.group, 3);
    if (part.perm_seed != 0) {
      h.perm.resize(static_cast<size_t>(k));
      std::iota(h.perm.begin(), h.perm.end(), 0);
      std::shuffle(h.perm.begin(), h.perm.end(), std::mt19937_64(part.perm_seed));
      h.view.input_perm = h.perm.data();
    }
    auto engine = cuda::LinearEngine::Create(32 << 20, 256 << 10);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    const int64_t max_m = 37, n = part.rows;
    cuda::DeviceBuffer x = kt::Upload(kt::RandomBf16(static_cast<size_t>(max_m * k), 5));
    Placed placed[2];
    for (int scaled = 0; scaled < 2; ++scaled) {
      placed[scaled] =
          RunPlaced(h.view, k, n, x, **engine, {1, 3, 8, 9, 37},
                    [&](CudaWeightPlan* p) { p->set_scaled_affine4_codes(scaled == 1); });
      ASSERT_EQ(placed[scaled].segment.format, cuda::WeightFormat::kAffine4);
      ASSERT_EQ(placed[scaled].segment.scaled_codes, scaled == 1);
    }
    ExpectSameBits(placed[0].outs, placed[1].outs);
  }
}

// The symmetric 8-bit formats placed with their bias arrays and with the bias from the scale
// (quant_linear.h, bias_from_scale): the same bits from the GEMV (1, 3, 8 rows) and the tiles
// (9, 37 rows), with the bias bytes gone.
TEST(CudaQuantLinear, BiasFromScaleGivesTheSameBits) {
  KESTREL_REQUIRE_CUDA();
  const int64_t k = 512;
  for (DType dtype : {DType::kQ8_0, DType::kQ6_K, DType::kQ3_K, DType::kQ5_0, DType::kIQ4_XS}) {
    SCOPED_TRACE(DTypeName(dtype));
    HostWeight h = MakeWeight(dtype, 200, k, 0, 7);
    auto engine = cuda::LinearEngine::Create(32 << 20, 256 << 10);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    const int64_t max_m = 37, n = 200;
    cuda::DeviceBuffer x = kt::Upload(kt::RandomBf16(static_cast<size_t>(max_m * k), 5));
    Placed placed[2];
    for (int from_scale = 0; from_scale < 2; ++from_scale) {
      placed[from_scale] =
          RunPlaced(h.view, k, n, x, **engine, {1, 3, 8, 9, 37},
                    [&](CudaWeightPlan* p) { p->set_affine8_bias_from_scale(from_scale == 1); });
      ASSERT_EQ(placed[from_scale].segment.format, cuda::WeightFormat::kAffine8);
      ASSERT_EQ(placed[from_scale].segment.bias_from_scale, from_scale == 1);
    }
    EXPECT_LT(placed[1].bytes, placed[0].bytes);
    ExpectSameBits(placed[0].outs, placed[1].outs);
  }
}

// The 8-bit tensor-core GEMV (codes in mma order) against the CUDA-core one on the same weights:
// both within f32 rounding of the float64 reference at 1, 2, 3 and 8 rows (the tensor-core form
// sums each 16-k vector's exact products then applies the group's scale and bias, the CUDA-core
// form multiplies weight by weight), and the tiles (9, 37 rows), whose dequantization reads the
// arranged codes back in order, bitwise equal. Groups 16 (with a bias array: Q2_K; from the
// scale: Q6_K), 32 (Q8_0, Q5_K) and MLX 64 / 128.
TEST(CudaQuantLinear, Affine8MmaAgreesWithTheCudaCoreForm) {
  KESTREL_REQUIRE_CUDA();
  const int64_t k = 768;
  struct Part {
    DType dtype;
    int group;
  };
  for (const Part& part :
       {Part{DType::kQ2_K, 0}, Part{DType::kQ6_K, 0}, Part{DType::kQ8_0, 0}, Part{DType::kQ5_K, 0},
        Part{DType::kMlxQ8, 64}, Part{DType::kMlxQ8, 128}}) {
    SCOPED_TRACE(std::string(DTypeName(part.dtype)) + " g" + std::to_string(part.group));
    HostWeight h = MakeWeight(part.dtype, 300, k, part.group, 13);
    auto engine = cuda::LinearEngine::Create(32 << 20, 256 << 10);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    const int64_t max_m = 37, n = 300;
    const std::vector<uint16_t> xb = kt::RandomBf16(static_cast<size_t>(max_m * k), 5);
    const std::vector<double> ref = Reference({&h.view}, kt::Bf16ToF32(xb), max_m, k);
    cuda::DeviceBuffer x = kt::Upload(xb);
    const std::initializer_list<int64_t> ms = {1, 2, 3, 8, 9, 37};
    std::vector<std::vector<float>> outs[2];
    for (int mma = 0; mma < 2; ++mma) {
      const Placed placed = RunPlaced(h.view, k, n, x, **engine, ms,
                                      [&](CudaWeightPlan* p) { p->set_affine8_mma(mma == 1); });
      ASSERT_EQ(placed.segment.format, cuda::WeightFormat::kAffine8);
      ASSERT_EQ(placed.segment.mma_order, mma == 1);
      ASSERT_EQ(placed.outs.size(), ms.size());
      outs[mma] = placed.outs;
      size_t i = 0;
      for (int64_t m : ms) {
        if (m <= cuda::kQuantGemvMaxRows) {
          const std::vector<double> r(ref.begin(), ref.begin() + m * n);
          EXPECT_LT(RelError(outs[mma][i], r), 1e-5) << (mma ? "mma" : "cuda cores") << " m=" << m;
        }
        ++i;
      }
    }
    // Tiles: the same bf16 weights, the same cuBLASLt product.
    for (size_t i = 4; i < outs[0].size(); ++i) {
      EXPECT_EQ(0, std::memcmp(outs[0][i].data(), outs[1][i].data(), outs[0][i].size() * 4))
          << "tiles, call " << i;
    }
  }
}

TEST(CudaQuantLinear, GgufBlocks) {
  KESTREL_REQUIRE_CUDA();
  RunCase({"q8_0", {{DType::kQ8_0, 150}}, 0, 512, "int8-affine", 1});
  RunCase({"q4_k", {{DType::kQ4_K, 150}}, 0, 512, "int4-affine", 1});
  RunCase({"q6_k", {{DType::kQ6_K, 150}}, 0, 512, "int8-affine", 1});
  RunCase({"q5_k", {{DType::kQ5_K, 150}}, 0, 512, "int8-affine", 1});
  RunCase({"q4_0", {{DType::kQ4_0, 150}}, 0, 512, "int4-affine", 1});
  RunCase({"q4_1", {{DType::kQ4_1, 150}}, 0, 512, "int4-affine", 1});
  RunCase({"q5_0", {{DType::kQ5_0, 150}}, 0, 512, "int8-affine", 1});
  RunCase({"q5_1", {{DType::kQ5_1, 150}}, 0, 512, "int8-affine", 1});
  RunCase({"q2_k", {{DType::kQ2_K, 150}}, 0, 512, "int8-affine", 1});
  RunCase({"q3_k", {{DType::kQ3_K, 150}}, 0, 512, "int8-affine", 1});
  RunCase({"iq4_nl", {{DType::kIQ4_NL, 150}}, 0, 512, "int8-affine", 1});
  RunCase({"iq4_xs", {{DType::kIQ4_XS, 150}}, 0, 512, "int8-affine", 1});
  // A Q5_K_M-style q|k|v (v in Q6_K): 8-bit codes of groups 32 and 16, two segments.
  RunCase({"q5_k|q5_k|q6_k", {{DType::kQ5_K, 256}, {DType::kQ5_K, 64}, {DType::kQ6_K, 64}}, 0, 512,
           "int8-affine", 2});
}

// On the host (no GPU needed): the weights the device formats describe are the CPU
// dequantization for every GGUF block type: 8-bit, (1 + q / 256) * scale + bias within f32
// rounding (the bias from the scale by one f32 multiply for the symmetric formats); 4-bit (Q4_K), q
// * s + b with s and b the nearest bf16 values of the block's d * sc and -dmin * m, so within their
// bf16 rounding (2^-9 relative each). A misread code, scale, min or fifth bit is off by whole
// steps.
TEST(CudaWeightPlanOnTheHost, GgufBlocksBecomeTheCpuWeights) {
  const int64_t rows = 24, k = 512;
  for (DType dtype :
       {DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ4_0, DType::kQ4_1,
        DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
    SCOPED_TRACE(DTypeName(dtype));
    const HostWeight w = MakeWeight(dtype, rows, k, 0, 31);
    CudaWeightPlan plan;
    const CudaWeightPlan::Linear lin = plan.PlaceLinear({&w.view});
    ASSERT_EQ(lin.size(), 1u);
    const CudaWeightPlan::Segment& seg = lin[0];
    const bool four = seg.format == cuda::WeightFormat::kAffine4;
    ASSERT_TRUE(four || seg.format == cuda::WeightFormat::kAffine8);
    auto host = [&](size_t offset) -> const uint8_t* {
      for (const CudaWeightPlan::Piece& p : plan.pieces()) {
        if (p.offset == offset) return static_cast<const uint8_t*>(p.data);
      }
      return nullptr;
    };
    const uint8_t* codes = host(seg.data);
    const auto* scale = reinterpret_cast<const float*>(host(seg.scale));
    const auto* bias = reinterpret_cast<const float*>(host(seg.bias));
    const auto* pairs = reinterpret_cast<const uint32_t*>(host(seg.scale_bias));
    ASSERT_TRUE(codes != nullptr);
    ASSERT_TRUE(four ? pairs != nullptr && scale == nullptr
                     : scale != nullptr && (bias != nullptr) != seg.bias_from_scale &&
                           pairs == nullptr);
    // Symmetric codes keep no bias array (bias = ratio * scale); independent minimums do.
    const bool symmetric = dtype == DType::kQ8_0 || dtype == DType::kQ6_K ||
                           dtype == DType::kQ3_K || dtype == DType::kQ5_0 ||
                           dtype == DType::kIQ4_NL || dtype == DType::kIQ4_XS;
    if (!four) {
      EXPECT_EQ(seg.bias_from_scale, symmetric);
    }
    std::vector<float> ref(static_cast<size_t>(k));
    double worst = 0, max_ref = 0;
    int beyond_bf16 = 0;
    for (int64_t r = 0; r < rows; ++r) {
      quant::DequantizeMatrixRow(w.view, r, ref.data());
      for (int64_t j = 0; j < k; ++j) {
        const int64_t g = r * (k / seg.group) + j / seg.group;
        const double want = ref[static_cast<size_t>(j)];
        max_ref = std::max(max_ref, std::fabs(want));
        if (four) {
          const int q = (codes[r * k / 2 + j / 2] >> (4 * (j % 2))) & 0xF;
          const double s = std::ldexp(Bf16ToF32(static_cast<uint16_t>(pairs[g] & 0xFFFFu)),
                                      seg.scaled_codes ? -133 : 0);
          const double b = Bf16ToF32(static_cast<uint16_t>(pairs[g] >> 16));
          const double v = q * s + b;
          if (std::fabs(v - want) > 0x1p-8 * (q * std::fabs(s) + std::fabs(b))) ++beyond_bf16;
          worst = std::max(worst, std::fabs(v - want));
        } else {
          const float b = seg.bias_from_scale ? seg.bias_ratio * scale[g] : bias[g];
          const double v = (1.0 + codes[r * k + j] / 256.0) * scale[g] + b;
          worst = std::max(worst, std::fabs(v - want));
        }
      }
    }
    EXPECT_EQ(beyond_bf16, 0) << "max |affine - cpu| " << worst << " of max " << max_ref;
    if (!four) {
      EXPECT_LT(worst, 1e-5 * max_ref) << "max |affine - cpu| " << worst << " of max " << max_ref;
    }
  }
}

TEST(CudaQuantLinear, MixedFormatsInOneFusedWeight) {
  KESTREL_REQUIRE_CUDA();
  // A Q4_K_M-style q|k|v (v in Q6_K) and a part left in bf16.
  RunCase({"q4_k|q4_k|q6_k|bf16",
           {{DType::kQ4_K, 256}, {DType::kQ4_K, 64}, {DType::kQ6_K, 64}, {DType::kBF16, 40}},
           0, 512, "bf16+int4-affine+int8-affine", 3});
}

// e4m3fn code of v (|v| <= 448 after scaling, saturating beyond): nearest, ties to the even code.
uint8_t ToE4M3(float v) {
  uint8_t best = 0;
  float best_err = INFINITY;
  for (int c = 0; c < 0x7F; ++c) {  // non-negative finite codes, increasing
    const float err = std::fabs(std::fabs(v) - F8E4M3ToF32(static_cast<uint8_t>(c)));
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (v < 0 ? 0x80 : 0));
}

// W8A8: activations quantized per (row, 128 columns) exactly as the host emulation does, then the
// FP8 tensor cores with both block scales, through Kestrel's wgmma kernel (where the device has
// it) and cuBLASLt's; against the emulation (same products, f32 sums) and, for information,
// against the exact float32 reference. Shapes with partial tiles in m and n, several chunks of
// rows (a small buffer), more tiles than SMs (the persistent loop), every cluster shape.
struct Fp8GemmCase {
  int64_t n, k;
  std::vector<int64_t> ms;
  size_t buffer_bytes;
};

TEST(CudaQuantLinear, Fp8ActivationsOnTheTensorCores) {
  KESTREL_REQUIRE_CUDA();
  const Fp8GemmCase cases[] = {{384, 512, {37, 300}, size_t{128} << 10},
                               {200, 384, {9, 129}, size_t{1} << 20},
                               {1024, 256, {2100}, size_t{8} << 20}};
  std::vector<cuda::LinearEngine::Fp8Gemm> kernels = {cuda::LinearEngine::Fp8Gemm::kCublasLt};
  if (cuda::Fp8BlockGemmAvailable()) {
    kernels.push_back(cuda::LinearEngine::Fp8Gemm::kWgmma);
  } else {
    std::printf("[ info     ] no sm_90a FP8 GEMM here: cuBLASLt only\n");
  }
  for (const Fp8GemmCase& c : cases) {
    const int64_t n = c.n, k = c.k;
    HostWeight w = MakeWeight(DType::kF8E4M3, n, k, 0, 5);
    CudaWeightPlan plan;
    const CudaWeightPlan::Linear lin = plan.PlaceLinear({&w.view});
    Uploaded dev = Upload(plan, lin);
    auto engine = cuda::LinearEngine::Create(32 << 20, c.buffer_bytes);
    ASSERT_TRUE(engine.ok());
    (*engine)->set_fp8_activations(true);
    for (int64_t m : c.ms) {
      std::vector<uint16_t> xb = kt::RandomBf16(static_cast<size_t>(m * k), 3);
      const std::vector<float> xf = kt::Bf16ToF32(xb);
      // The host emulation of QuantizeActivationsFp8.
      std::vector<float> xe(xf.size());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t g = 0; g < k / 128; ++g) {
          float amax = 0;
          for (int64_t e = 0; e < 128; ++e) {
            amax = std::max(amax, std::fabs(xf[i * k + g * 128 + e]));
          }
          const float scale = amax > 0 ? amax / 448.0f : 1.0f;
          for (int64_t e = 0; e < 128; ++e) {
            const int64_t at = i * k + g * 128 + e;
            xe[at] = F8E4M3ToF32(ToE4M3(xf[at] / scale)) * scale;
          }
        }
      }
      const std::vector<double> emulated = Reference({&w.view}, xe, m, k);
      const std::vector<double> exact = Reference({&w.view}, xf, m, k);
      cuda::DeviceBuffer x = kt::Upload(xb);
      for (const cuda::LinearEngine::Fp8Gemm kernel : kernels) {
        const bool own = kernel == cuda::LinearEngine::Fp8Gemm::kWgmma;
        SCOPED_TRACE(std::string(own ? "wgmma" : "cublaslt") + " n=" + std::to_string(n) +
                     " k=" + std::to_string(k) + " m=" + std::to_string(m));
        (*engine)->set_fp8_gemm(kernel);
        ASSERT_EQ(kernel, (*engine)->fp8_gemm());
        cuda::DeviceBuffer y = kt::Poisoned<float>(static_cast<size_t>(m * n));
        ASSERT_TRUE((*engine)->RunFp8(x.as<__nv_bfloat16>(), m, k, dev.weight.seg[0], n,
                                      y.as<float>(), n, nullptr))
            << "no block-scaled FP8 GEMM for this shape";
        const std::vector<float> out = kt::Download<float>(y, static_cast<size_t>(m * n));
        // The same products; what is left is the order of the f32 sums and, when cuBLASLt
        // writes bf16 (some shapes), that rounding.
        EXPECT_LT(RelError(out, emulated), own ? 1e-3 : 4e-3);
        const double err = RelError(out, exact);
        std::printf(
            "[ info     ] W8A8 %s n=%lld k=%lld m=%lld: relative error against the "
            "emulation %.2e, the exact product %.4f\n",
            own ? "wgmma" : "cublaslt", static_cast<long long>(n), static_cast<long long>(k),
            static_cast<long long>(m), RelError(out, emulated), err);
        EXPECT_LT(err, 0.1);
        // Through Run (the path a model takes) the same bits, and run to run the same bits.
        cuda::DeviceBuffer y2 = kt::Poisoned<float>(static_cast<size_t>(m * n));
        (*engine)->Run(x.as<__nv_bfloat16>(), m, k, dev.weight, n, y2.as<float>(), nullptr);
        const std::vector<float> out2 = kt::Download<float>(y2, static_cast<size_t>(m * n));
        EXPECT_EQ(0, std::memcmp(out.data(), out2.data(), out.size() * 4));
        if (!own) continue;
        // Every cluster shape (the blocks sharing their tiles by multicast): the same bits.
        for (const auto& [cm, cn] : {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
          SCOPED_TRACE("cluster " + std::to_string(cm) + "x" + std::to_string(cn));
          cuda::SetFp8BlockGemmCluster(cm, cn);
          cuda::DeviceBuffer y3 = kt::Poisoned<float>(static_cast<size_t>(m * n));
          (*engine)->Run(x.as<__nv_bfloat16>(), m, k, dev.weight, n, y3.as<float>(), nullptr);
          const std::vector<float> out3 = kt::Download<float>(y3, static_cast<size_t>(m * n));
          EXPECT_EQ(0, std::memcmp(out.data(), out3.data(), out.size() * 4));
        }
        cuda::SetFp8BlockGemmCluster(1, 1);
      }
    }
  }
}

}  // namespace
}  // namespace kestrel
