// The caching-allocator model of model.h. Each function is the
// namesake in python/allocscope/allocator/model.py (itself c10's), in the
// same order of decisions; comments there say why each step is as it is.
#include "model.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "format/format.h"

namespace allocscope::replay {

namespace {

constexpr int kAllocKind = format::kSegmentAlloc;
constexpr int kFreeKind = format::kSegmentFree;

}  // namespace

Device::Device(const Config& config, const DeviceSetup& setup, Checker* checker)
    : capacity(setup.capacity), allowed_(setup.allowed), config_(config), device_(setup.device),
      total_(setup.total), checker_(checker) {
  // load_segments (allocator/state.py): the start baseline, address order.
  for (const LoadedSegment& s : setup.start) {
    bool small = !s.large;
    segs_.push_back({s.stream, small, segs_.size() + 1});
    int32_t seg = static_cast<int32_t>(segs_.size() - 1);
    int32_t prev = -1;
    for (const LoadedBlock& info : s.blocks) {
      int32_t b = new_block(info.addr, info.size, s.stream, small, seg);
      blocks_[b].prev = prev;
      if (prev >= 0) blocks_[prev].next = b;
      if (info.active) {
        Block& blk = blocks_[b];
        blk.allocated = info.allocated;
        blk.pending = !info.allocated;
        blk.requested = info.requested;
        active += static_cast<int64_t>(blk.size);
        requested_ += static_cast<int64_t>(blk.requested);
        if (info.allocated) {
          allocated += static_cast<int64_t>(blk.size);
          loaded_live_.push_back({blk.addr, {b, blk.gen}});
        } else {
          pending_.push_back(b);
        }
      } else {
        insert_free(b);
      }
      prev = b;
    }
    reserved += static_cast<int64_t>(s.size);
    peak_reserved_ = std::max(peak_reserved_, reserved);
    peak_allocated_ = std::max(peak_allocated_, allocated);
  }
  baseline_orders_ = segs_.size();
}

int32_t Device::new_block(uint64_t addr, uint64_t size, int64_t stream, bool small, int32_t seg) {
  int32_t b;
  if (!free_slots_.empty()) {
    b = free_slots_.back();
    free_slots_.pop_back();
  } else {
    b = static_cast<int32_t>(blocks_.size());
    blocks_.emplace_back();
  }
  Block& blk = blocks_[b];
  uint32_t gen = blk.gen;
  blk = Block{};
  blk.gen = gen;
  blk.addr = addr;
  blk.size = size;
  blk.stream = stream;
  blk.small = small;
  blk.seg = seg;
  blk.alive = true;
  return b;
}

void Device::kill(int32_t b) {
  blocks_[b].alive = false;
  ++blocks_[b].gen;
  free_slots_.push_back(b);
}

bool Device::alive(Handle h) const {
  return h.slot >= 0 && static_cast<size_t>(h.slot) < blocks_.size() && blocks_[h.slot].alive &&
         blocks_[h.slot].gen == h.gen;
}

FreeKey Device::key(int32_t b) const {
  const Block& blk = blocks_[b];
  return FreeKey{blk.size, config_.segment_order ? segs_[blk.seg].order : 0, blk.addr, b};
}

void Device::insert_free(int32_t b) {
  Pool& p = pool(blocks_[b].small);
  blocks_[b].gc_base = p.calls;
  p.free[blocks_[b].stream].insert(key(b));
}

void Device::remove_free(int32_t b) {
  auto& lst = pool(blocks_[b].small).free[blocks_[b].stream];
  if (lst.erase(key(b)) != 1) throw std::logic_error("replay: free list out of sync");
}

bool Device::should_split(int32_t b, uint64_t size) const {
  uint64_t remaining = blocks_[b].size - size;
  if (blocks_[b].small) return remaining >= kMinBlock;
  return size < config_.max_split_size && remaining > kSmallSize;
}

int32_t Device::get_free_block(bool small, int64_t stream, uint64_t size) {
  Pool& p = pool(small);
  if (gc_active()) ++p.calls;
  auto found = p.free.find(stream);
  if (found == p.free.end()) return -1;
  auto& lst = found->second;
  auto it = lst.lower_bound(FreeKey{size, 0, 0, std::numeric_limits<int32_t>::min()});
  if (it == lst.end()) return -1;
  if (has_hint && config_.segment_order && std::get<2>(*it) != hint) it = learn_order(lst, it, size);
  int32_t b = std::get<3>(*it);
  uint64_t have = blocks_[b].size;
  if (size < config_.max_split_size && have >= config_.max_split_size) return -1;
  if (size >= config_.max_split_size && have - size >= config_.max_non_split_rounding_size) return -1;
  lst.erase(it);
  return b;
}

// model.py's _learn_order: where the best fit ties with the block the
// recording took and both segments came from the baseline, the recording
// says which c10 ranks first.
std::set<FreeKey>::iterator Device::learn_order(std::set<FreeKey>& lst, std::set<FreeKey>::iterator it,
                                                uint64_t size) {
  int32_t b = std::get<3>(*it);
  int32_t seg_b = blocks_[b].seg;
  if (segs_[seg_b].order > baseline_orders_) return it;
  for (auto j = std::next(it); j != lst.end() && std::get<0>(*j) == std::get<0>(*it); ++j) {
    if (std::get<2>(*j) != hint) continue;
    int32_t seg_c = blocks_[std::get<3>(*j)].seg;
    if (segs_[seg_c].order > baseline_orders_) return it;
    swap_order(seg_b, seg_c);
    return lst.lower_bound(FreeKey{size, 0, 0, std::numeric_limits<int32_t>::min()});
  }
  return it;
}

void Device::swap_order(int32_t s1, int32_t s2) {
  std::vector<int32_t> listed;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& blk = blocks_[b];
    if (blk.alive && (blk.seg == s1 || blk.seg == s2) && !blk.allocated && !blk.pending) {
      listed.push_back(static_cast<int32_t>(b));
    }
  }
  for (int32_t b : listed) remove_free(b);
  std::swap(segs_[s1].order, segs_[s2].order);
  for (int32_t b : listed) pool(blocks_[b].small).free[blocks_[b].stream].insert(key(b));  // gc_base kept
}

