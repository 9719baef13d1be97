// safetensors parsing and WeightStore: good files load with the right bytes; every malformed
// file gives a Status whose message names the file and the problem (never a crash).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "models/safetensors.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> SafetensorsBytes(const std::string& header, const std::vector<uint8_t>& data) {
  // Sized up front and filled with memcpy (vector::insert trips a GCC 12 -O3 -Warray-bounds
  // false positive).
  std::vector<uint8_t> out(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 1);
  return v;
}

Result<std::vector<SafetensorsEntry>> Parse(const std::string& header, size_t n_data_bytes) {
  const std::vector<uint8_t> bytes = SafetensorsBytes(header, Iota(n_data_bytes));
  return ParseSafetensorsHeader(bytes.data(), bytes.size(), "x.safetensors");
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The result is an error with this code whose message contains every needle.
#define EXPECT_ERROR(result, expected_code, ...)                                       \
  do {                                                                                 \
    const auto& result_ = (result);                                                    \
    ASSERT_FALSE(result_.ok());                                                        \
    EXPECT_EQ(result_.status().code(), (expected_code)) << result_.status().message(); \
    for (const char* needle : {__VA_ARGS__}) {                                         \
      EXPECT_TRUE(Contains(result_.status().message(), needle))                        \
          << "message: " << result_.status().message() << "\nmissing: " << needle;     \
    }                                                                                  \
  } while (0)

class WeightStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kestrel_st_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream out(dir_ + "/" + name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  void WriteText(const std::string& name, const std::string& text) {
    Write(name, std::vector<uint8_t>(text.begin(), text.end()));
  }

  std::string dir_;
};

// ---- ParseSafetensorsHeader ------------------------------------------------------------------

TEST(SafetensorsHeader, ParsesEntriesSortedByOffset) {
  auto r = Parse(R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
                     "a": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [0, 4]},
                     "__metadata__": {"format": "pt"}})",
                 12);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].name, "a");
  EXPECT_EQ((*r)[0].dtype, DType::kBF16);
  EXPECT_EQ((*r)[0].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ((*r)[1].name, "b");
  EXPECT_EQ((*r)[1].begin, 4u);
  EXPECT_EQ((*r)[1].end, 12u);
}

TEST(SafetensorsHeader, AllowsUncoveredDataAndTrailingSpaces) {
  auto r = Parse(R"({"a": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}}     )", 16);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->size(), 1u);
}

TEST(SafetensorsHeader, EmptyTensorsDoNotOverlap) {
  auto r = Parse(R"({"e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [4, 4]},
                     "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                 8);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->size(), 2u);
}

TEST(SafetensorsHeader, FileTooSmall) {
  const uint8_t bytes[5] = {1, 0, 0, 0, 0};
  auto r = ParseSafetensorsHeader(bytes, sizeof(bytes), "tiny.safetensors");
  EXPECT_ERROR(r, StatusCode::kInvalidArgument, "tiny.safetensors", "too small");
}

TEST(SafetensorsHeader, HeaderLengthBeyondFile) {
  std::vector<uint8_t> bytes = SafetensorsBytes(R"({})", {});
  bytes[0] = 200;  // claims 200 header bytes; the file has 2
  auto r = ParseSafetensorsHeader(bytes.data(), bytes.size(), "short.safetensors");
  EXPECT_ERROR(r, StatusCode::kOutOfRange, "short.safetensors", "header length 200",
               "runs past the end");
}

TEST(SafetensorsHeader, HeaderLengthAbsurd) {
  std::vector<uint8_t> bytes = SafetensorsBytes(R"({})", {});
  bytes[5] = 1;  // 2^40 + 2
  auto r = ParseSafetensorsHeader(bytes.data(), bytes.size(), "big.safetensors");
  EXPECT_ERROR(r, StatusCode::kInvalidArgument, "big.safetensors", "100 MB");
}

TEST(SafetensorsHeader, BadJsonReportsPosition) {
  auto r = Parse("{\"a\": {\"dtype\": \"F32\",\n \"shape\": [1] \"data_offsets\": [0, 4]}}", 4);
  EXPECT_ERROR(r, StatusCode::kInvalidArgument, "x.safetensors", "not valid JSON", "line 2");
}

TEST(SafetensorsHeader, NotAnObject) {
  EXPECT_ERROR(Parse("[1, 2]", 0), StatusCode::kInvalidArgument, "must start with '{'");
  EXPECT_ERROR(Parse("", 0), StatusCode::kInvalidArgument, "must start with '{'");
  EXPECT_ERROR(Parse(R"({"a": 5})", 0), StatusCode::kInvalidArgument, "'a'", "must be an object");
}

