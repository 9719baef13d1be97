// The row interleaving of ops.h (PackRows) for Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS,
// Q3_K and Q2_K, read by the AVX2 integer kernels.
#include <cstring>

#include "backends/cpu/ops.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace kestrel::cpu {

using quant::kQ4_KBytes;
using quant::kQ8_0Block;
using quant::kQ8_0Bytes;
using quant::kQKBlock;
using quant::Q4KScaleMin;

namespace {

// Row r's `bytes` bytes at src (a multiple of 4) as 4-byte pieces into the [pieces][8 rows][4
// bytes] layout at o: piece p of row r lands at o + (p * 8 + r) * 4.
void InterleavePieces(uint8_t* o, const uint8_t* src, int bytes, int r) {
  for (int p = 0; p < bytes / 4; ++p) std::memcpy(o + (p * 8 + r) * 4, src + 4 * p, 4);
}

// One packed block: the 8 rows' block b of a Q4_K (kFifthBit false) or Q5_K group (rows[r] = row
// r's blocks).
template <bool kFifthBit>
void PackQ45_KBlock(const uint8_t* const* rows, int64_t b, uint8_t* o) {
  constexpr int64_t kBytes = kFifthBit ? quant::kQ5_KBytes : kQ4_KBytes;
  constexpr int kQs = kFifthBit ? 48 : 16;
  constexpr int kTail = kFifthBit ? 1280 : 1024;  // d, dmin, scales, mins
  for (int r = 0; r < 8; ++r) {
    const uint8_t* blk = rows[r] + b * kBytes;
    InterleavePieces(o, blk + kQs, 128, r);
    if constexpr (kFifthBit) InterleavePieces(o + 1024, blk + 16, 32, r);
    std::memcpy(o + kTail + 2 * r, blk, 2);           // d
    std::memcpy(o + kTail + 16 + 2 * r, blk + 2, 2);  // dmin
    for (int g = 0; g < 8; ++g) {
      int sc = 0, m = 0;
      Q4KScaleMin(blk + 4, g, &sc, &m);
      o[kTail + 32 + 8 * g + r] = static_cast<uint8_t>(sc);
      o[kTail + 96 + 8 * g + r] = static_cast<uint8_t>(m);
    }
  }
}

// The same for Q8_0.
void PackQ8_0Block(const uint8_t* const* rows, int64_t b, uint8_t* o) {
  for (int r = 0; r < 8; ++r) {
    const uint8_t* blk = rows[r] + b * kQ8_0Bytes;
    InterleavePieces(o, blk + 2, 32, r);
    std::memcpy(o + 256 + 2 * r, blk, 2);  // d
  }
}

// The same for Q4_0 and Q5_0: nibbles, (Q5_0) qh, d.
void PackLegacyBlock(DType t, const uint8_t* const* rows, int64_t b, uint8_t* o) {
  const quant::LegacyBlock l = quant::LegacyLayout(t);
  const bool five = l.qh_at >= 0;
  for (int r = 0; r < 8; ++r) {
    const uint8_t* blk = rows[r] + b * l.bytes;
    InterleavePieces(o, blk + l.nibbles_at, 16, r);
    if (five) std::memcpy(o + 128 + 4 * r, blk + l.qh_at, 4);
    std::memcpy(o + (five ? 160 : 128) + 2 * r, blk, 2);  // d
  }
}

// The same for IQ4_XS: nibbles by group, d, ls - 32.
void PackIq4XsBlock(const uint8_t* const* rows, int64_t b, uint8_t* o) {
  for (int r = 0; r < 8; ++r) {
    const uint8_t* blk = rows[r] + b * quant::kIQ4_XSBytes;
    InterleavePieces(o, blk + 8, 128, r);
    for (int ib = 0; ib < 8; ++ib) {
      o[1040 + 8 * ib + r] =
          static_cast<uint8_t>(static_cast<int8_t>(quant::Iq4XsScale(blk, ib) - 32));
    }
    std::memcpy(o + 1024 + 2 * r, blk, 2);  // d
  }
}

// The same for Q3_K: qs runs, hmask runs, d, sc - 32.
void PackQ3_KBlock(const uint8_t* const* rows, int64_t b, uint8_t* o) {
  for (int r = 0; r < 8; ++r) {
    const uint8_t* blk = rows[r] + b * quant::kQ3_KBytes;
    InterleavePieces(o, blk + 32, 64, r);        // qs
    InterleavePieces(o + 512, blk, 32, r);       // hmask
    std::memcpy(o + 768 + 2 * r, blk + 108, 2);  // d
    for (int g = 0; g < 16; ++g) {
      o[784 + 8 * g + r] =
          static_cast<uint8_t>(static_cast<int8_t>(quant::Q3KScale(blk + 96, g) - 32));
    }
  }
}

// The same for Q6_K: ql runs, qh runs, d, sc.
void PackQ6_KBlock(const uint8_t* const* rows, int64_t b, uint8_t* o) {
  for (int r = 0; r < 8; ++r) {
    const uint8_t* blk = rows[r] + b * quant::kQ6_KBytes;
    InterleavePieces(o, blk, 128, r);              // ql
    InterleavePieces(o + 1024, blk + 128, 64, r);  // qh
    std::memcpy(o + 1536 + 2 * r, blk + 208, 2);  // d
    for (int g = 0; g < 16; ++g) o[1552 + 8 * g + r] = blk[192 + g];
  }
}

// The same for Q2_K: qs runs, d, dmin, the scale bytes.
void PackQ2_KBlock(const uint8_t* const* rows, int64_t b, uint8_t* o) {
  for (int r = 0; r < 8; ++r) {
    const uint8_t* blk = rows[r] + b * quant::kQ2_KBytes;
    InterleavePieces(o, blk + 16, 64, r);
    std::memcpy(o + 512 + 2 * r, blk + 80, 2);  // d
    std::memcpy(o + 528 + 2 * r, blk + 82, 2);  // dmin
    for (int g = 0; g < 16; ++g) o[544 + 8 * g + r] = blk[g];
  }
}

int64_t BlockElements(const TensorView& w) {
  return TakesQ8_0Activations(w.dtype) ? kQ8_0Block : kQKBlock;
}

}  // namespace

