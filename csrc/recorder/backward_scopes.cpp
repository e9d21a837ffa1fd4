#include "backward_scopes.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "clock.h"
#include "format/format.h"
#include "recorder.h"

namespace allocscope::backward_scopes {
namespace {

constexpr uint32_t kLeafBit = uint32_t{1} << 31;
// Autograd numbers the nodes that accumulate into leaves with the largest
// sequence number: they were made by no forward op.
constexpr uint64_t kNoSequence = UINT64_MAX;

// One forward thread's module scope changes in sequence-number space, the
// last kEntries of them: a graph kept across more module calls than that
// loses its scopes (as ops.cpp's table does), never its memory bound. The
// forward thread appends, the engine's threads look up.
constexpr size_t kEntries = size_t{1} << 16;
struct SeqMap {
  std::mutex mu;
  uint64_t generation = 0;
  uint64_t count = 0;  // changes kept since the generation began; entry i at ring[i % kEntries]
  std::vector<std::pair<uint64_t, uint32_t>> ring = std::vector<std::pair<uint64_t, uint32_t>>(kEntries);

  void add(uint64_t generation_now, uint64_t seq, uint32_t innermost) {
    std::lock_guard<std::mutex> lock(mu);
    if (generation != generation_now) generation = generation_now, count = 0;
    if (count > 0 && ring[(count - 1) % kEntries].first == seq) {
      ring[(count - 1) % kEntries].second = innermost;  // no node was made since: the last change wins
      return;
    }
    ring[count % kEntries] = {seq, innermost};
    ++count;
  }

  // The innermost module when the node numbered `seq` was made: the last
  // change at or before it (sequence numbers only grow on a thread).
  uint32_t at(uint64_t generation_now, uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu);
    if (generation != generation_now || count == 0) return 0;
    uint64_t lo = count > kEntries ? count - kEntries : 0, hi = count;  // search [lo, hi)
    if (ring[lo % kEntries].first > seq) return 0;  // made before the oldest change kept
    while (hi - lo > 1) {
      uint64_t mid = lo + (hi - lo) / 2;
      if (ring[mid % kEntries].first <= seq) lo = mid; else hi = mid;
    }
    return ring[lo % kEntries].second;
  }
};

std::atomic<int> g_enabled{0};
std::atomic<uint64_t> g_epoch{0};  // PHASE annotations so far
std::mutex g_maps_mu;
std::unordered_map<uint64_t, SeqMap*> g_maps;  // torch's thread id -> its map (leaked: threads come and go)

SeqMap* map_of(uint64_t thread, bool create) {
  std::lock_guard<std::mutex> lock(g_maps_mu);
  auto it = g_maps.find(thread);
  if (it != g_maps.end()) return it->second;
  if (!create) return nullptr;
  return g_maps[thread] = new SeqMap();
}

// The node an event was made in: the same object at the same address with
// the same number (a freed node's address can be reused by the next).
struct NodeKey {
  const void* node = nullptr;
  uint64_t seq = 0;
  uint64_t thread = 0;
  bool operator==(const NodeKey& o) const { return node == o.node && seq == o.seq && thread == o.thread; }
};

struct Open {
  NodeKey key;
  uint32_t module = 0;  // label + 1, bit 31 leaf; 0: no scope written
  uint64_t epoch = 0;   // of the ENTER: a PHASE since closed it in the analysis
  bool marker = false;  // a nested backward begins here (nested_begin)
};

struct ThreadScopes {
  uint64_t generation = 0;
  SeqMap* own = nullptr;  // this thread's map, as a forward thread
  std::vector<Open> open;
  // The last lookup: a node allocates several times.
  NodeKey cached;
  uint32_t cached_module = 0;
};

ThreadScopes& this_thread() {
  ThreadScopes& s = leaked_per_thread<ThreadScopes>();
  uint64_t generation = Recorder::get().generation();
  if (s.generation != generation) {
    s.generation = generation;
    s.open.clear();
    s.cached = NodeKey{};
  }
  return s;
}

void emit(EmitScope& scope, uint8_t kind, uint32_t module) {
  RawEvent ev;
  ev.kind = kind;
  ev.arg = (module & ~kLeafBit) - 1;
  ev.addr = format::kModuleBackward | ((module & kLeafBit) ? format::kModuleLeaf : 0);
  scope.push(ev);
}

void close(EmitScope& scope, const Open& o) {
  // A PHASE since the ENTER closed it in the analysis; an EXIT now could
  // close another open scope of the same module.
  if (o.module != 0 && o.epoch == g_epoch.load(std::memory_order_relaxed)) emit(scope, format::kModuleExit, o.module);
}

uint32_t module_of(ThreadScopes& t, const NodeKey& key) {
  if (key == t.cached) return t.cached_module;
  uint32_t module = 0;
  if (key.seq != kNoSequence) {
    SeqMap* map = map_of(key.thread, false);
    if (map != nullptr) module = map->at(t.generation, key.seq);
  }
  t.cached = key;
  t.cached_module = module;
  return module;
}

// Closes the scopes above the innermost nested backward's marker (all of
// them when there is none); with `marker`, that marker too.
void close_top(EmitScope& scope, ThreadScopes& t, bool marker) {
  while (!t.open.empty()) {
    Open o = t.open.back();
    t.open.pop_back();
    if (o.marker) {
      if (!marker) t.open.push_back(o);
      return;
    }
    close(scope, o);
  }
}

}  // namespace

void enable() {
  g_enabled.fetch_add(1, std::memory_order_relaxed);
}

void disable() {
  if (g_enabled.load(std::memory_order_relaxed) > 0) g_enabled.fetch_sub(1, std::memory_order_relaxed);
}

bool active() {
  return g_enabled.load(std::memory_order_relaxed) > 0;
}

void forward_changed(uint32_t innermost) {
  if (!active()) return;
  ThreadScopes& t = this_thread();
  // In a node (a checkpoint's recompute in backward), the op callback keeps
  // no module for the nodes made: neither does this.
  if (torch::autograd::get_current_node()) innermost = 0;
  if (t.own == nullptr) t.own = map_of(at::RecordFunction::currentThreadId(), true);
  t.own->add(t.generation, at::sequence_number::peek(), innermost);
}

void phase_changed() {
  g_epoch.fetch_add(1, std::memory_order_relaxed);
}

void sync(EmitScope& scope) {
  if (!active()) return;
  ThreadScopes& t = this_thread();
  auto node = torch::autograd::get_current_node();
  if (!node) {
    if (!t.open.empty()) {
      while (!t.open.empty()) close_top(scope, t, true);
    }
    return;
  }
  NodeKey key{node.get(), node->sequence_nr(), node->thread_id()};
  if (!t.open.empty() && !t.open.back().marker && t.open.back().key == key) return;
  if (!t.open.empty() && !t.open.back().marker) {
    close(scope, t.open.back());
    t.open.pop_back();
  }
  Open o;
  o.key = key;
  o.module = module_of(t, key);
  o.epoch = g_epoch.load(std::memory_order_relaxed);
  t.open.push_back(o);
  if (o.module != 0) emit(scope, format::kModuleEnter, o.module);
}

bool nested_begin() {
  if (!active() || !torch::autograd::get_current_node()) return false;
  EmitScope scope;
  if (!scope) return false;
  sync(scope);  // the running node's scope, as the op callback opened it when the node began
  Open marker;
  marker.marker = true;
  this_thread().open.push_back(marker);
  return true;
}

void nested_end() {
  if (!active()) return;
  EmitScope scope;
  if (!scope) return;
  close_top(scope, this_thread(), true);
}

}  // namespace allocscope::backward_scopes
