#include "models/safetensors.h"

#include <algorithm>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/gguf.h"
#include "core/json_file.h"

namespace kestrel {
namespace {

using nlohmann::json;

// Every dtype name the safetensors format defines; anything else is not a safetensors file.
constexpr std::string_view kKnownDTypes[] = {
    "BOOL", "U8",  "I8",  "I16", "U16", "F16",     "BF16",    "I32",     "U32",     "F32",
    "F64",  "I64", "U64", "C64", "F4",  "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0"};

// safetensors headers are three levels deep; anything much deeper is hostile input.
constexpr int kMaxJsonDepth = 16;

uint64_t ReadU64LE(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Result<DType> ParseDType(const std::string& name, const std::string& dtype,
                         const std::string& where) {
  if (dtype == "F32") return DType::kF32;
  if (dtype == "F16") return DType::kF16;
  if (dtype == "BF16") return DType::kBF16;
  if (dtype == "F8_E4M3") return DType::kF8E4M3;  // block-quantized FP8 checkpoints
  if (dtype == "U32") return DType::kU32;          // packed MLX quantized weights
  if (dtype == "I32") return DType::kI32;          // packed AWQ / GPTQ weights, GPTQ g_idx
  for (std::string_view known : kKnownDTypes) {
    if (dtype == known) {
      return Unsupported(where + "tensor '" + name + "' has dtype " + dtype +
                         "; only F32, F16, BF16, F8_E4M3 and U32 / I32 (packed) weights are supported");
    }
  }
  return InvalidArgument(where + "tensor '" + name + "' has unknown dtype '" + dtype + "'");
}

// A JSON integer >= 0 (signed or unsigned storage); floats and negatives are refused.
bool AsNonNegative(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
    return true;
  }
  return false;
}

Result<SafetensorsEntry> ParseEntry(const std::string& name, const json& e, uint64_t data_bytes,
                                    const std::string& where) {
  const std::string what = where + "tensor '" + name + "'";
  if (!e.is_object())
    return InvalidArgument(what + ": entry must be an object, got " + JsonTypeName(e));
  SafetensorsEntry entry;
  entry.name = name;

  auto dtype_it = e.find("dtype");
  if (dtype_it == e.end() || !dtype_it->is_string()) {
    return InvalidArgument(what + ": missing or non-string \"dtype\"");
  }
  KASSIGN(entry.dtype, ParseDType(name, dtype_it->get<std::string>(), where));

  auto shape_it = e.find("shape");
  if (shape_it == e.end() || !shape_it->is_array()) {
    return InvalidArgument(what + ": missing or non-array \"shape\"");
  }
  uint64_t numel = 1;
  bool overflow = false;
  bool has_zero = false;
  for (const json& d : *shape_it) {
    uint64_t dim = 0;
    if (!AsNonNegative(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX)) {
      return InvalidArgument(what + ": shape entries must be non-negative integers, got " +
                             JsonExcerpt(d));
    }
    entry.shape.push_back(static_cast<int64_t>(dim));
    if (dim == 0) has_zero = true;
    if (!overflow && dim != 0 && numel > UINT64_MAX / dim) overflow = true;
    if (!overflow) numel *= dim;
  }
  // A zero dimension makes the product 0 whatever overflowed before it.
  if (has_zero) {
    numel = 0;
    overflow = false;
  }
  const uint64_t elem_bytes = DTypeSize(entry.dtype);
  if (overflow || numel > UINT64_MAX / elem_bytes) {
    return InvalidArgument(what + ": shape " + ShapeToString(entry.shape) + " overflows 64 bits");
  }
  const uint64_t n_bytes = numel * elem_bytes;

  auto off_it = e.find("data_offsets");
  if (off_it == e.end() || !off_it->is_array() || off_it->size() != 2) {
    return InvalidArgument(what + ": \"data_offsets\" must be an array [begin, end]");
  }
  if (!AsNonNegative((*off_it)[0], &entry.begin) || !AsNonNegative((*off_it)[1], &entry.end)) {
    return InvalidArgument(what + ": data_offsets must be non-negative integers, got " +
                           JsonExcerpt(*off_it));
  }
  if (entry.begin > entry.end) {
    return InvalidArgument(what + ": data_offsets begin " + std::to_string(entry.begin) +
                           " > end " + std::to_string(entry.end));
  }
  if (entry.end > data_bytes) {
    return OutOfRange(what + ": data_offsets end " + std::to_string(entry.end) +
                      " is past the data section (" + std::to_string(data_bytes) +
                      " bytes); file truncated?");
  }
  if (entry.end - entry.begin != n_bytes) {
    return InvalidArgument(what + ": data_offsets span " + std::to_string(entry.end - entry.begin) +
                           " bytes but shape " + ShapeToString(entry.shape) + " x " +
                           std::string(DTypeName(entry.dtype)) + " needs " +
                           std::to_string(n_bytes));
  }
  return entry;
}

Status CheckMetadata(const json& m, const std::string& where) {
  if (!m.is_object()) {
    return InvalidArgument(where + "\"__metadata__\" must be an object, got " + JsonTypeName(m));
  }
  for (const auto& [key, value] : m.items()) {
    if (!value.is_string()) {
      return InvalidArgument(where + "\"__metadata__\" value of '" + key +
                             "' must be a string, got " + JsonTypeName(value));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                             const std::string& path) {
  const std::string where = path + ": ";
  if (size < 8) {
    return InvalidArgument(where + "file is " + std::to_string(size) +
                           " bytes, too small for a safetensors header");
  }
  const uint64_t header_bytes = ReadU64LE(data);
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return InvalidArgument(where + "header length " + std::to_string(header_bytes) +
                           " exceeds the 100 MB limit (not a safetensors file?)");
  }
  if (header_bytes > size - 8) {
    return OutOfRange(where + "header length " + std::to_string(header_bytes) +
                      " runs past the end of the file (" + std::to_string(size) +
                      " bytes); file truncated?");
  }
  const std::string_view text(reinterpret_cast<const char*>(data + 8), header_bytes);
  if (text.empty() || text.front() != '{') {
    return InvalidArgument(where + "header is not a JSON object (must start with '{')");
  }
  if (JsonNestingDepth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return InvalidArgument(where + "header JSON is nested deeper than " +
                           std::to_string(kMaxJsonDepth) + " levels");
  }

  // Duplicate tensor names would silently keep the last one; catch them while parsing.
  std::set<std::string> seen_keys;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen_keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::parse_error& e) {
    const TextPosition pos = PositionOfByte(text, e.byte > 0 ? e.byte - 1 : 0);
    std::string reason = e.what();
    const size_t colon = reason.find(": ");
    if (colon != std::string::npos) reason = reason.substr(colon + 2);
    return InvalidArgument(where + "header is not valid JSON (line " + std::to_string(pos.line) +
                           ", column " + std::to_string(pos.column) + "): " + reason);
  } catch (const std::exception& e) {
    return InvalidArgument(where + "header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) {
    return InvalidArgument(where + "header must be a JSON object, got " + JsonTypeName(header));
  }
  if (!duplicate.empty()) {
    return InvalidArgument(where + "header lists '" + duplicate + "' more than once");
  }

  const uint64_t data_bytes = size - 8 - header_bytes;
  std::vector<SafetensorsEntry> entries;
  entries.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      KTRY(CheckMetadata(value, where));
      continue;
    }
    KASSIGN(SafetensorsEntry entry, ParseEntry(name, value, data_bytes, where));
    entries.push_back(std::move(entry));
  }

  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  // Empty tensors occupy no bytes and cannot overlap anything.
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : entries) {
    if (e.begin == e.end) continue;
    if (prev != nullptr && prev->end > e.begin) {
      return InvalidArgument(where + "tensors '" + prev->name + "' [" +
                             std::to_string(prev->begin) + ", " + std::to_string(prev->end) +
                             ") and '" + e.name + "' [" + std::to_string(e.begin) + ", " +
                             std::to_string(e.end) + ") overlap");
    }
    prev = &e;
  }
  return entries;
}

