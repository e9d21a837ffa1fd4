// The pieces of the caching allocator's state, as c10 keeps them
// (python/allocscope/allocator/blocks.py): blocks (pieces of a segment,
// linked to their neighbours; named by slot and generation, so that a block
// merged into its neighbour reads as dead, as a dead Python Block object
// does), segments, pools (the free blocks of each stream), the segment events
// the allocator emits, and fresh addresses for segments no recording placed.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>

#include "sizes.h"

namespace allocscope::replay {

// What the allocator did to device memory (blocks.py's SegmentEvent).
struct SegEvent {
  int kind;  // the format's SEGMENT_* event kind
  uint64_t addr, size;
  int64_t stream, request;
};

// A block's name that outlives it: a dead block's slot is reused with the next generation.
struct Handle {
  int32_t slot = -1;
  uint32_t gen = 0;
};

// Fresh, non-overlapping addresses for segments no recording placed.
struct BumpAddresses {
  uint64_t next = 0;
  uint64_t operator()(uint64_t size) {
    uint64_t a = next;
    next += (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge + kRoundLarge;
    return a;
  }
};

// A free block's place in its pool, in c10's set order: size, then (torch >=
// 2.12) segment creation order, then address (unique); the slot names the block.
using FreeKey = std::tuple<uint64_t, uint64_t, uint64_t, int32_t>;  // size, segment order, address, slot

struct Block {
  uint64_t addr = 0, size = 0, requested = 0;
  int64_t stream = 0, tag = -1, gc_base = 0;
  int32_t seg = -1, prev = -1, next = -1;
  uint32_t gen = 0;
  bool small = false, allocated = false, pending = false, alive = false;
};

struct Segment {
  int64_t stream;
  bool small;
  uint64_t order;
};

struct Pool {
  std::map<int64_t, std::set<FreeKey>> free;  // stream -> free blocks, torch's set order
  int64_t calls = 0;  // get_free_blocks_call_count (garbage collection ages)
};

}  // namespace allocscope::replay
