// The replay's driver (replay.h): python/allocscope/allocator/replay.py's
// _Run.replay and its helpers, in the same order of steps.
#include "replay.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <unordered_map>

#include "format/format.h"
#include "model.h"

namespace allocscope::replay {

namespace {

struct Held {
  int device;  // index into Run::devs
  Handle block;
};

double recorded_fraction(uint64_t arg, uint64_t bits) {
  if (bits == 0) return static_cast<double>(arg) / 1e9;
  double f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

class Run {
 public:
  Run(const Config& config, bool faithful, uint64_t synthetic_start, const std::vector<DeviceSetup>& setups,
      const Events& ev, const std::vector<int64_t>& stream_device, const std::vector<int64_t>& stream_handle)
      : faithful_(faithful), ev_(ev), stream_device_(stream_device), stream_handle_(stream_handle) {
    synthetic_.next = synthetic_start;
    for (size_t i = 0; i < ev.n; ++i) {
      int k = ev.kind[i];
      if (k >= format::kSegmentAlloc && k <= format::kSegmentUnmap)
        recorded_[device_of(ev.stream[i])].push_back(Recorded{static_cast<int64_t>(i), k, ev.addr[i], ev.size[i]});
    }
    for (const DeviceSetup& s : setups) {
      auto checker = std::make_unique<Checker>();
      auto found = recorded_.find(s.device);
      if (found != recorded_.end()) checker->recorded = found->second;
      checker->enabled = faithful;
      checker->synthetic = &synthetic_;
      index_[s.device] = static_cast<int>(devs_.size());
      devs_.push_back(std::make_unique<Device>(config, s, checker.get()));
      checkers_.push_back(std::move(checker));
    }
    for (size_t d = 0; d < devs_.size(); ++d) {
      for (const auto& [addr, h] : devs_[d]->loaded_live()) live_[addr] = Held{static_cast<int>(d), h};
      for (const auto& [addr, h] : devs_[d]->pending_blocks()) pending_[addr] = Held{static_cast<int>(d), h};
    }
    stream_index_.resize(stream_device.size(), -1);
    for (size_t s = 0; s < stream_device.size(); ++s) {
      auto found = index_.find(stream_device[s]);
      if (stream_device[s] >= 0 && found != index_.end()) stream_index_[s] = found->second;
    }
  }

  Result run(const std::vector<int64_t>& targets, int64_t stop_after) {
    Result r;
    const size_t n = ev_.n;
    r.reserved.resize(n + 1);
    r.allocated.resize(n + 1);
    r.active.resize(n + 1);
    r.largest_free.resize(n + 1);
    block_sizes_.assign(n, 0);
    size_t t = 0;
    while (t < targets.size() && targets[t] < 0) r.states.push_back({targets[t++], snapshot()});
    int64_t until = std::min(static_cast<int64_t>(n) - 1, stop_after);
    cur_ = totals();
    store(r, 0);
    for (size_t i = 0; i < n; ++i) {
      int k = ev_.kind[i];
      if (static_cast<int64_t>(i) <= until && is_request(k)) {
        while (t < targets.size() && targets[t] < static_cast<int64_t>(i)) r.states.push_back({targets[t++], snapshot()});
        int64_t e = static_cast<int64_t>(i);
        if (k == format::kFreeCompleted) {
          // c10 completes deferred frees inside the next malloc.
          ready_.push_back({e, ev_.addr[i]});
        } else {
          uint64_t size = ev_.size[i];
          if (!ready_.empty()) process_events(e, k, ev_.addr[i], k == format::kOom && !size ? ev_.block[i] : size,
                                              ev_.stream[i]);
          if (!request(e, k, i)) ++unknown_frees_;
          complete(e, ready_);
        }
        cur_ = totals();
      }
      store(r, i + 1);
    }
    complete(static_cast<int64_t>(n), ready_);
    while (t < targets.size() && targets[t] <= until) r.states.push_back({targets[t++], snapshot()});
    r.block_sizes = std::move(block_sizes_);
    r.ooms = std::move(ooms_);
    r.avoided_ooms = std::move(avoided_);
    for (const auto& d : devs_) r.devices.push_back(d->counters());
    r.final_state = snapshot();
    r.allocations = allocations_;
    r.address_mismatches = address_mismatches_;
    r.unknown_frees = unknown_frees_;
    return r;
  }

 private:
  struct Totals {
    int64_t reserved = 0, allocated = 0, active = 0, largest = 0;
  };

  static bool is_request(int k) {
    switch (k) {
      case format::kAlloc:
      case format::kFree:
      case format::kFreeCompleted:
      case format::kOom:
      case format::kEmptyCache:
      case format::kSetFraction:
        return true;
      case format::kPoolBegin:
      case format::kPoolEnd:
      case format::kPoolRelease:
      case format::kPoolAlloc:
        throw std::invalid_argument("native replay: private pools replay in Python");
      default:
        return false;
    }
  }

  int64_t device_of(uint16_t stream) const {
    return stream < stream_device_.size() ? stream_device_[stream] : -2;
  }
  int64_t handle_of(uint16_t stream) const { return stream < stream_handle_.size() ? stream_handle_[stream] : 0; }
  Device* device_at(uint16_t stream) {
    int d = stream < stream_index_.size() ? stream_index_[stream] : -1;
    return d >= 0 ? devs_[d].get() : nullptr;
  }

  void store(Result& r, size_t p) const {
    r.reserved[p] = cur_.reserved;
    r.allocated[p] = cur_.allocated;
    r.active[p] = cur_.active;
    r.largest_free[p] = cur_.largest;
  }

  Totals totals() const {
    Totals out;
    for (const auto& d : devs_) {
      out.reserved += d->reserved;
      out.allocated += d->allocated;
      out.active += d->active;
      out.largest = std::max(out.largest, d->largest_free());
    }
    return out;
  }

  std::vector<SegmentOut> snapshot() const {
    std::vector<int> order(devs_.size());
    for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int>(d);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return devs_[a]->device() < devs_[b]->device(); });
    std::vector<SegmentOut> out;
    for (int d : order) {
      std::vector<SegmentOut> s = devs_[d]->segments();
      std::move(s.begin(), s.end(), std::back_inserter(out));
    }
    return out;
  }

