// c10's rounding, as sizes.h says (each function the namesake in sizes.py).
#include "sizes.h"

#include <algorithm>

namespace allocscope::replay {

namespace {

int bit_length(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

// c10's roundup_power2_next_division.
uint64_t next_division(uint64_t size, int64_t divisions) {
  if (size <= 4 || divisions <= 1 || (size & (size - 1)) == 0) return size;
  uint64_t floor2 = 1ull << (bit_length(size) - 1);
  uint64_t step = floor2 >> (bit_length(static_cast<uint64_t>(divisions)) - 1);
  if (step == 0) return floor2 << 1;
  uint64_t low = size & ~(step - 1);
  return low == size ? size : low + step;
}

}  // namespace

uint64_t round_size(uint64_t size, const std::vector<int64_t>& divisions) {
  if (size < kMinBlock) return kMinBlock;
  int bucket = std::min(std::max(bit_length(size) - 21, 0), 15);
  int64_t d = static_cast<size_t>(bucket) < divisions.size() ? divisions[bucket] : 0;
  if (d > 1 && size > kMinBlock * static_cast<uint64_t>(d)) return next_division(size, d);
  return (size + kMinBlock - 1) / kMinBlock * kMinBlock;
}

uint64_t allocation_size(uint64_t size, uint64_t large_segment_size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return large_segment_size;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

}  // namespace allocscope::replay