int32_t Device::alloc_found_block(int32_t b, uint64_t size, uint64_t orig_size, int64_t stream, bool split) {
  if (split) {
    int32_t rest = b;
    b = new_block(blocks_[rest].addr, size, stream, blocks_[rest].small, blocks_[rest].seg);
    blocks_[b].prev = blocks_[rest].prev;
    if (blocks_[b].prev >= 0) blocks_[blocks_[b].prev].next = b;
    blocks_[b].next = rest;
    blocks_[rest].prev = b;
    blocks_[rest].addr += size;
    blocks_[rest].size -= size;
    insert_free(rest);
  }
  Block& blk = blocks_[b];
  blk.allocated = true;
  blk.requested = orig_size;
  blk.tag = request;
  allocated += static_cast<int64_t>(blk.size);
  requested_ += static_cast<int64_t>(orig_size);
  active += static_cast<int64_t>(blk.size);
  peak_allocated_ = std::max(peak_allocated_, allocated);
  return b;
}

Handle Device::malloc(uint64_t orig_size, int64_t stream) {
  uint64_t size = round_size(orig_size, config_.roundup_power2_divisions);
  bool small = size <= kSmallSize;
  uint64_t alloc_size = allocation_size(size, config_.large_segment_size);
  int32_t b = get_free_block(small, stream, size);
  if (b < 0) {
    if (gc_active()) garbage_collect();
    b = alloc_block(small, stream, alloc_size, false);
    if (b < 0 && release_available_cached_blocks(small, stream, size)) b = alloc_block(small, stream, alloc_size, false);
    if (b < 0) {  // no capture is underway here (private pools replay in Python)
      release_cached_blocks();
      b = alloc_block(small, stream, alloc_size, true);
    }
    if (b < 0) {
      ++num_ooms;
      if (!force) return Handle{};
      int64_t saved_capacity = capacity, saved_allowed = allowed_;
      capacity = allowed_ = -1;
      b = alloc_block(small, stream, alloc_size, false);
      capacity = saved_capacity;
      allowed_ = saved_allowed;
    }
  }
  b = alloc_found_block(b, size, orig_size, stream, should_split(b, size));
  return Handle{b, blocks_[b].gen};
}

