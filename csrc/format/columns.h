// The event columns' encodings (format.h's ColumnEncoding; docs/format.md,
// "EVENTS"): LEB128 varints, zigzag for signed deltas, and the writer's
// choice of encoding for a column (python/allocscope/capture/codec.py's
// encode_column makes the same choice; the readers decode both).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace allocscope::format {

inline void put_varint(std::vector<uint8_t>* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

inline size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

inline uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}

// Appends one column of values, in the smallest of the CONST, SPARSE and
// DENSE encodings (the kind column is stored raw by the writer itself).
void encode_column(const std::vector<uint64_t>& values, std::vector<uint8_t>* out);

}  // namespace allocscope::format
