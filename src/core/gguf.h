// GGUF files (the llama.cpp model container), memory-mapped: a header of typed metadata
// (key -> value) and tensor descriptions, then the aligned tensor data. The whole header is
// validated (magic, version 2 or 3, counts and lengths inside the file, value types, array
// sizes, tensor types, shapes, offsets aligned and inside the data section, no overlaps) before
// anything is handed out. The model layer (models/gguf_model.h) maps the contents onto Hugging
// Face names and config fields.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace kestrel {

struct GgufTensorInfo {
  std::string name;
  uint32_t ggml_type = 0;     // the file's type id (ggml_type)
  std::vector<int64_t> shape;  // outermost first (GGUF lists dims innermost first)
  uint64_t offset = 0;         // from the start of the data section
  uint64_t n_bytes = 0;
};

struct GgufHeader {
  uint32_t version = 0;
  // Metadata values as JSON: integers, floats, bools, strings, arrays of those.
  nlohmann::json metadata = nlohmann::json::object();
  std::vector<GgufTensorInfo> tensors;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // file offset of the data section
};

// The name of a ggml type id ("Q4_K", "IQ2_XS", ...; "type 99" for unknown ones).
std::string GgmlTypeName(uint32_t ggml_type);
// The DType Kestrel computes with for a ggml type, when it reads that type.
std::optional<DType> DTypeOfGgmlType(uint32_t ggml_type);

// Parses and validates the header of a GGUF file held in [data, data + size). Pure function over
// bytes (no I/O). `path` only names the file in messages.
Result<GgufHeader> ParseGgufHeader(const uint8_t* data, size_t size, const std::string& path);

// True when `path` is a regular file that starts with the GGUF magic.
bool IsGgufFile(const std::string& path);

class GgufFile {
 public:
  // Maps the file and parses its header. A load opens the same file several times (config,
  // tokenizer, chat template, weights), and a large vocabulary makes the header slow to parse, so
  // the last few parsed headers are kept process-wide and reused for a file of the same path and
  // size whose header bytes hash the same (a rewritten file is parsed again).
  static Result<GgufFile> Open(const std::string& path);

  const GgufHeader& header() const { return *header_; }
  const nlohmann::json& metadata() const { return header_->metadata; }
  const std::string& path() const { return file_.path(); }
  const uint8_t* tensor_data(const GgufTensorInfo& t) const {
    return file_.data() + header_->data_offset + t.offset;
  }
  // Metadata accessors: nullopt when absent; a wrong type is an error naming the key.
  Result<std::optional<std::string>> String(const std::string& key) const;
  Result<std::optional<int64_t>> Int(const std::string& key) const;
  Result<std::optional<double>> Float(const std::string& key) const;
  Result<std::optional<bool>> Bool(const std::string& key) const;
  // Moves the mapping: views into it stay valid for the life of the moved-to object.
  MappedFile ReleaseMapping() && { return std::move(file_); }

 private:
  MappedFile file_;
  std::shared_ptr<const GgufHeader> header_;
};

}  // namespace kestrel
