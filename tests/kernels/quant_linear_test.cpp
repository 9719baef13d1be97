// Block-quantized weights (GGUF Q8_0, Q2_K .. Q6_K, Q4_0 .. Q5_1, IQ4_NL, IQ4_XS): the
// dequantization against the format's
// definition as an independent numpy implementation computes it (tools/make_gguf.py --golden),
// bit for bit, through every path that reads them (the scalar dequantizer, the AVX2 streaming
// kernel, the AVX2 packed kernel); and Linear over quantized weights equal, bit for bit, to
// Linear over the same weights dequantized to f32, in both kernel sets and at any thread count.
#include <gtest/gtest.h>

#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/ops.h"
#include "core/gguf.h"
#include "core/quant_blocks.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"

namespace kestrel {
namespace {

using cpu::KernelSet;
using cpu::OpContext;
using testing::RandomFloats;
using testing::SameBits;

// The formats with integer kernels (int8 activations), then every block format.
constexpr DType kQuantTypes[] = {DType::kQ8_0,   DType::kQ4_K,  DType::kQ5_K, DType::kQ6_K,
                                 DType::kQ4_0,   DType::kQ5_0,  DType::kQ2_K, DType::kQ3_K,
                                 DType::kIQ4_NL, DType::kIQ4_XS};
constexpr DType kAllQuantTypes[] = {DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,   DType::kQ6_K,
                                    DType::kQ4_0, DType::kQ5_0, DType::kQ4_1,   DType::kQ5_1,
                                    DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS};

// Quantized weights as raw blocks at `byte_offset` past a 64-byte boundary.
struct QuantWeights {
  std::vector<uint8_t> bytes;
  TensorView view;
  std::vector<float> values;  // every element dequantized (quant::DequantizeRow)
  TensorView f32_view;        // the same values as an F32 tensor
};

// Random bytes with sane f16 scales: every quant bit pattern, scales within +-2.
QuantWeights MakeQuantWeights(std::mt19937& rng, DType dtype, int64_t rows, int64_t cols,
                              size_t byte_offset) {
  QuantWeights w;
  const int64_t row_bytes = DTypeRowBytes(dtype, cols);
  w.bytes.resize(64 + byte_offset + static_cast<size_t>(rows * row_bytes));
  const size_t pad = (64 - reinterpret_cast<uintptr_t>(w.bytes.data()) % 64) % 64;
  uint8_t* base = w.bytes.data() + pad + byte_offset;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  const int64_t block = static_cast<int64_t>(DTypeSize(dtype));
  for (int64_t b = 0; b < rows * row_bytes / block; ++b) {
    uint8_t* p = base + b * block;
    for (int64_t i = 0; i < block; ++i) p[i] = static_cast<uint8_t>(byte(rng));
    auto put = [&](int64_t at) {
      const uint16_t h = F32ToF16(scale(rng));
      std::memcpy(p + at, &h, 2);
    };
    if (dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ5_0 ||
        dtype == DType::kIQ4_NL || dtype == DType::kIQ4_XS) {
      put(0);
    }
    if (dtype == DType::kQ4_K || dtype == DType::kQ5_K || dtype == DType::kQ4_1 ||
        dtype == DType::kQ5_1) {
      put(0);
      put(2);
    }
    if (dtype == DType::kQ6_K) put(208);
    if (dtype == DType::kQ2_K) {
      put(80);
      put(82);
    }
    if (dtype == DType::kQ3_K) put(108);
  }
  w.view.data = base;
  w.view.dtype = dtype;
  w.view.n_dims = 2;
  w.view.shape[0] = rows;
  w.view.shape[1] = cols;
  w.values.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    quant::DequantizeRow(dtype, base + r * row_bytes, cols, w.values.data() + r * cols);
  }
  w.f32_view = w.view;
  w.f32_view.dtype = DType::kF32;
  w.f32_view.data = w.values.data();
  return w;
}

// The builds of the integer kernels this CPU runs (AVX2, and the VNNI ones where supported).
std::vector<cpu::Int8DotIsa> SupportedInt8Isas() {
  std::vector<cpu::Int8DotIsa> isas;
  for (cpu::Int8DotIsa isa :
       {cpu::Int8DotIsa::kAvx2, cpu::Int8DotIsa::kAvxVnni, cpu::Int8DotIsa::kAvx512Vnni}) {
    if (cpu::CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

OpContext Avx2Context(ThreadPool* pool, cpu::Int8DotIsa isa) {
  OpContext ctx{KernelSet::kAvx2, pool};
  ctx.int8_isa = isa;
  return ctx;
}

std::vector<float> RunLinear(const OpContext& ctx, const std::vector<float>& x, int64_t m,
                             const TensorView& w) {
  std::vector<float> y(static_cast<size_t>(m * w.shape[0]), -777.0f);
  cpu::Linear(ctx, x.data(), m, w, TensorView{}, y.data());
  return y;
}

// The default path: int8 activations, integer dot products; the AVX2 kernels compute the
// reference's integers and float operations, so every kernel set and thread count gives the same
// bits, and the result is the f64 product of the dequantized weights and the dequantized int8
// activations up to the f32 rounding of the block terms.
TEST(QuantLinear, Int8ActivationsSameBitsInEveryKernelSet) {
  std::mt19937 rng(11);
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (DType dt : kQuantTypes) {
    // 352 columns: 11 blocks of 32, a last group of fewer than 8 (the 32-element formats).
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{37, 512}, {16, 768}, {9, 256}, {11, 352}}) {
      if (cols % DTypeBlockElems(dt) != 0) continue;
      QuantWeights w = MakeQuantWeights(rng, dt, rows, cols, 5);
      for (int64_t m : {1, 2, 5, 17, 40}) {
        const std::string label = std::string(DTypeName(dt)) + " " + std::to_string(rows) + "x" +
                                  std::to_string(cols) + " m=" + std::to_string(m);
        std::vector<float> x = RandomFloats(rng, m * cols);
        OpContext ref;
        ref.int8_activations = true;
        const std::vector<float> y = RunLinear(ref, x, m, w.view);
        // Against f64 over the dequantized operands: the activations quantized by the scalar
        // definition, each block's integer sum exact, so only the per-block f32 rounding remains.
        const bool k_quant = !TakesQ8_0Activations(dt);
        std::vector<int8_t> q(static_cast<size_t>(cols));
        std::vector<float> d(static_cast<size_t>(cols / 32));
        std::vector<int16_t> bs(static_cast<size_t>(cols / 16));
        for (int64_t t = 0; t < m; ++t) {
          if (k_quant) quant::QuantizeActsQ8_K(x.data() + t * cols, cols, q.data(), d.data(), bs.data());
          else quant::QuantizeActsQ8_0(x.data() + t * cols, cols, q.data(), d.data());
          for (int64_t n = 0; n < rows; ++n) {
            double exact = 0, mag = 0;
            for (int64_t i = 0; i < cols; ++i) {
              const double xd = double(q[static_cast<size_t>(i)]) * d[static_cast<size_t>(i / (k_quant ? 256 : 32))];
              exact += xd * w.values[static_cast<size_t>(n * cols + i)];
              mag += std::fabs(xd * w.values[static_cast<size_t>(n * cols + i)]);
            }
            ASSERT_LE(std::fabs(y[static_cast<size_t>(t * rows + n)] - exact), 1e-5 * mag + 1e-30) << label;
          }
        }
        for (cpu::Int8DotIsa isa : SupportedInt8Isas()) {
          for (ThreadPool* p : {&pool1, &pool2, &pool3}) {
            EXPECT_TRUE(SameBits(y, RunLinear(Avx2Context(p, isa), x, m, w.view)))
                << cpu::Int8DotIsaName(isa) << " " << label;
          }
        }
      }
    }
  }
}

// Q4_K, Q8_0, Q4_0, Q5_0, IQ4_XS and Q3_K rows interleaved by 8 (cpu::PackRows, what a CPU model
// loads for the AVX2 integer kernels): the same bits as the reference over the file's rows, at
// every batch size (Q4_K's tiles of 8, 4 and 1 token rows) and thread count, several chunks of rows
// included.
TEST(QuantLinear, PackedRowsGiveTheSameBits) {
  std::mt19937 rng(12);
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (const DType dt : {DType::kQ4_K, DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kIQ4_XS,
                         DType::kQ3_K, DType::kQ6_K, DType::kQ2_K, DType::kIQ4_NL, DType::kQ5_K}) {
    const int64_t block = DTypeBlockElems(dt);
    const int64_t packed_block = dt == DType::kQ4_K   ? cpu::kQ4_KPackedBlockBytes
                                 : dt == DType::kQ8_0 ? cpu::kQ8_0PackedBlockBytes
                                 : dt == DType::kQ4_0 || dt == DType::kIQ4_NL
                                     ? cpu::kQ4_0PackedBlockBytes
                                 : dt == DType::kIQ4_XS ? cpu::kIq4XsPackedBlockBytes
                                 : dt == DType::kQ3_K   ? cpu::kQ3_KPackedBlockBytes
                                 : dt == DType::kQ6_K   ? cpu::kQ6_KPackedBlockBytes
                                 : dt == DType::kQ2_K   ? cpu::kQ2_KPackedBlockBytes
                                 : dt == DType::kQ5_K   ? cpu::kQ5_KPackedBlockBytes
                                                        : cpu::kQ5_0PackedBlockBytes;
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{48, 512}, {16, 768}, {8, 256}, {520, 1024}, {16, 352}}) {
      if (cols % block != 0) continue;  // 352: 11 blocks of 32 (a last group of fewer than 8)
      QuantWeights w = MakeQuantWeights(rng, dt, rows, cols, 3);
      ASSERT_TRUE(cpu::CanPackRows(w.view));
      std::vector<uint8_t> packed(static_cast<size_t>(cpu::PackedRowsBytes(w.view)));
      EXPECT_EQ(cpu::PackedRowsBytes(w.view), rows / 8 * cols / block * packed_block);
      cpu::PackRows(w.view, packed.data());
      TensorView pv = w.view;
      pv.cpu_packed = packed.data();
      for (int64_t m : {1, 3, 13, 17, 40}) {
        const std::string label = std::string(DTypeName(dt)) + " " + std::to_string(rows) + "x" +
                                  std::to_string(cols) + " m=" + std::to_string(m);
        std::vector<float> x = RandomFloats(rng, m * cols);
        const std::vector<float> y = RunLinear(OpContext{}, x, m, w.view);  // reference, int8 acts
        for (cpu::Int8DotIsa isa : SupportedInt8Isas()) {
          for (ThreadPool* p : {&pool1, &pool2, &pool3}) {
            EXPECT_TRUE(SameBits(y, RunLinear(Avx2Context(p, isa), x, m, pv)))
                << cpu::Int8DotIsaName(isa) << " " << label;
          }
        }
      }
    }
  }
  QuantWeights odd = MakeQuantWeights(rng, DType::kQ4_K, 12, 256, 0);
  EXPECT_FALSE(cpu::CanPackRows(odd.view));  // rows not a multiple of 8
  QuantWeights odd8 = MakeQuantWeights(rng, DType::kQ8_0, 20, 64, 0);
  EXPECT_FALSE(cpu::CanPackRows(odd8.view));
  QuantWeights q41 = MakeQuantWeights(rng, DType::kQ4_1, 16, 256, 0);
  EXPECT_FALSE(cpu::CanPackRows(q41.view));  // a format without an integer kernel
}