TEST(SafetensorsHeader, DeepNestingIsRefusedNotRecursed) {
  std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_ERROR(Parse(deep, 0), StatusCode::kInvalidArgument, "nested deeper");
}

TEST(SafetensorsHeader, DuplicateName) {
  auto r = Parse(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                     "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                 8);
  EXPECT_ERROR(r, StatusCode::kInvalidArgument, "'a'", "more than once");
}

TEST(SafetensorsHeader, OffsetsOutOfRange) {
  auto r = Parse(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 12);
  EXPECT_ERROR(r, StatusCode::kOutOfRange, "x.safetensors", "'w'", "end 16", "12 bytes");
}

TEST(SafetensorsHeader, BeginAfterEnd) {
  auto r = Parse(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 12);
  EXPECT_ERROR(r, StatusCode::kInvalidArgument, "'w'", "begin 8 > end 4");
}

TEST(SafetensorsHeader, SizeMismatch) {
  auto r = Parse(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})", 16);
  EXPECT_ERROR(r, StatusCode::kInvalidArgument, "'w'", "span 8 bytes", "[2, 2]", "needs 16");
}

TEST(SafetensorsHeader, Overlap) {
  auto r = Parse(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                 12);
  EXPECT_ERROR(r, StatusCode::kInvalidArgument, "'a'", "'b'", "overlap");
}

TEST(SafetensorsHeader, UnsupportedAndUnknownDtypes) {
  EXPECT_ERROR(Parse(R"({"ids": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8),
               StatusCode::kUnsupported, "'ids'", "I64", "F32, F16, BF16, F8_E4M3 and U32 / I32");
  EXPECT_ERROR(Parse(R"({"q": {"dtype": "F8_E5M2", "shape": [1], "data_offsets": [0, 1]}})", 1),
               StatusCode::kUnsupported, "'q'", "F8_E5M2");
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}})", 1),
               StatusCode::kInvalidArgument, "'w'", "unknown dtype 'Q7'");
  EXPECT_ERROR(Parse(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4),
               StatusCode::kInvalidArgument, "'w'", "dtype");
}

TEST(SafetensorsHeader, BadShapes) {
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}})", 8),
               StatusCode::kInvalidArgument, "'w'", "non-negative integers", "-1");
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
               StatusCode::kInvalidArgument, "'w'", "non-negative integers");
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})", 8),
               StatusCode::kInvalidArgument, "'w'", "shape");
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],
                                 "data_offsets": [0, 0]}})",
                     0),
               StatusCode::kInvalidArgument, "'w'", "overflows");
  // 2^62 elements fit in 64 bits, their F32 byte size does not.
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "F32", "shape": [4611686018427387904],
                                 "data_offsets": [0, 0]}})",
                     0),
               StatusCode::kInvalidArgument, "'w'", "overflows");
}

TEST(SafetensorsHeader, OverflowingDimsWithAZeroAreEmpty) {
  auto r = Parse(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0],
                           "data_offsets": [0, 0]}})",
                 0);
  EXPECT_TRUE(r.ok()) << r.status().message();
}

TEST(SafetensorsHeader, BadOffsets) {
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4),
               StatusCode::kInvalidArgument, "'w'", "[begin, end]");
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}})", 4),
               StatusCode::kInvalidArgument, "'w'", "non-negative integers");
  EXPECT_ERROR(Parse(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4),
               StatusCode::kInvalidArgument, "'w'", "non-negative integers");
}

TEST(SafetensorsHeader, BadMetadata) {
  EXPECT_ERROR(Parse(R"({"__metadata__": {"format": 1}})", 0), StatusCode::kInvalidArgument,
               "__metadata__", "'format'", "string");
  EXPECT_ERROR(Parse(R"({"__metadata__": [1]})", 0), StatusCode::kInvalidArgument, "__metadata__");
}

// ---- WeightStore -----------------------------------------------------------------------------

