#include "core/gguf.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>

namespace kestrel {
namespace {

using nlohmann::json;

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
// Sanity bounds against hostile headers (the largest published GGUFs are far below these).
constexpr uint64_t kMaxTensors = 1 << 20;
constexpr uint64_t kMaxKeys = 1 << 20;
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr uint32_t kMaxDims = 4;

enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8,
  kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

struct TypeInfo {
  const char* name;
  int64_t block_elems;  // 0: size unknown to Kestrel
  int64_t block_bytes;
};

// ggml's type table (ggml.h), ids as in the file format.
TypeInfo GgmlType(uint32_t t) {
  switch (t) {
    case 0: return {"F32", 1, 4};
    case 1: return {"F16", 1, 2};
    case 2: return {"Q4_0", 32, 18};
    case 3: return {"Q4_1", 32, 20};
    case 6: return {"Q5_0", 32, 22};
    case 7: return {"Q5_1", 32, 24};
    case 8: return {"Q8_0", 32, 34};
    case 9: return {"Q8_1", 32, 36};
    case 10: return {"Q2_K", 256, 84};
    case 11: return {"Q3_K", 256, 110};
    case 12: return {"Q4_K", 256, 144};
    case 13: return {"Q5_K", 256, 176};
    case 14: return {"Q6_K", 256, 210};
    case 15: return {"Q8_K", 256, 292};
    case 16: return {"IQ2_XXS", 256, 66};
    case 17: return {"IQ2_XS", 256, 74};
    case 18: return {"IQ3_XXS", 256, 98};
    case 19: return {"IQ1_S", 256, 50};
    case 20: return {"IQ4_NL", 32, 18};
    case 21: return {"IQ3_S", 256, 110};
    case 22: return {"IQ2_S", 256, 82};
    case 23: return {"IQ4_XS", 256, 136};
    case 24: return {"I8", 1, 1};
    case 25: return {"I16", 1, 2};
    case 26: return {"I32", 1, 4};
    case 27: return {"I64", 1, 8};
    case 28: return {"F64", 1, 8};
    case 29: return {"IQ1_M", 256, 56};
    case 30: return {"BF16", 1, 2};
    case 34: return {"TQ1_0", 256, 54};
    case 35: return {"TQ2_0", 256, 66};
    case 39: return {"MXFP4", 32, 17};
    default: return {nullptr, 0, 0};
  }
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size, std::string where)
      : p_(data), size_(size), where_(std::move(where)) {}

  size_t pos() const { return pos_; }
  Status Need(uint64_t n, const char* what) const {
    if (n > size_ - pos_) {
      return InvalidArgument(where_ + "truncated: " + what + " at byte " + std::to_string(pos_) +
                             " needs " + std::to_string(n) + " bytes, the file has " +
                             std::to_string(size_ - pos_) + " left");
    }
    return Status::Ok();
  }
  template <class T>
  Result<T> Read(const char* what) {
    KTRY(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  Result<std::string> ReadString(const char* what) {
    KASSIGN(uint64_t n, Read<uint64_t>(what));
    if (n > kMaxStringBytes) {
      return InvalidArgument(where_ + what + " claims " + std::to_string(n) + " bytes");
    }
    KTRY(Need(n, what));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }
  const std::string& where() const { return where_; }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  std::string where_;
};

Result<json> ReadScalar(Reader& r, uint32_t type, const std::string& key) {
  switch (type) {
    case kU8: { KASSIGN(uint8_t v, r.Read<uint8_t>("a value")); return json(v); }
    case kI8: { KASSIGN(int8_t v, r.Read<int8_t>("a value")); return json(v); }
    case kU16: { KASSIGN(uint16_t v, r.Read<uint16_t>("a value")); return json(v); }
    case kI16: { KASSIGN(int16_t v, r.Read<int16_t>("a value")); return json(v); }
    case kU32: { KASSIGN(uint32_t v, r.Read<uint32_t>("a value")); return json(v); }
    case kI32: { KASSIGN(int32_t v, r.Read<int32_t>("a value")); return json(v); }
    case kU64: { KASSIGN(uint64_t v, r.Read<uint64_t>("a value")); return json(v); }
    case kI64: { KASSIGN(int64_t v, r.Read<int64_t>("a value")); return json(v); }
    case kF32: { KASSIGN(float v, r.Read<float>("a value")); return json(static_cast<double>(v)); }
    case kF64: { KASSIGN(double v, r.Read<double>("a value")); return json(v); }
    case kBool: {
      KASSIGN(uint8_t v, r.Read<uint8_t>("a value"));
      if (v > 1) return InvalidArgument(r.where() + "key '" + key + "': bool value " + std::to_string(v));
      return json(v == 1);
    }
    case kString: { KASSIGN(std::string s, r.ReadString("a string value")); return json(std::move(s)); }
    default:
      return InvalidArgument(r.where() + "key '" + key + "' has unknown value type " +
                             std::to_string(type));
  }
}

Result<json> ReadValue(Reader& r, uint32_t type, const std::string& key) {
  if (type != kArray) return ReadScalar(r, type, key);
  KASSIGN(uint32_t elem_type, r.Read<uint32_t>("an array type"));
  KASSIGN(uint64_t n, r.Read<uint64_t>("an array length"));
  if (elem_type == kArray) {
    return Unsupported(r.where() + "key '" + key + "': arrays of arrays are not read");
  }
  // Every element takes at least one byte: a length beyond the file is corrupt.
  KTRY(r.Need(n, "an array"));
  json a = json::array();
  a.get_ref<json::array_t&>().reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    KASSIGN(json v, ReadScalar(r, elem_type, key));
    a.push_back(std::move(v));
  }
  return a;
}

}  // namespace

std::string GgmlTypeName(uint32_t ggml_type) {
  const TypeInfo t = GgmlType(ggml_type);
  return t.name != nullptr ? t.name : "type " + std::to_string(ggml_type);
}

std::optional<DType> DTypeOfGgmlType(uint32_t ggml_type) {
  switch (ggml_type) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 30: return DType::kBF16;
    case 2: return DType::kQ4_0;
    case 3: return DType::kQ4_1;
    case 6: return DType::kQ5_0;
    case 7: return DType::kQ5_1;
    case 8: return DType::kQ8_0;
    case 12: return DType::kQ4_K;
    case 13: return DType::kQ5_K;
    case 14: return DType::kQ6_K;
    case 10:
      return DType::kQ2_K;
    case 11:
      return DType::kQ3_K;
    case 20:
      return DType::kIQ4_NL;
    case 23:
      return DType::kIQ4_XS;
    default: return std::nullopt;
  }
}

