// One device's caching allocator, as python/allocscope/allocator/model.py
// models it (shared pools, cudaMalloc'd segments; see replay.h for what is
// left to Python). Blocks live in a slot vector and are named by (slot,
// generation): blocks.h.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "blocks.h"
#include "config.h"
#include "recorded.h"
#include "segments.h"

namespace allocscope::replay {

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

// A device's counters at the end of a replay (torch's memory_stats names),
// and where its segment events first differed from the recorded ones.
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

class Device {
 public:
  Device(const Config& config, const DeviceSetup& setup, Checker* checker);

  // malloc: the block (invalid slot where torch would throw, unless force).
  Handle malloc(uint64_t orig_size, int64_t stream);
  void free(Handle h, bool deferred);
  void complete(Handle h);  // a deferred free's events completed
  void empty_cache() { release_cached_blocks(); }
  void set_fraction(double fraction) { allowed_ = static_cast<int64_t>(fraction * static_cast<double>(total_)); }
  // The segment events malloc(size, stream) would make if the pending blocks
  // `ready` completed first: tried on a copy.
  std::vector<SegEvent> trial(const std::vector<Handle>& ready, uint64_t size, int64_t stream) const;

  bool alive(Handle h) const;
  uint64_t block_size(Handle h) const { return blocks_[h.slot].size; }
  uint64_t block_addr(Handle h) const { return blocks_[h.slot].addr; }
  bool from_baseline(Handle h) const { return blocks_[h.slot].tag == -1 && blocks_[h.slot].allocated; }
  int64_t largest_free() const;
  std::vector<SegmentOut> segments() const;
  // The start baseline's allocated and pending blocks, by address.
  const std::vector<std::pair<uint64_t, Handle>>& loaded_live() const { return loaded_live_; }
  std::vector<std::pair<uint64_t, Handle>> pending_blocks() const;

  int64_t device() const { return device_; }
  const Config& config() const { return config_; }
  DeviceResult counters() const;

  int64_t request = -1;  // the capture event being replayed
  bool force = false;    // an allocation that succeeded when recorded: never fail it
  // The address the recording gave the allocation being replayed (faithful
  // replays): it settles the guessed order of baseline segments where that
  // order decides between free blocks of equal size (learn_order).
  bool has_hint = false;
  uint64_t hint = 0;
  int64_t reserved = 0, allocated = 0, active = 0;
  int64_t capacity = -1, allowed_ = -1;
  int64_t num_ooms = 0;

 private:
  int32_t new_block(uint64_t addr, uint64_t size, int64_t stream, bool small, int32_t seg);
  void kill(int32_t b);
  FreeKey key(int32_t b) const;
  Pool& pool(bool small) { return small ? small_ : large_; }
  void insert_free(int32_t b);
  void remove_free(int32_t b);
  bool gc_active() const { return allowed_ >= 0 && config_.garbage_collection_threshold > 0; }
  bool should_split(int32_t b, uint64_t size) const;
  int32_t get_free_block(bool small, int64_t stream, uint64_t size);
  std::set<FreeKey>::iterator learn_order(std::set<FreeKey>& lst, std::set<FreeKey>::iterator it, uint64_t size);
  void swap_order(int32_t s1, int32_t s2);
  int32_t alloc_found_block(int32_t b, uint64_t size, uint64_t orig_size, int64_t stream, bool split);
  void free_block(int32_t b);
  void merge(int32_t dst, int32_t src);
  void emit(int kind, uint64_t addr, uint64_t size, int64_t stream);
  bool fits(uint64_t size) const { return capacity < 0 || reserved + static_cast<int64_t>(size) <= capacity; }
  int32_t alloc_block(bool small, int64_t stream, uint64_t alloc_size, bool retry);
  void release_block(int32_t b);
  bool release_available_cached_blocks(bool small, int64_t stream, uint64_t size);
  void release_cached_blocks();
  std::vector<int32_t> free_in_order(bool small) const;
  void release_blocks(bool small);
  void garbage_collect();
  bool is_split(int32_t b) const { return blocks_[b].prev >= 0 || blocks_[b].next >= 0; }

  Config config_;
  int64_t device_, total_;
  Checker* checker_;
  std::vector<SegEvent>* trial_events_ = nullptr;  // a trial collects its events here instead
  std::vector<Block> blocks_;
  std::vector<int32_t> free_slots_;
  std::vector<Segment> segs_;
  uint64_t baseline_orders_ = 0;  // segments numbered up to this came from the start baseline
  Pool small_, large_;
  std::vector<int32_t> pending_;
  std::vector<std::pair<uint64_t, Handle>> loaded_live_;
  int64_t requested_ = 0, peak_reserved_ = 0, peak_allocated_ = 0;
  int64_t num_alloc_retries_ = 0, num_device_alloc_ = 0, num_device_free_ = 0, num_gc_runs_ = 0;
  int64_t emitted_ = 0;
};

}  // namespace allocscope::replay