bool CanPackRows(const TensorView& w) {
  return PackedBlockBytes(w.dtype) > 0 && w.n_dims == 2 && w.shape[0] > 0 &&
         w.shape[0] % 8 == 0 && w.shape[1] % BlockElements(w) == 0;
}

int64_t PackedRowsBytes(const TensorView& w) {
  KCHECK(CanPackRows(w));
  return w.shape[0] / 8 * (w.shape[1] / BlockElements(w)) * PackedBlockBytes(w.dtype);
}

void PackRows(const TensorView& w, uint8_t* out) {
  KCHECK(CanPackRows(w));
  const int64_t n_blocks = w.shape[1] / BlockElements(w);
  const int64_t block_bytes = PackedBlockBytes(w.dtype);
  const int64_t row_bytes = w.row_bytes();
  const uint8_t* data = static_cast<const uint8_t*>(w.data);
  for (int64_t group = 0; group < w.shape[0] / 8; ++group) {
    const uint8_t* rows[8];
    for (int r = 0; r < 8; ++r) rows[r] = data + (group * 8 + r) * row_bytes;
    for (int64_t b = 0; b < n_blocks; ++b) {
      uint8_t* o = out + (group * n_blocks + b) * block_bytes;
      if (w.dtype == DType::kQ4_K) {
        PackQ45_KBlock<false>(rows, b, o);
      } else if (w.dtype == DType::kQ5_K) {
        PackQ45_KBlock<true>(rows, b, o);
      } else if (w.dtype == DType::kQ8_0) {
        PackQ8_0Block(rows, b, o);
      } else if (w.dtype == DType::kIQ4_XS) {
        PackIq4XsBlock(rows, b, o);
      } else if (w.dtype == DType::kQ3_K) {
        PackQ3_KBlock(rows, b, o);
      } else if (w.dtype == DType::kQ6_K) {
        PackQ6_KBlock(rows, b, o);
      } else if (w.dtype == DType::kQ2_K) {
        PackQ2_KBlock(rows, b, o);
      } else {  // IQ4_NL has Q4_0's layout
        PackLegacyBlock(w.dtype == DType::kIQ4_NL ? DType::kQ4_0 : w.dtype, rows, b, o);
      }
    }
  }
}

}  // namespace kestrel::cpu