void Device::free(Handle h, bool deferred) {
  Block& blk = blocks_[h.slot];
  blk.allocated = false;
  allocated -= static_cast<int64_t>(blk.size);
  if (deferred) {
    blk.pending = true;
    pending_.push_back(h.slot);
  } else {
    free_block(h.slot);
  }
}

void Device::complete(Handle h) {
  if (!alive(h) || !blocks_[h.slot].pending) return;
  auto it = std::find(pending_.begin(), pending_.end(), h.slot);
  if (it != pending_.end()) pending_.erase(it);  // (a pending block is always listed)
  free_block(h.slot);
}

void Device::free_block(int32_t b) {
  Block& blk = blocks_[b];
  blk.pending = false;
  active -= static_cast<int64_t>(blk.size);
  requested_ -= static_cast<int64_t>(blk.requested);
  blk.requested = 0;
  blk.tag = -1;
  merge(b, blocks_[b].prev);
  merge(b, blocks_[b].next);
  insert_free(b);
}

void Device::merge(int32_t dst, int32_t src) {
  if (src < 0 || blocks_[src].allocated || blocks_[src].pending) return;
  remove_free(src);
  Block& d = blocks_[dst];
  const Block& s = blocks_[src];
  if (d.prev == src) {
    d.addr = s.addr;
    d.prev = s.prev;
    if (d.prev >= 0) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next >= 0) blocks_[d.next].prev = dst;
  }
  d.size += s.size;
  kill(src);
}

void Device::emit(int kind, uint64_t addr, uint64_t size, int64_t stream) {
  SegEvent e{kind, addr, size, stream, request};
  if (trial_events_ != nullptr) {
    trial_events_->push_back(e);
    return;
  }
  ++emitted_;
  checker_->check(e);
}

int32_t Device::alloc_block(bool small, int64_t stream, uint64_t alloc_size, bool retry) {
  if (retry) ++num_alloc_retries_;
  if (allowed_ >= 0 && reserved + static_cast<int64_t>(alloc_size) > allowed_) return -1;
  if (!fits(alloc_size)) return -1;  // cudaMalloc fails
  uint64_t addr = checker_->address(kAllocKind, alloc_size);
  segs_.push_back({stream, small, segs_.size() + 1});
  int32_t b = new_block(addr, alloc_size, stream, small, static_cast<int32_t>(segs_.size() - 1));
  reserved += static_cast<int64_t>(alloc_size);
  ++num_device_alloc_;
  peak_reserved_ = std::max(peak_reserved_, reserved);
  emit(kAllocKind, addr, alloc_size, stream);
  return b;
}

void Device::release_block(int32_t b) {
  emit(kFreeKind, blocks_[b].addr, blocks_[b].size, blocks_[b].stream);
  ++num_device_free_;
  reserved -= static_cast<int64_t>(blocks_[b].size);
  remove_free(b);
  kill(b);
}

bool Device::release_available_cached_blocks(bool small, int64_t stream, uint64_t size) {
  uint64_t max_split = config_.max_split_size;
  if (max_split == UINT64_MAX) return false;
  uint64_t key_size = std::max(size, max_split);
  auto& lst = pool(small).free[stream];
  auto it = lst.lower_bound(FreeKey{key_size, 0, 0, std::numeric_limits<int32_t>::min()});
  if (it == lst.end()) {
    // No single block is large enough: free oversize blocks, largest first.
    uint64_t released = 0;
    while (released < key_size && !lst.empty() && std::get<0>(*lst.rbegin()) >= max_split) {
      int32_t b = std::get<3>(*lst.rbegin());
      released += blocks_[b].size;
      release_block(b);
    }
    return released >= key_size;
  }
  release_block(std::get<3>(*it));
  return true;
}

void Device::release_cached_blocks() {
  std::vector<int32_t> pending;
  pending.swap(pending_);
  for (int32_t b : pending) free_block(b);  // synchronize_and_free_events
  release_blocks(false);
  release_blocks(true);
}

std::vector<int32_t> Device::free_in_order(bool small) const {
  std::vector<int32_t> out;
  for (const auto& [stream, lst] : (small ? small_ : large_).free)
    for (const FreeKey& k : lst) out.push_back(std::get<3>(k));
  return out;
}

void Device::release_blocks(bool small) {
  for (int32_t b : free_in_order(small))
    if (!is_split(b)) release_block(b);
}