// ---------------------------------------------------------------------------------------------

Status WeightStore::AddFile(const std::string& path) {
  KASSIGN(MappedFile file, MappedFile::Open(path));
  KASSIGN(std::vector<SafetensorsEntry> entries,
          ParseSafetensorsHeader(file.data(), file.size(), path));
  const uint8_t* data_section = file.data() + 8 + ReadU64LE(file.data());
  const int file_index = static_cast<int>(files_.size());
  for (const SafetensorsEntry& e : entries) {
    if (e.shape.empty() || e.shape.size() > static_cast<size_t>(kMaxDims)) {
      return Unsupported(path + ": tensor '" + e.name + "' has rank " +
                         std::to_string(e.shape.size()) + "; ranks 1.." + std::to_string(kMaxDims) +
                         " are supported");
    }
    auto existing = tensor_file_.find(e.name);
    if (existing != tensor_file_.end()) {
      return InvalidArgument(model_dir_ + ": tensor '" + e.name + "' appears in both " +
                             files_[existing->second].path() + " and " + path);
    }
    TensorView view;
    view.data = data_section + e.begin;
    view.dtype = e.dtype;
    view.n_dims = static_cast<int>(e.shape.size());
    for (int i = 0; i < view.n_dims; ++i) view.shape[i] = e.shape[i];
    tensors_.emplace(e.name, view);
    tensor_file_.emplace(e.name, file_index);
  }
  // Moving a MappedFile keeps its mapping (and so every view's pointer) where it is.
  files_.push_back(std::move(file));
  return Status::Ok();
}

