// The replay's hot loop in C++: a capture's requests driven through a model
// of c10's DeviceCachingAllocator, the same model as
// python/allocscope/allocator/model.py, decision for decision, for the
// allocator features most captures use: the shared small and large pools,
// cudaMalloc'd segments, rounding (roundup_power2_divisions), max_split_size,
// max_non_split_rounding, large_segment_size, garbage collection, memory
// fractions, frees deferred to other streams, empty_cache, several devices.
// Captures that use expandable segments or private pools (CUDA graphs,
// MemPool) replay in Python (allocator/native.py decides). The Python model
// stays the reference: tests replay every fixture and generated request
// streams both ways and require the same result.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "model.h"
#include "segments.h"

namespace allocscope::replay {

// The capture's event columns (reader.Events), borrowed.
struct Events {
  size_t n = 0;
  const uint8_t* kind = nullptr;
  const uint64_t* addr = nullptr;
  const uint64_t* size = nullptr;
  const uint64_t* block = nullptr;
  const uint64_t* arg = nullptr;
  const uint16_t* stream = nullptr;
  const uint8_t* deferred = nullptr;  // per event: a FREE that waited for another stream
};

struct Oom {
  int64_t event, device;
  uint64_t size, rounded;
  int64_t stream;
  bool recorded;
  int64_t reserved, allocated, active, capacity, allowed;  // -1: none
  std::vector<SegmentOut> segments;
};

struct Result {
  // After each event (index e + 1; 0 is the start), summed over devices.
  std::vector<int64_t> reserved, allocated, active, largest_free;
  std::vector<int64_t> block_sizes;  // per event
  std::vector<Oom> ooms;
  std::vector<int64_t> avoided_ooms;
  std::vector<std::pair<int64_t, std::vector<SegmentOut>>> states;
  std::vector<DeviceResult> devices;
  std::vector<SegmentOut> final_state;
  int64_t allocations = 0, address_mismatches = 0, unknown_frees = 0;
};

// Replays `events` (faithful: checked against the recorded segment events,
// whose addresses new segments take). stream_device/stream_handle: the
// capture's stream table. states_at: sorted event indices whose state to keep
// (negative: the start). stop_after: the last event to replay (< 0: none).
Result run(const Config& config, bool faithful, uint64_t synthetic_start, const std::vector<DeviceSetup>& devices,
           const Events& events, const std::vector<int64_t>& stream_device,
           const std::vector<int64_t>& stream_handle, const std::vector<int64_t>& states_at, int64_t stop_after);

}  // namespace allocscope::replay