TEST_F(WeightStoreTest, SingleFile) {
  // [2, 3] bf16 (12 bytes) then [2] f32 (8 bytes).
  std::vector<uint8_t> data = Iota(20);
  Write(
      "model.safetensors",
      SafetensorsBytes(R"({"x.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                             "y": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},
                             "__metadata__": {"format": "pt"}})",
                       data));
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_TRUE(store->Has("x.weight"));
  EXPECT_FALSE(store->Has("__metadata__"));
  EXPECT_EQ(store->tensors().size(), 2u);
  EXPECT_EQ(store->files(), std::vector<std::string>{dir_ + "/model.safetensors"});
  EXPECT_EQ(store->total_bytes(), 20u);

  auto x = store->Get("x.weight", {2, 3});
  ASSERT_TRUE(x.ok()) << x.status().message();
  EXPECT_EQ(x->dtype, DType::kBF16);
  EXPECT_EQ(x->n_dims, 2);
  EXPECT_EQ(x->size_bytes(), 12u);
  EXPECT_EQ(std::memcmp(x->data, data.data(), 12), 0);
  auto y = store->Get("y", {2});
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_EQ(std::memcmp(y->data, data.data() + 12, 8), 0);
  EXPECT_EQ(static_cast<const uint8_t*>(y->data) - static_cast<const uint8_t*>(x->data), 12);
}

TEST_F(WeightStoreTest, UnalignedDataIsServedInPlace) {
  // Header length chosen so 8 + length is odd: the data section starts at an odd address
  // (the mapping itself is page-aligned).
  std::string header = R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  if ((8 + header.size()) % 2 == 0) header += " ";
  std::vector<uint8_t> data(8);
  const float values[2] = {1.5f, -2.25f};
  std::memcpy(data.data(), values, 8);
  Write("model.safetensors", SafetensorsBytes(header, data));
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto w = store->Get("w", {2});
  ASSERT_TRUE(w.ok());
  EXPECT_NE(reinterpret_cast<uintptr_t>(w->data) % 2, 0u);
  float loaded[2];
  std::memcpy(loaded, w->data, 8);  // unaligned-safe read, as kernels must do
  EXPECT_EQ(loaded[0], 1.5f);
  EXPECT_EQ(loaded[1], -2.25f);
}

TEST_F(WeightStoreTest, GetWrongShapeOrName) {
  Write("model.safetensors",
        SafetensorsBytes(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})",
                         Iota(24)));
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto bad = store->Get("w", {3, 2});
  EXPECT_ERROR(bad, StatusCode::kInvalidArgument, "model.safetensors", "'w'", "[2, 3]",
               "expected [3, 2]");
  auto rank = store->Get("w", {6});
  EXPECT_ERROR(rank, StatusCode::kInvalidArgument, "'w'", "expected [6]");
  auto missing = store->Get("v", {1});
  EXPECT_ERROR(missing, StatusCode::kNotFound, "'v'", dir_.c_str());
}

TEST_F(WeightStoreTest, TruncatedFile) {
  std::vector<uint8_t> bytes = SafetensorsBytes(
      R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", Iota(16));
  bytes.resize(bytes.size() - 5);
  Write("model.safetensors", bytes);
  auto store = WeightStore::Open(dir_);
  EXPECT_ERROR(store, StatusCode::kOutOfRange, "model.safetensors", "'w'", "truncated");

  Write("model.safetensors", std::vector<uint8_t>{3, 0, 0});
  auto tiny = WeightStore::Open(dir_);
  EXPECT_ERROR(tiny, StatusCode::kInvalidArgument, "model.safetensors", "too small");
}

TEST_F(WeightStoreTest, RankFiveLoadsRankNineIsUnsupported) {
  // Rank 5: the Conv3d patch embedding of a multimodal checkpoint's vision tower.
  Write(
      "model.safetensors",
      SafetensorsBytes(
          R"({"w": {"dtype": "F32", "shape": [1, 1, 1, 1, 2], "data_offsets": [0, 8]}})", Iota(8)));
  auto five = WeightStore::Open(dir_);
  ASSERT_TRUE(five.ok()) << five.status().message();
  EXPECT_EQ(five->tensors().at("w").n_dims, 5);
  Write(
      "model.safetensors",
      SafetensorsBytes(
          R"({"w": {"dtype": "F32", "shape": [1, 1, 1, 1, 1, 1, 1, 1, 2], "data_offsets": [0, 8]}})",
          Iota(8)));
  auto store = WeightStore::Open(dir_);
  EXPECT_ERROR(store, StatusCode::kUnsupported, "'w'", "rank 9");
}

TEST_F(WeightStoreTest, NoWeights) {
  auto store = WeightStore::Open(dir_);
  EXPECT_ERROR(store, StatusCode::kNotFound, "model.safetensors.index.json");
  auto nodir = WeightStore::Open(dir_ + "/nope");
  EXPECT_ERROR(nodir, StatusCode::kNotFound, "not a directory");
}

class ShardedTest : public WeightStoreTest {
 protected:
  void WriteShards() {
    Write("model-00001-of-00002.safetensors",
          SafetensorsBytes(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "b": {"dtype": "F16", "shape": [3], "data_offsets": [8, 14]}})",
                           Iota(14)));
    Write("model-00002-of-00002.safetensors",
          SafetensorsBytes(R"({"c": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}})",
                           Iota(8)));
  }
  void WriteIndex(const std::string& weight_map) {
    WriteText("model.safetensors.index.json",
              R"({"metadata": {"total_size": 22}, "weight_map": )" + weight_map + "}");
  }
};

