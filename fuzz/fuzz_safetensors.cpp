// libFuzzer target: ParseSafetensorsHeader over arbitrary bytes must return a Status, never
// crash, hang, or read outside the buffer; accepted headers must describe in-bounds,
// non-overlapping tensors of the advertised byte size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy so ASan sees the exact extent: any read past `size` is reported.
  std::vector<uint8_t> bytes(data, data + size);
  auto result = kestrel::ParseSafetensorsHeader(bytes.data(), bytes.size(), "fuzz.safetensors");
  if (!result.ok()) {
    if (result.status().message().empty()) std::abort();
    return 0;
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[static_cast<size_t>(i)];
  const uint64_t data_bytes = size - 8 - header_bytes;
  uint64_t prev_end = 0;
  for (const kestrel::SafetensorsEntry& e : *result) {
    uint64_t numel = 1;
    for (int64_t d : e.shape) numel *= static_cast<uint64_t>(d);
    if (e.begin > e.end || e.end > data_bytes) std::abort();
    if (e.end - e.begin != numel * kestrel::DTypeSize(e.dtype)) std::abort();
    if (e.begin != e.end) {
      if (e.begin < prev_end) std::abort();
      prev_end = e.end;
    }
  }
  return 0;
}