// The VNNI builds of the integer kernels are checked above wherever this CPU runs them; on one
// without VNNI only the AVX2 build is, which this test reports as a skip. Where one runs, it is
// the default (unless KESTREL_CPU_VNNI says otherwise).
TEST(QuantLinear, VnniBuildsAreTheDefaultWhereSupported) {
  const std::vector<cpu::Int8DotIsa> isas = SupportedInt8Isas();
  if (isas.size() < 2) GTEST_SKIP() << "no AVX-VNNI or AVX512-VNNI here: only the AVX2 build ran";
  const char* env = std::getenv("KESTREL_CPU_VNNI");
  if (env != nullptr && *env != '\0')
    GTEST_SKIP() << "KESTREL_CPU_VNNI=" << env << " picks the build";
  EXPECT_EQ(cpu::Int8DotIsaInUse(), isas[1]) << cpu::Int8DotIsaName(cpu::Int8DotIsaInUse());
  EXPECT_EQ(OpContext{}.int8_isa, cpu::Int8DotIsaInUse());
}

TEST(QuantLinear, EqualsLinearOverTheDequantizedWeights) {
  std::mt19937 rng(7);
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (DType dt : kAllQuantTypes) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 512}, {16, 768}, {9, 256}}) {
      if (cols % DTypeBlockElems(dt) != 0) continue;
      QuantWeights w = MakeQuantWeights(rng, dt, rows, cols, 3);
      for (int64_t m : {1, 2, 3, 4, 5, 16, 17, 40}) {
        const std::string label = std::string(DTypeName(dt)) + " " + std::to_string(rows) + "x" +
                                  std::to_string(cols) + " m=" + std::to_string(m);
        std::vector<float> x = RandomFloats(rng, m * cols);
        const OpContext ref{KernelSet::kReference, nullptr, false};
        EXPECT_TRUE(SameBits(RunLinear(ref, x, m, w.view), RunLinear(ref, x, m, w.f32_view)))
            << "reference " << label;
        if (!cpu::CpuHasAvx2Fma()) continue;
        const OpContext fast2{KernelSet::kAvx2, &pool2, false};
        const std::vector<float> fast = RunLinear(fast2, x, m, w.view);
        EXPECT_TRUE(SameBits(fast, RunLinear(fast2, x, m, w.f32_view))) << "avx2 " << label;
        for (ThreadPool* p : {&pool1, &pool3}) {
          EXPECT_TRUE(SameBits(fast, RunLinear(OpContext{KernelSet::kAvx2, p, false}, x, m, w.view)))
              << "avx2 threads " << label;
        }
      }
    }
  }
}