Result<GgufHeader> ParseGgufHeader(const uint8_t* data, size_t size, const std::string& path) {
  Reader r(data, size, path + ": ");
  GgufHeader h;
  KASSIGN(uint32_t magic, r.Read<uint32_t>("the magic"));
  if (magic != kMagic) return InvalidArgument(path + ": not a GGUF file (bad magic)");
  KASSIGN(h.version, r.Read<uint32_t>("the version"));
  if (h.version != 2 && h.version != 3) {
    return Unsupported(path + ": GGUF version " + std::to_string(h.version) +
                       " (versions 2 and 3 are read)");
  }
  KASSIGN(uint64_t n_tensors, r.Read<uint64_t>("the tensor count"));
  KASSIGN(uint64_t n_keys, r.Read<uint64_t>("the metadata count"));
  if (n_tensors > kMaxTensors || n_keys > kMaxKeys) {
    return InvalidArgument(path + ": implausible counts (" + std::to_string(n_tensors) +
                           " tensors, " + std::to_string(n_keys) + " metadata keys)");
  }
  for (uint64_t i = 0; i < n_keys; ++i) {
    KASSIGN(std::string key, r.ReadString("a metadata key"));
    KASSIGN(uint32_t type, r.Read<uint32_t>("a value type"));
    KASSIGN(json v, ReadValue(r, type, key));
    if (h.metadata.contains(key)) return InvalidArgument(path + ": metadata key '" + key + "' appears twice");
    h.metadata[key] = std::move(v);
  }
  if (auto it = h.metadata.find("general.alignment"); it != h.metadata.end()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() == 0 ||
        (it->get<uint64_t>() & (it->get<uint64_t>() - 1)) != 0 || it->get<uint64_t>() > 4096) {
      return InvalidArgument(path + ": general.alignment must be a power of two up to 4096");
    }
    h.alignment = it->get<uint64_t>();
  }
  h.tensors.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    KASSIGN(t.name, r.ReadString("a tensor name"));
    KASSIGN(uint32_t n_dims, r.Read<uint32_t>("a tensor rank"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return InvalidArgument(path + ": tensor '" + t.name + "' has rank " + std::to_string(n_dims));
    }
    std::vector<int64_t> dims(n_dims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      KASSIGN(uint64_t v, r.Read<uint64_t>("a tensor dimension"));
      if (v == 0 || v > (1ull << 40) || numel > (1ull << 48) / v) {
        return InvalidArgument(path + ": tensor '" + t.name + "' has an implausible shape");
      }
      numel *= v;
      dims[d] = static_cast<int64_t>(v);
    }
    t.shape.assign(dims.rbegin(), dims.rend());
    KASSIGN(t.ggml_type, r.Read<uint32_t>("a tensor type"));
    KASSIGN(t.offset, r.Read<uint64_t>("a tensor offset"));
    const TypeInfo info = GgmlType(t.ggml_type);
    if (info.name == nullptr || info.block_elems == 0) {
      return Unsupported(path + ": tensor '" + t.name + "' has ggml type " +
                         std::to_string(t.ggml_type) + ", which Kestrel does not know");
    }
    if (dims[0] % info.block_elems != 0) {
      return InvalidArgument(path + ": tensor '" + t.name + "' (" + info.name + ") has rows of " +
                             std::to_string(dims[0]) + " elements, not whole blocks of " +
                             std::to_string(info.block_elems));
    }
    t.n_bytes = numel / info.block_elems * info.block_bytes;
    if (t.offset % h.alignment != 0) {
      return InvalidArgument(path + ": tensor '" + t.name + "' starts at an unaligned offset");
    }
    h.tensors.push_back(std::move(t));
  }
  h.data_offset = (r.pos() + h.alignment - 1) / h.alignment * h.alignment;
  if (h.data_offset > size) return InvalidArgument(path + ": truncated before the tensor data");
  const uint64_t data_bytes = size - h.data_offset;
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : h.tensors) {
    if (t.offset > data_bytes || t.n_bytes > data_bytes - t.offset) {
      return InvalidArgument(path + ": tensor '" + t.name + "' runs past the end of the file");
    }
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i - 1]->offset + by_offset[i - 1]->n_bytes > by_offset[i]->offset) {
      return InvalidArgument(path + ": tensors '" + by_offset[i - 1]->name + "' and '" +
                             by_offset[i]->name + "' overlap");
    }
  }
  std::vector<std::string> names;
  for (const GgufTensorInfo& t : h.tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  if (auto d = std::adjacent_find(names.begin(), names.end()); d != names.end()) {
    return InvalidArgument(path + ": tensor '" + *d + "' appears twice");
  }
  return h;
}

