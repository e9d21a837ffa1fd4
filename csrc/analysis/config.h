// The allocator's settings the model follows: python/allocscope/allocator/config.py's
// AllocatorConfig, less what only the Python replay handles (expandable
// segments, pinned memory), as torch parses PYTORCH_CUDA_ALLOC_CONF.
#pragma once

#include <cstdint>
#include <vector>

namespace allocscope::replay {

struct Config {
  uint64_t max_split_size = UINT64_MAX;
  uint64_t max_non_split_rounding_size = 20ull << 20;
  uint64_t large_segment_size = 20ull << 20;
  double garbage_collection_threshold = 0.0;
  std::vector<int64_t> roundup_power2_divisions;  // one per bucket from 1 MiB
  bool segment_order = false;  // free blocks of equal size by segment creation first (torch >= 2.12)
};

}  // namespace allocscope::replay
