// safetensors files, memory-mapped: single file or sharded through model.safetensors.index.json.
// Every header is validated (JSON, dtypes, shapes, offsets inside the file, byte size =
// shape x dtype, no overlapping tensors) before any tensor is handed out.
//
// Alignment: the format does not align tensor data (the data section starts at 8 + header
// length, and tensors at any byte offset inside it). Views point straight into the mapping and
// are never copied, so `TensorView::data` may be unaligned for its dtype: kernels must use
// unaligned loads (memcpy / _mm256_loadu_*), and CUDA uploads must not assume alignment either.
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

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull * 1000 * 1000;  // 100 MB

// Parses and validates the header of a safetensors file held in [data, data + size).
// Pure function over bytes (no I/O): the fuzz target drives it directly. `path` only names the
// file in messages. Accepted dtypes: F32, F16, BF16 (others: Unsupported, naming the tensor).
// Entries come back sorted by `begin`. The data section need not be fully covered.
Result<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                             const std::string& path);

// All tensors of a model directory, by name.
class WeightStore {
 public:
  // model.safetensors, else model.safetensors.index.json (each shard mapped once), else NotFound.
  // A GGUF file instead of a directory: OpenGguf.
  static Result<WeightStore> Open(const std::string& model_dir);
  // The tensors of a GGUF file under their Hugging Face names (models/gguf_model.cpp).
  static Result<WeightStore> OpenGguf(const std::string& path);

  bool Has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor with this exact shape, or a Status naming the file, tensor, and both shapes.
  Result<TensorView> Get(const std::string& name, std::vector<int64_t> expected_shape) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  std::vector<std::string> files() const;
  uint64_t total_bytes() const;  // sum of the tensors' byte sizes
  // The file holding `name` ("" if there is no such tensor).
  std::string file_of(const std::string& name) const;

 private:
  Status AddFile(const std::string& path);

  std::string model_dir_;
  std::vector<MappedFile> files_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, int> tensor_file_;  // name -> index into files_
  // Tensors re-laid at load (GGUF's permuted Llama q/k rows), owned here.
  std::vector<std::vector<uint8_t>> owned_;
};

}  // namespace kestrel