bool IsGgufFile(const std::string& path) {
  if (IsDirectory(path) || !FileExists(path)) return false;
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  return f.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

namespace {

// 64-bit FNV-1a over the header bytes: a few MB at most, far cheaper than parsing them.
uint64_t HashBytes(const uint8_t* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
  return h;
}

struct ParsedHeader {
  std::string path;
  size_t file_size = 0;
  uint64_t header_hash = 0;  // of the bytes [0, data_offset)
  std::shared_ptr<const GgufHeader> header;
};
constexpr size_t kParsedHeadersKept = 4;
std::mutex g_parsed_mutex;
std::deque<ParsedHeader> g_parsed;  // most recent last

}  // namespace

Result<GgufFile> GgufFile::Open(const std::string& path) {
  GgufFile g;
  KASSIGN(g.file_, MappedFile::Open(path));
  const uint8_t* data = g.file_.data();
  const size_t size = g.file_.size();
  {
    std::lock_guard<std::mutex> lock(g_parsed_mutex);
    for (const ParsedHeader& p : g_parsed) {
      if (p.path == path && p.file_size == size &&
          HashBytes(data, p.header->data_offset) == p.header_hash) {
        g.header_ = p.header;
        return g;
      }
    }
  }
  KASSIGN(GgufHeader h, ParseGgufHeader(data, size, path));
  auto header = std::make_shared<const GgufHeader>(std::move(h));
  const uint64_t hash = HashBytes(data, header->data_offset);
  {
    std::lock_guard<std::mutex> lock(g_parsed_mutex);
    g_parsed.push_back({path, size, hash, header});
    if (g_parsed.size() > kParsedHeadersKept) g_parsed.pop_front();
  }
  g.header_ = std::move(header);
  return g;
}

namespace {
const json* Find(const json& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? nullptr : &*it;
}
}  // namespace

Result<std::optional<std::string>> GgufFile::String(const std::string& key) const {
  const json* v = Find(metadata(), key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return InvalidArgument(path() + ": metadata '" + key + "' must be a string");
  return std::optional<std::string>(v->get<std::string>());
}

Result<std::optional<int64_t>> GgufFile::Int(const std::string& key) const {
  const json* v = Find(metadata(), key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX)) {
    return InvalidArgument(path() + ": metadata '" + key + "' must be an integer");
  }
  return std::optional<int64_t>(v->get<int64_t>());
}

Result<std::optional<double>> GgufFile::Float(const std::string& key) const {
  const json* v = Find(metadata(), key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return InvalidArgument(path() + ": metadata '" + key + "' must be a number");
  return std::optional<double>(v->get<double>());
}

Result<std::optional<bool>> GgufFile::Bool(const std::string& key) const {
  const json* v = Find(metadata(), key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return InvalidArgument(path() + ": metadata '" + key + "' must be a bool");
  return std::optional<bool>(v->get<bool>());
}

}  // namespace kestrel
