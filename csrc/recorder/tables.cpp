#include "tables.h"

#include "clock.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <string_view>

namespace allocscope {

void* InternTables::Pages::do_allocate(size_t bytes, size_t alignment) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;  // page-aligned
}

void InternTables::Pages::do_deallocate(void* p, size_t bytes, size_t alignment) { munmap(p, bytes); }

uint32_t InternTables::intern_string(const std::string& s) {
  auto it = string_ids_.find(std::string_view(s));
  if (it != string_ids_.end()) return it->second;
  if (strings.size() >= strings.kCapacity) return kFull;
  char* chars = static_cast<char*>(arena_.allocate(s.size() + 1, 1));
  std::memcpy(chars, s.data(), s.size());
  chars[s.size()] = '\0';
  std::string_view stored(chars, s.size());
  size_t id = strings.push_back(stored);
  string_ids_.emplace(stored, static_cast<uint32_t>(id));
  return static_cast<uint32_t>(id);
}

uint32_t InternTables::intern_frame(const FrameEntry& f) {
  auto it = frame_ids_.find(f);
  if (it != frame_ids_.end()) return it->second;
  size_t id = frames.push_back(f);
  if (id == frames.kCapacity) return kFull;
  frame_ids_.emplace(f, static_cast<uint32_t>(id));
  return static_cast<uint32_t>(id);
}

uint32_t InternTables::intern_node(uint32_t parent, uint32_t frame) {
  uint64_t key = (uint64_t{parent} << 32) | frame;
  auto it = node_ids_.find(key);
  if (it != node_ids_.end()) return it->second;
  size_t id = nodes.push_back(StackNode{parent, frame});
  if (id == nodes.kCapacity) return kFull;
  node_ids_.emplace(key, static_cast<uint32_t>(id));
  return static_cast<uint32_t>(id);
}

void InternTables::clear() {
  strings.clear();
  frames.clear();
  nodes.clear();
  // The maps' memory is the arena's: swap in fresh maps (an empty map
  // allocates nothing) before the arena lets it go.
  decltype(string_ids_)(&arena_).swap(string_ids_);
  decltype(frame_ids_)(&arena_).swap(frame_ids_);
  decltype(node_ids_)(&arena_).swap(node_ids_);
  arena_.release();
  nodes.push_back(StackNode{0, 0});  // the root: the empty stack
}

ThreadTable::ThreadTable() {
  clear();
}

void ThreadTable::clear() {
  for (auto& e : entries_) {
    e.busy.store(0);
    e.tid = 0;
    std::memset(e.name, 0, sizeof(e.name));
  }
  std::snprintf(entries_[0].name, sizeof(entries_[0].name), "%s", "<other threads>");
  size_.store(1);
}

namespace {
// The calling thread's cached entry; trivially destructible on purpose: frees
// may run during thread or interpreter teardown.
struct ThreadCache {
  uint64_t generation;
  ThreadEntry* entry;
  uint16_t index;
};
ALLOCSCOPE_TLS ThreadCache tl_thread = {0, nullptr, 0};
}  // namespace

ThreadEntry* ThreadTable::current(uint64_t generation, uint16_t* index) {
  if (tl_thread.generation == generation) {
    *index = tl_thread.index;
    return tl_thread.entry;
  }
  uint16_t i = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t n = size_.load();
    if (n < kMax) {
      ThreadEntry& e = entries_[n];
      e.tid = static_cast<uint64_t>(syscall(SYS_gettid));
      pthread_getname_np(pthread_self(), e.name, sizeof(e.name));
      i = static_cast<uint16_t>(n);
      size_.store(n + 1);  // seq_cst: see Recorder::stop
    }
  }
  tl_thread = ThreadCache{generation, &entries_[i], i};
  *index = i;
  return &entries_[i];
}

StreamTable::StreamTable() {
  clear();
}

void StreamTable::clear() {
  entries_[0] = StreamEntry{-2, 0};  // no device
  entries_[1] = StreamEntry{-1, 0};  // the CPU
  size_.store(2, std::memory_order_release);
}

namespace {
struct StreamCache {
  uint64_t generation;
  int32_t device;
  uint64_t handle;
  uint16_t index;
};
ALLOCSCOPE_TLS StreamCache tl_stream = {0, 0, 0, 0};
}  // namespace

uint16_t StreamTable::index(uint64_t generation, int32_t device, uint64_t handle) {
  if (tl_stream.generation == generation && tl_stream.device == device && tl_stream.handle == handle) {
    return tl_stream.index;
  }
  uint16_t found = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t n = size_.load(std::memory_order_relaxed);
    bool hit = false;
    // Processes use a handful of streams: a scan is cheaper than hashing.
    for (uint32_t i = 2; i < n; ++i) {
      if (entries_[i].device == device && entries_[i].handle == handle) {
        found = static_cast<uint16_t>(i);
        hit = true;
        break;
      }
    }
    if (!hit && n < kMax) {
      entries_[n] = StreamEntry{device, handle};
      found = static_cast<uint16_t>(n);
      size_.store(n + 1, std::memory_order_release);
    }
  }
  tl_stream = StreamCache{generation, device, handle, found};
  return found;
}

}  // namespace allocscope
