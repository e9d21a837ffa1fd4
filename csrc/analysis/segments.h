// Segments and blocks as a baseline lists them and as the replay reports them
// (python/allocscope/allocator/segments.py: SegmentInfo, BlockInfo): the start
// baseline the model loads, and the state it gives back (at an OOM, at chosen
// events, at the end).
#pragma once

#include <cstdint>
#include <vector>

namespace allocscope::replay {

struct LoadedBlock {
  uint64_t addr = 0, size = 0, requested = 0;
  bool active = false, allocated = false;
};

struct LoadedSegment {
  uint64_t addr = 0, size = 0;
  int64_t stream = 0;
  bool large = false;
  std::vector<LoadedBlock> blocks;
};

// A block as the replay reports it; its state as segments.py names them.
struct BlockOut {
  uint64_t addr, size, requested;
  int state;  // 0 allocated, 1 pending free, 2 inactive
  int64_t event;
};

struct SegmentOut {
  int64_t device;
  uint64_t addr, size;
  int64_t stream;
  bool large;
  std::vector<BlockOut> blocks;
};

}  // namespace allocscope::replay