  bool request(int64_t e, int k, size_t i) {
    uint16_t st = ev_.stream[i];
    switch (k) {
      case format::kAlloc:
        alloc(e, ev_.addr[i], ev_.size[i], st);
        return true;
      case format::kFree:
        return free(e, ev_.addr[i], ev_.deferred[i] != 0);
      case format::kOom:
        oom(e, ev_.size[i] ? ev_.size[i] : ev_.block[i], st);
        return true;
      case format::kEmptyCache:
        // A private pool's own empty_cache is not modelled; size 1: the call
        // released nothing (docs/format.md), which with other settings (a
        // what-if) it might have.
        if (ev_.arg[i] == 0 && ev_.block[i] == 0 && (ev_.size[i] != 1 || !faithful_)) {
          for (auto& d : devs_) {
            d->request = e;
            d->empty_cache();
          }
        }
        return true;
      case format::kSetFraction:
        if (Device* d = device_at(st)) d->set_fraction(recorded_fraction(ev_.arg[i], ev_.block[i]));
        return true;
    }
    return true;
  }

  void complete(int64_t e, std::vector<std::pair<int64_t, uint64_t>>& ready) {
    for (const auto& [event, addr] : ready) {
      auto held = pending_.find(addr);
      if (held == pending_.end()) continue;
      Held h = held->second;
      pending_.erase(held);
      devs_[h.device]->request = e;
      devs_[h.device]->complete(h.block);
    }
    ready.clear();
  }

  // replay.py's _process_events: which recorded completions c10 found
  // complete when request e began (its docstring says how they are told).
  void process_events(int64_t e, int k, uint64_t addr, uint64_t size, uint16_t st) {
    if (k != format::kAlloc && k != format::kOom) {
      complete(e, ready_);
      return;
    }
    int64_t d = device_of(st);
    const std::vector<Recorded>* mine = nullptr;
    auto found = recorded_.find(d);
    if (found != recorded_.end()) mine = &found->second;
    int64_t first = e;
    std::vector<Recorded>::const_iterator from;  // mine's first event at or after the oldest completion
    if (mine != nullptr) {
      from = std::lower_bound(mine->begin(), mine->end(), ready_.front().first,
                              [](const Recorded& r, int64_t v) { return r.event < v; });
      if (from != mine->end() && from->event < e) first = from->event;
    }
    std::vector<std::pair<int64_t, uint64_t>> early;
    for (const auto& r : ready_)
      if (r.first < first) early.push_back(r);
    Device* dev = device_at(st);
    if (!early.empty() && dev != nullptr && (k == format::kOom || first < e)) {
      std::vector<Handle> blocks;
      int di = stream_index_[st];
      for (const auto& [event, a] : early) {
        auto held = pending_.find(a);
        if (held != pending_.end() && held->second.device == di) blocks.push_back(held->second.block);
      }
      std::vector<SegEvent> made;
      if (!blocks.empty()) made = dev->trial(blocks, size, handle_of(st));
      std::vector<std::tuple<int, uint64_t, uint64_t>> recorded;
      if (mine != nullptr)
        for (auto r = from; r != mine->end() && r->event < e; ++r)
          recorded.push_back({r->kind, r->kind != format::kSegmentAlloc ? r->addr : 0, r->size});
      std::vector<std::tuple<int, uint64_t, uint64_t>> simulated;
      for (const SegEvent& s : made) simulated.push_back({s.kind, s.kind != format::kSegmentAlloc ? s.addr : 0, s.size});
      if (simulated != recorded) early.clear();
    }
    complete(e, early);
    std::vector<std::pair<int64_t, uint64_t>> later;
    for (const auto& r : ready_)
      if (r.first >= first) later.push_back(r);
    ready_.swap(later);
  }