void Device::garbage_collect() {
  int64_t threshold =
      static_cast<int64_t>(config_.garbage_collection_threshold * static_cast<double>(std::max<int64_t>(allowed_, 0)));
  if (reserved <= threshold) return;
  ++num_gc_runs_;
  int64_t target = reserved - threshold;
  int64_t calls = large_.calls;
  auto candidates = [&] {
    std::vector<int32_t> out;
    for (int32_t b : free_in_order(false))
      if (!is_split(b)) out.push_back(b);
    return out;
  };
  std::vector<int32_t> blocks = candidates();
  if (blocks.empty()) return;
  int64_t age_sum = 0;
  for (int32_t b : blocks) age_sum += calls - blocks_[b].gc_base;
  double total_age = static_cast<double>(age_sum);
  int64_t count = static_cast<int64_t>(blocks.size());
  int64_t reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && count > 0) {
    double age_threshold = total_age / static_cast<double>(count);
    freed = false;
    for (int32_t b : candidates()) {
      int64_t age = calls - blocks_[b].gc_base;
      if (static_cast<double>(age) >= age_threshold) {
        freed = true;
        reclaimed += static_cast<int64_t>(blocks_[b].size);
        total_age -= static_cast<double>(age);
        --count;
        release_block(b);
      }
    }
  }
}

int64_t Device::largest_free() const {
  uint64_t best = 0;
  for (const Pool* p : {&small_, &large_})
    for (const auto& [stream, lst] : p->free)
      if (!lst.empty()) best = std::max(best, std::get<0>(*lst.rbegin()));
  return static_cast<int64_t>(best);
}

std::vector<SegmentOut> Device::segments() const {
  std::vector<int32_t> live;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (blocks_[b].alive) live.push_back(static_cast<int32_t>(b));
  std::sort(live.begin(), live.end(), [&](int32_t a, int32_t b) { return blocks_[a].addr < blocks_[b].addr; });
  std::vector<SegmentOut> out;
  int32_t last = -1;
  for (int32_t b : live) {
    const Block& blk = blocks_[b];
    bool joins = last >= 0 && blocks_[last].seg == blk.seg && blocks_[last].addr + blocks_[last].size == blk.addr;
    if (!joins) {
      const Segment& seg = segs_[blk.seg];
      out.push_back(SegmentOut{device_, blk.addr, 0, seg.stream, !seg.small, {}});
    }
    int state = blk.allocated ? 0 : (blk.pending ? 1 : 2);
    out.back().size += blk.size;
    out.back().blocks.push_back(BlockOut{blk.addr, blk.size, blk.requested, state, blk.tag});
    last = b;
  }
  return out;
}

std::vector<std::pair<uint64_t, Handle>> Device::pending_blocks() const {
  std::vector<std::pair<uint64_t, Handle>> out;
  for (int32_t b : pending_) out.push_back({blocks_[b].addr, Handle{b, blocks_[b].gen}});
  return out;
}

std::vector<SegEvent> Device::trial(const std::vector<Handle>& ready, uint64_t size, int64_t stream) const {
  Device copy(*this);
  std::vector<SegEvent> events;
  copy.trial_events_ = &events;
  copy.force = false;
  for (Handle h : ready) copy.complete(h);
  copy.malloc(size, stream);
  return events;
}

DeviceResult Device::counters() const {
  DeviceResult r;
  r.device = device_;
  r.num_alloc_retries = num_alloc_retries_;
  r.num_ooms = num_ooms;
  r.num_device_alloc = num_device_alloc_;
  r.num_device_free = num_device_free_;
  r.num_gc_runs = num_gc_runs_;
  r.reserved = reserved;
  r.allocated = allocated;
  r.active = active;
  r.peak_reserved = peak_reserved_;
  r.peak_allocated = peak_allocated_;
  r.emitted = emitted_;
  r.matched = static_cast<int64_t>(checker_->j);
  r.mismatch = checker_->mismatch;
  r.mismatch_position = checker_->position;
  r.mismatch_has_recorded = checker_->has_recorded;
  r.recorded_event = checker_->rec.event;
  r.recorded = SegEvent{checker_->rec.kind, checker_->rec.addr, checker_->rec.size, 0, checker_->rec.event};
  r.simulated = checker_->sim;
  return r;
}

}  // namespace allocscope::replay
