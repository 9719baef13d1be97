// The Q4_K row interleaving of ops.h (PackQ4_KRows), read by the AVX2 integer kernel.
#include <cstring>

#include "backends/cpu/ops.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace kestrel::cpu {

using quant::kQ4_KBytes;
using quant::kQKBlock;
using quant::Q4KScaleMin;

bool CanPackQ4_KRows(const TensorView& w) {
  return w.dtype == DType::kQ4_K && w.n_dims == 2 && w.shape[0] > 0 && w.shape[0] % 8 == 0 &&
         w.shape[1] % kQKBlock == 0;
}

int64_t PackedQ4_KBytes(const TensorView& w) {
  KCHECK(CanPackQ4_KRows(w));
  return w.shape[0] / 8 * (w.shape[1] / kQKBlock) * kQ4_KPackedBlockBytes;
}

void PackQ4_KRows(const TensorView& w, uint8_t* out) {
  KCHECK(CanPackQ4_KRows(w));
  const int64_t n_blocks = w.shape[1] / kQKBlock;
  const int64_t row_bytes = w.row_bytes();
  const uint8_t* data = static_cast<const uint8_t*>(w.data);
  for (int64_t group = 0; group < w.shape[0] / 8; ++group) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      uint8_t* o = out + (group * n_blocks + b) * kQ4_KPackedBlockBytes;
      for (int r = 0; r < 8; ++r) {
        const uint8_t* blk = data + (group * 8 + r) * row_bytes + b * kQ4_KBytes;
        for (int c = 0; c < 4; ++c) {
          for (int j = 0; j < 8; ++j) {
            std::memcpy(o + ((c * 8 + j) * 8 + r) * 4, blk + 16 + 32 * c + 4 * j, 4);
          }
        }
        std::memcpy(o + 1024 + 2 * r, blk, 2);      // d
        std::memcpy(o + 1040 + 2 * r, blk + 2, 2);  // dmin
        for (int g = 0; g < 8; ++g) {
          int sc = 0, m = 0;
          Q4KScaleMin(blk + 4, g, &sc, &m);
          o[1056 + 8 * g + r] = static_cast<uint8_t>(sc);
          o[1120 + 8 * g + r] = static_cast<uint8_t>(m);
        }
      }
    }
  }
}

}  // namespace kestrel::cpu