TEST(QuantLinear, EmbeddingGatherDequantizesRows) {
  std::mt19937 rng(3);
  for (DType dt : kAllQuantTypes) {
    QuantWeights w = MakeQuantWeights(rng, dt, 11, 512, 0);
    const std::vector<int32_t> ids = {4, 0, 10, 4};
    std::vector<float> out(ids.size() * 512);
    cpu::EmbeddingGather(w.view, ids, out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(out.data() + i * 512, w.values.data() + ids[i] * 512, 512 * 4))
          << DTypeName(dt);
    }
  }
}

// The blocks and values tools/make_gguf.py --golden writes.
struct GoldenType {
  DType dtype;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

std::vector<GoldenType> ReadGolden() {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / ("kestrel_quant_golden_" + std::to_string(getpid()) + ".bin");
  const std::string cmd = "/usr/bin/python3 " + std::string(KESTREL_SOURCE_DIR) +
                          "/tools/make_gguf.py --golden " + out.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << " (needs Debian's python3-numpy)";
  std::ifstream f(out, std::ios::binary);
  auto u32 = [&] {
    uint32_t v = 0;
    f.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  std::vector<GoldenType> types(u32());
  for (GoldenType& t : types) {
    const uint32_t ggml = u32();
    const std::optional<DType> dt = DTypeOfGgmlType(ggml);
    EXPECT_TRUE(dt.has_value() && IsBlockQuantized(*dt)) << ggml;
    t.dtype = dt.value_or(DType::kQ8_0);
    t.rows = u32();
    t.cols = u32();
    t.bytes.resize(u32());
    f.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    t.values.resize(static_cast<size_t>(t.rows * t.cols));
    f.read(reinterpret_cast<char*>(t.values.data()), static_cast<std::streamsize>(t.values.size() * 4));
  }
  EXPECT_TRUE(f.good());
  fs::remove(out);
  return types;
}

TEST(QuantLinear, DequantizationMatchesTheNumpyDefinitionBitForBit) {
  const std::vector<GoldenType> golden = ReadGolden();
  // Q8_0, Q4_K, Q6_K, Q5_K, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS
  ASSERT_EQ(golden.size(), 12u);
  ThreadPool pool(2);
  for (const GoldenType& g : golden) {
    const std::string name(DTypeName(g.dtype));
    std::vector<float> scalar(g.values.size());
    for (int64_t r = 0; r < g.rows; ++r) {
      quant::DequantizeRow(g.dtype, g.bytes.data() + r * DTypeRowBytes(g.dtype, g.cols), g.cols,
                           scalar.data() + r * g.cols);
    }
    EXPECT_TRUE(SameBits(scalar, g.values)) << name << " scalar";
    TensorView w;
    w.data = g.bytes.data();
    w.dtype = g.dtype;
    w.n_dims = 2;
    w.shape[0] = g.rows;
    w.shape[1] = g.cols;
        // x = rows of the identity: y[i, n] = w[n, i] exactly (one non-zero product per sum), so the
    // kernels' own dequantization shows through unchanged. 16 rows at a time: the streaming
    // kernel; all at once: the packed one.
    for (KernelSet ks : {KernelSet::kReference, KernelSet::kAvx2}) {
      if (ks == KernelSet::kAvx2 && !cpu::CpuHasAvx2Fma()) continue;
      const OpContext ctx{ks, &pool, /*int8_activations=*/false};
      for (int64_t step : {int64_t{16}, g.cols}) {
        std::vector<float> seen(g.values.size());
        for (int64_t i0 = 0; i0 < g.cols; i0 += step) {
          const int64_t m = std::min(step, g.cols - i0);
          std::vector<float> x(static_cast<size_t>(m * g.cols), 0.0f);
          for (int64_t i = 0; i < m; ++i) x[i * g.cols + i0 + i] = 1.0f;
          const std::vector<float> y = RunLinear(ctx, x, m, w);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t n = 0; n < g.rows; ++n) seen[n * g.cols + i0 + i] = y[i * g.rows + n];
          }
        }
        // Equal as values: a -0 element comes out of 0 + 1 * -0 as +0.
        EXPECT_EQ(seen, g.values)
            << name << (ks == KernelSet::kAvx2 ? " avx2" : " reference") << " m=" << step;
      }
    }
  }
}