Result<WeightStore> WeightStore::Open(const std::string& model_dir) {
  if (IsGgufFile(model_dir)) return OpenGguf(model_dir);
  if (!IsDirectory(model_dir)) return NotFound(model_dir + ": not a directory");
  WeightStore store;
  store.model_dir_ = model_dir;
  const std::string single = model_dir + "/model.safetensors";
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  if (FileExists(single)) {
    KTRY(store.AddFile(single));
    return store;
  }
  if (!FileExists(index_path)) {
    return NotFound(model_dir + ": no model.safetensors or model.safetensors.index.json");
  }

  KASSIGN(nlohmann::json index, ReadJsonFile(index_path));
  const std::string where = index_path + ": ";
  if (!index.is_object()) return InvalidArgument(where + "must be a JSON object");
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return InvalidArgument(where + "missing \"weight_map\" object");
  }
  if (map_it->empty()) return InvalidArgument(where + "\"weight_map\" is empty");

  // Shards in first-mention order, each opened once.
  std::vector<std::string> shards;
  std::set<std::string> shard_set;
  for (const auto& [name, file] : map_it->items()) {
    if (!file.is_string()) {
      return InvalidArgument(where + "weight_map entry for '" + name + "' must be a file name");
    }
    const std::string& shard = file.get_ref<const std::string&>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\0') != std::string::npos) {
      return InvalidArgument(where + "weight_map entry for '" + name + "' names '" + shard +
                             "', which is not a plain file name in the model directory");
    }
    if (shard_set.insert(shard).second) shards.push_back(shard);
  }
  for (const std::string& shard : shards) {
    const std::string path = model_dir + "/" + shard;
    if (!FileExists(path)) {
      return NotFound(where + "shard '" + shard + "' does not exist (" + path + ")");
    }
    KTRY(store.AddFile(path));
  }
  for (const auto& [name, file] : map_it->items()) {
    const std::string path = model_dir + "/" + file.get<std::string>();
    auto it = store.tensor_file_.find(name);
    if (it == store.tensor_file_.end() || store.files_[it->second].path() != path) {
      return NotFound(where + "tensor '" + name + "' is mapped to " + path +
                      ", which does not contain it");
    }
  }
  return store;
}

Result<TensorView> WeightStore::Get(const std::string& name,
                                    std::vector<int64_t> expected_shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return NotFound(model_dir_ + ": no tensor named '" + name + "' (" +
                    std::to_string(tensors_.size()) + " tensors in " +
                    std::to_string(files_.size()) + " file(s))");
  }
  const TensorView& t = it->second;
  bool same = static_cast<size_t>(t.n_dims) == expected_shape.size();
  for (int i = 0; same && i < t.n_dims; ++i) same = t.shape[i] == expected_shape[i];
  if (!same) {
    return InvalidArgument(file_of(name) + ": tensor '" + name + "' has shape " + ShapeString(t) +
                           ", expected " + ShapeToString(expected_shape));
  }
  return t;
}

std::vector<std::string> WeightStore::files() const {
  std::vector<std::string> out;
  out.reserve(files_.size());
  for (const MappedFile& f : files_) out.push_back(f.path());
  return out;
}

uint64_t WeightStore::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.size_bytes();
  return n;
}

std::string WeightStore::file_of(const std::string& name) const {
  auto it = tensor_file_.find(name);
  return it == tensor_file_.end() ? std::string() : files_[it->second].path();
}

}  // namespace kestrel