TEST_F(ShardedTest, LoadsEveryShardOnce) {
  WriteShards();
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors"})");
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_EQ(store->files().size(), 2u);
  EXPECT_EQ(store->tensors().size(), 3u);
  EXPECT_EQ(store->file_of("c"), dir_ + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(store->file_of("zzz"), "");
  auto c = store->Get("c", {2, 2});
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::vector<uint8_t> expected = Iota(8);
  EXPECT_EQ(std::memcmp(c->data, expected.data(), 8), 0);
  EXPECT_EQ(store->total_bytes(), 22u);
}

TEST_F(ShardedTest, MissingShard) {
  WriteShards();
  WriteIndex(
      R"({"a": "model-00001-of-00002.safetensors", "z": "model-00009-of-00009.safetensors"})");
  auto store = WeightStore::Open(dir_);
  EXPECT_ERROR(store, StatusCode::kNotFound, "model.safetensors.index.json",
               "model-00009-of-00009.safetensors", "does not exist");
}

TEST_F(ShardedTest, TensorMissingFromShard) {
  WriteShards();
  WriteIndex(
      R"({"a": "model-00001-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"})");
  auto store = WeightStore::Open(dir_);
  EXPECT_ERROR(store, StatusCode::kNotFound, "'c'", "model-00001-of-00002.safetensors",
               "does not contain it");
}

TEST_F(ShardedTest, DuplicateAcrossShards) {
  WriteShards();
  Write("model-00003-of-00003.safetensors",
        SafetensorsBytes(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                         Iota(4)));
  WriteIndex(
      R"({"a": "model-00001-of-00002.safetensors", "x": "model-00003-of-00003.safetensors"})");
  auto store = WeightStore::Open(dir_);
  EXPECT_ERROR(store, StatusCode::kInvalidArgument, "'a'", "appears in both",
               "model-00001-of-00002.safetensors", "model-00003-of-00003.safetensors");
}

TEST_F(ShardedTest, BadIndex) {
  WriteShards();
  WriteIndex(R"({"a": "../model-00001-of-00002.safetensors"})");
  EXPECT_ERROR(WeightStore::Open(dir_), StatusCode::kInvalidArgument, "not a plain file name");
  WriteIndex(R"({"a": 3})");
  EXPECT_ERROR(WeightStore::Open(dir_), StatusCode::kInvalidArgument, "'a'", "file name");
  WriteIndex(R"({})");
  EXPECT_ERROR(WeightStore::Open(dir_), StatusCode::kInvalidArgument, "empty");
  WriteText("model.safetensors.index.json", R"({"weight_map": {"a": )");
  EXPECT_ERROR(WeightStore::Open(dir_), StatusCode::kInvalidArgument, "invalid JSON", "line 1");
  WriteText("model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_ERROR(WeightStore::Open(dir_), StatusCode::kInvalidArgument, "weight_map");
}

TEST_F(ShardedTest, BrokenShardNamesTheShard) {
  WriteShards();
  Write("model-00002-of-00002.safetensors",
        SafetensorsBytes(R"({"c": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 6]}})",
                         Iota(8)));
  WriteIndex(
      R"({"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})");
  auto store = WeightStore::Open(dir_);
  EXPECT_ERROR(store, StatusCode::kInvalidArgument, "model-00002-of-00002.safetensors", "'c'",
               "needs 8");
}

}  // namespace

// Every e4m3fn code against its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits,
// subnormals at exponent 0, 0x7f / 0xff NaN.
TEST(Fp8, E4M3DecodesEveryCodeExactly) {
  for (int code = 0; code < 256; ++code) {
    const float got = F8E4M3ToF32(static_cast<uint8_t>(code));
    const int e = (code >> 3) & 15, m = code & 7;
    const double sign = (code & 0x80) ? -1.0 : 1.0;
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    const double want = e == 0 ? sign * std::ldexp(m, -9) : sign * std::ldexp(8 + m, e - 10);
    EXPECT_EQ(static_cast<double>(got), want) << code;
  }
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);
}

}  // namespace kestrel
