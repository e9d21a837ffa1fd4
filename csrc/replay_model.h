// One device's caching allocator, as python/allocscope/allocator/model.py
// models it (shared pools, cudaMalloc'd segments; see replay.h for what is
// left to Python). Blocks live in a slot vector and are named by (slot,
// generation): a block merged into its neighbour dies, and a name the replay
// kept for it (a pending free) must then read as "no longer pending", as a
// dead Python Block object does.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "replay.h"

namespace allocscope::replay {

constexpr uint64_t kMinBlock = 512;
constexpr uint64_t kSmallSize = 1ull << 20;
constexpr uint64_t kSmallBuffer = 2ull << 20;
constexpr uint64_t kMinLargeAlloc = 10ull << 20;
constexpr uint64_t kRoundLarge = 2ull << 20;

uint64_t round_size(uint64_t size, const std::vector<int64_t>& divisions);
uint64_t allocation_size(uint64_t size, uint64_t large_segment_size);

// Fresh, non-overlapping addresses for segments no recording placed.
struct BumpAddresses {
  uint64_t next = 0;
  uint64_t operator()(uint64_t size) {
    uint64_t a = next;
    next += (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge + kRoundLarge;
    return a;
  }
};

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

struct Handle {
  int32_t slot = -1;
  uint32_t gen = 0;
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
  int64_t reserved = 0, allocated = 0, active = 0;
  int64_t capacity = -1, allowed_ = -1;
  int64_t num_ooms = 0;

 private:
  using Key = std::tuple<uint64_t, uint64_t, uint64_t, int32_t>;  // size, segment order, address, slot
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
    std::map<int64_t, std::set<Key>> free;  // stream -> free blocks, torch's set order
    int64_t calls = 0;  // get_free_blocks_call_count (garbage collection ages)
  };

  int32_t new_block(uint64_t addr, uint64_t size, int64_t stream, bool small, int32_t seg);
  void kill(int32_t b);
  Key key(int32_t b) const;
  Pool& pool(bool small) { return small ? small_ : large_; }
  void insert_free(int32_t b);
  void remove_free(int32_t b);
  bool gc_active() const { return allowed_ >= 0 && config_.garbage_collection_threshold > 0; }
  bool should_split(int32_t b, uint64_t size) const;
  int32_t get_free_block(bool small, int64_t stream, uint64_t size);
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
  Pool small_, large_;
  std::vector<int32_t> pending_;
  std::vector<std::pair<uint64_t, Handle>> loaded_live_;
  int64_t requested_ = 0, peak_reserved_ = 0, peak_allocated_ = 0;
  int64_t num_alloc_retries_ = 0, num_device_alloc_ = 0, num_device_free_ = 0, num_gc_runs_ = 0;
  int64_t emitted_ = 0;
};

}  // namespace allocscope::replay