// FP8 (block scales) and MLX affine 4 / 8 bits (scales and biases per group), whose kernels find
// a row's side values once per row: every e4m3 code but the two NaNs (subnormals and both signs
// included) and every 4- and 8-bit code, against f32(e4m3) * scale and q * scale + bias computed
// here, through the streaming kernel (16 rows of x at a time) and the packed one (all at once),
// in both kernel sets. Blocks and groups of 64 (a power of two: a shift) and 96 (a division),
// rows not a multiple of the kernels' tiles, block rows that split the rows unevenly, scales
// from 2^-120 (FP8 products below f32's normal range) to 2^10.
TEST(QuantLinear, SideScaledFormatsDequantizeEveryCodeExactly) {
  std::mt19937 rng(21);
  ThreadPool pool(2);
  for (const DType dt : {DType::kF8E4M3, DType::kMlxQ4, DType::kMlxQ8}) {
    for (const int64_t width : {int64_t{64}, int64_t{96}}) {
      const int64_t rows = 19, cols = 3 * 192, block_rows = dt == DType::kF8E4M3 ? 5 : 1;
      const int64_t groups_per_row = (cols + width - 1) / width;
      const int64_t scale_rows = (rows + block_rows - 1) / block_rows;
      std::vector<float> scale(static_cast<size_t>(scale_rows * groups_per_row));
      std::vector<float> bias(scale.size());
      std::uniform_int_distribution<int> exponent(-120, 10);
      std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
      // MLX's scales are bf16 (f32 once loaded), so q * scale is exact and the kernels may fuse
      // the bias's addition: bf16-rounded here too.
      auto bf16 = [](float f) { return Bf16ToF32(F32ToBf16(f)); };
      for (size_t i = 0; i < scale.size(); ++i) {
        scale[i] = std::ldexp(mantissa(rng), exponent(rng));
        bias[i] = dt == DType::kF8E4M3 ? 0.0f : bf16(std::ldexp(mantissa(rng), exponent(rng)));
        if (dt != DType::kF8E4M3) scale[i] = bf16(scale[i]);
      }
      std::vector<uint8_t> bytes(static_cast<size_t>(DTypeRowBytes(dt, cols) * rows));
      std::vector<float> values(static_cast<size_t>(rows * cols));
      int code = 0;
      for (int64_t n = 0; n < rows; ++n) {
        for (int64_t i = 0; i < cols; ++i) {
          const int64_t g = n / block_rows * groups_per_row + i / width;
          float v;
          if (dt == DType::kF8E4M3) {
            do code = (code + 1) % 256;
            while ((code & 0x7f) == 0x7f);  // the NaNs
            bytes[static_cast<size_t>(n * cols + i)] = static_cast<uint8_t>(code);
            v = F8E4M3ToF32(static_cast<uint8_t>(code)) * scale[static_cast<size_t>(g)];
          } else {
            const int q = (code++) % (dt == DType::kMlxQ4 ? 16 : 256);
            const int64_t bit = (n * cols + i) * (dt == DType::kMlxQ4 ? 4 : 8);
            bytes[static_cast<size_t>(bit / 8)] |= static_cast<uint8_t>(q << (bit % 8));
            v = static_cast<float>(q) * scale[static_cast<size_t>(g)] +
                bias[static_cast<size_t>(g)];
          }
          values[static_cast<size_t>(n * cols + i)] = v;
        }
      }
      TensorView w;
      w.data = bytes.data();
      w.dtype = dt;
      w.n_dims = 2;
      w.shape[0] = rows;
      w.shape[1] = cols;
      w.block_scale = scale.data();
      w.group_bias = dt == DType::kF8E4M3 ? nullptr : bias.data();
      w.block_rows = block_rows;
      w.block_cols = width;
      const std::string name = std::string(DTypeName(dt)) + " width " + std::to_string(width);
      for (KernelSet ks : {KernelSet::kReference, KernelSet::kAvx2}) {
        if (ks == KernelSet::kAvx2 && !cpu::CpuHasAvx2Fma()) continue;
        const OpContext ctx{ks, &pool, /*int8_activations=*/false};
        for (int64_t step : {int64_t{16}, cols}) {
          std::vector<float> seen(values.size());
          for (int64_t i0 = 0; i0 < cols; i0 += step) {
            const int64_t m = std::min(step, cols - i0);
            std::vector<float> x(static_cast<size_t>(m * cols), 0.0f);
            for (int64_t i = 0; i < m; ++i) x[i * cols + i0 + i] = 1.0f;
            const std::vector<float> y = RunLinear(ctx, x, m, w);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t n = 0; n < rows; ++n) seen[n * cols + i0 + i] = y[i * rows + n];
            }
          }
          EXPECT_EQ(seen, values) << name << (ks == KernelSet::kAvx2 ? " avx2" : " reference")
                                  << " m=" << step;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kestrel
