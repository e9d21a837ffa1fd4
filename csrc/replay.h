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

namespace allocscope::replay {

struct Config {
  uint64_t max_split_size = UINT64_MAX;
  uint64_t max_non_split_rounding_size = 20ull << 20;
  uint64_t large_segment_size = 20ull << 20;
  double garbage_collection_threshold = 0.0;
  std::vector<int64_t> roundup_power2_divisions;  // one per bucket from 1 MiB
  bool segment_order = false;  // free blocks of equal size by segment creation first (torch >= 2.12)
};

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

// A device as the replay starts it: its memory, the bytes cudaMalloc may give
// (-1: unlimited), the memory fraction's limit (-1: none), and its segments
// from the start baseline (address order).
struct DeviceSetup {
  int64_t device = 0;
  int64_t total = 0;
  int64_t capacity = -1;
  int64_t allowed = -1;
  std::vector<LoadedSegment> start;
};

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

struct SegEvent {
  int kind;  // the format's SEGMENT_* event kind
  uint64_t addr, size;
  int64_t stream, request;
};

struct Oom {
  int64_t event, device;
  uint64_t size, rounded;
  int64_t stream;
  bool recorded;
  int64_t reserved, allocated, active, capacity, allowed;  // -1: none
  std::vector<SegmentOut> segments;
};

struct DeviceResult {
  int64_t device;
  int64_t num_alloc_retries = 0, num_ooms = 0, num_device_alloc = 0, num_device_free = 0, num_gc_runs = 0;
  int64_t reserved = 0, allocated = 0, active = 0, peak_reserved = 0, peak_allocated = 0;
  int64_t emitted = 0;  // segment events made (the replay's own, not trials')
  int64_t matched = 0;  // leading segment events equal to the recorded ones
  bool mismatch = false;
  int64_t mismatch_position = 0;
  bool mismatch_has_recorded = false;
  int64_t recorded_event = 0;
  SegEvent recorded{}, simulated{};
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
