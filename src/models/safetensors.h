// safetensors files, memory-mapped: single file or sharded through model.safetensors.index.json.
// Every header is validated (JSON, dtypes, shapes, offsets inside the file, byte size =
// shape x dtype, no overlapping tensors) before any tensor is handed out.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kestrel {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offset inside the data section
  uint64_t end = 0;
};

// Parses and validates the header of a safetensors file held in [data, data + size).
// Pure function over bytes (no I/O): the fuzz target drives it directly.
Result<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                             const std::string& path);

// All tensors of a model directory, by name.
class WeightStore {
 public:
  static Result<WeightStore> Open(const std::string& model_dir);

  bool Has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor with this exact shape, or a Status naming the file, tensor, and both shapes.
  Result<TensorView> Get(const std::string& name, std::vector<int64_t> expected_shape) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  std::vector<std::string> files() const;
  uint64_t total_bytes() const;

 private:
  std::vector<MappedFile> files_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, int> tensor_file_;  // name -> index into files_
};

}  // namespace kestrel
