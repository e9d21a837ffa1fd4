// c10's sizes and rounding (python/allocscope/allocator/sizes.py): the block
// size a request is rounded to, and the segment size cudaMalloc is asked for.
#pragma once

#include <cstdint>
#include <vector>

namespace allocscope::replay {

constexpr uint64_t kMinBlock = 512;
constexpr uint64_t kSmallSize = 1ull << 20;
constexpr uint64_t kSmallBuffer = 2ull << 20;
constexpr uint64_t kMinLargeAlloc = 10ull << 20;
constexpr uint64_t kRoundLarge = 2ull << 20;  // kRoundLarge in c10: large segments in 2 MiB units

uint64_t round_size(uint64_t size, const std::vector<int64_t>& divisions);
uint64_t allocation_size(uint64_t size, uint64_t large_segment_size);

}  // namespace allocscope::replay
