// The recording the replay is held to (python/allocscope/allocator/recorded.py's
// SegmentChecker): a device's segment events compared with the recorded ones
// as they happen, and new segments placed at their recorded address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "blocks.h"

namespace allocscope::replay {

struct Recorded {
  int64_t event;
  int kind;
  uint64_t addr, size;
};

// Compares a device's segment events with the recorded ones as they happen,
// and gives new segments their recorded address (allocator/recorded.py).
struct Checker {
  std::vector<Recorded> recorded;  // in event order
  bool enabled = false;
  size_t j = 0;
  bool mismatch = false;
  int64_t position = 0;
  bool has_recorded = false;
  Recorded rec{};
  SegEvent sim{};
  BumpAddresses* synthetic = nullptr;

  uint64_t address(int kind, uint64_t size);
  void check(const SegEvent& e);
};

}  // namespace allocscope::replay