  void alloc(int64_t e, uint64_t addr, uint64_t size, uint16_t st) {
    Device* dev = device_at(st);
    if (dev == nullptr) return;
    auto held = live_.find(addr);
    if (held != live_.end()) {
      Device* owner = devs_[held->second.device].get();
      if (owner->alive(held->second.block) && owner->from_baseline(held->second.block))
        return;  // the start snapshot already holds it (docs/format.md, BASELINE)
    }
    dev->request = e;
    dev->force = true;
    dev->has_hint = faithful_;
    dev->hint = addr;
    int64_t before = dev->num_ooms;
    Handle b = dev->malloc(size, handle_of(st));
    dev->force = false;
    dev->has_hint = false;
    if (dev->num_ooms > before) ooms_.push_back(oom_record(*dev, e, size, handle_of(st), false));
    live_[addr] = Held{stream_index_[st], b};
    block_sizes_[e] = static_cast<int64_t>(dev->block_size(b));
    ++allocations_;
    if (faithful_ && dev->block_addr(b) != addr) ++address_mismatches_;
  }

  bool free(int64_t e, uint64_t addr, bool deferred) {
    auto held = live_.find(addr);
    if (held == live_.end()) return false;
    Held h = held->second;
    live_.erase(held);
    Device* dev = devs_[h.device].get();
    dev->request = e;
    dev->free(h.block, deferred);
    if (deferred) pending_[addr] = h;
    return true;
  }

  void oom(int64_t e, uint64_t want, uint16_t st) {
    Device* dev = device_at(st);
    if (dev == nullptr) return;
    dev->request = e;
    Handle b = dev->malloc(want, handle_of(st));
    if (b.slot < 0) {
      ooms_.push_back(oom_record(*dev, e, want, handle_of(st), true));
    } else {
      avoided_.push_back(e);
      dev->free(b, false);
    }
  }

  Oom oom_record(const Device& dev, int64_t e, uint64_t size, int64_t stream, bool recorded) const {
    Oom o{e, dev.device(), size, round_size(size, dev.config().roundup_power2_divisions), stream, recorded, dev.reserved, dev.allocated, dev.active,
          dev.capacity, dev.allowed_, {}};
    // Keep the allocator's state for the first few failures only.
    if (ooms_.size() < 3) o.segments = dev.segments();
    return o;
  }

  bool faithful_;
  const Events& ev_;
  const std::vector<int64_t>& stream_device_;
  const std::vector<int64_t>& stream_handle_;
  std::vector<int> stream_index_;  // stream -> index into devs_ (-1: none)
  BumpAddresses synthetic_;
  std::map<int64_t, std::vector<Recorded>> recorded_;  // device -> its recorded segment events
  std::vector<std::unique_ptr<Checker>> checkers_;
  std::vector<std::unique_ptr<Device>> devs_;
  std::map<int64_t, int> index_;
  std::unordered_map<uint64_t, Held> live_, pending_;
  std::vector<std::pair<int64_t, uint64_t>> ready_;  // FREE_COMPLETED (event, address) awaiting the next request
  std::vector<int64_t> block_sizes_;
  std::vector<Oom> ooms_;
  std::vector<int64_t> avoided_;
  Totals cur_;
  int64_t allocations_ = 0, address_mismatches_ = 0, unknown_frees_ = 0;
};

}  // namespace

Result run(const Config& config, bool faithful, uint64_t synthetic_start, const std::vector<DeviceSetup>& devices,
           const Events& events, const std::vector<int64_t>& stream_device,
           const std::vector<int64_t>& stream_handle, const std::vector<int64_t>& states_at, int64_t stop_after) {
  Run run(config, faithful, synthetic_start, devices, events, stream_device, stream_handle);
  return run.run(states_at, stop_after);
}

}  // namespace allocscope::replay
