// The side tables a capture refers to by small ids: strings, frames, stack
// tree nodes, threads and streams.
//
// Producers add entries (rarely: a new stack, a new thread); the writer thread
// reads the entries added since its last pass and writes them before the
// events that use them. Entries never move and are published with a release
// store of the size, so the writer reads them without a lock. An event can only
// name an entry that was published before the event was pushed, and the writer
// drains events before it reads table sizes, so a table entry always precedes
// its first use in the file. Tables also name each other (nodes name frames,
// frames name strings): see Writer::write_tables for the order of reading.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace allocscope {

// Append-only array with lock-free readers of [0, size()). One appender at a
// time (callers serialize appends with their own mutex).
template <typename T, size_t kBlockBits = 10, size_t kMaxBlocks = 4096>
class AppendOnly {
 public:
  static constexpr size_t kBlockSize = size_t{1} << kBlockBits;
  static constexpr size_t kCapacity = kBlockSize * kMaxBlocks;

  AppendOnly() = default;
  AppendOnly(const AppendOnly&) = delete;
  AppendOnly& operator=(const AppendOnly&) = delete;
  ~AppendOnly() { clear(); }

  size_t size() const { return size_.load(std::memory_order_acquire); }
  const T& operator[](size_t i) const { return blocks_[i >> kBlockBits][i & (kBlockSize - 1)]; }

  // Returns the new entry's index, or kCapacity when full.
  size_t push_back(T value) {
    size_t i = size_.load(std::memory_order_relaxed);
    if (i >= kCapacity) return kCapacity;
    T*& block = blocks_[i >> kBlockBits];
    if (block == nullptr) block = new T[kBlockSize];
    block[i & (kBlockSize - 1)] = std::move(value);
    size_.store(i + 1, std::memory_order_release);
    return i;
  }

  // Only while nobody reads or appends (between recordings).
  void clear() {
    for (T*& block : blocks_) {
      delete[] block;
      block = nullptr;
    }
    size_.store(0, std::memory_order_release);
  }

 private:
  std::array<T*, kMaxBlocks> blocks_{};
  std::atomic<size_t> size_{0};
};

struct FrameEntry {
  uint32_t filename = 0;  // string id
  uint32_t function = 0;  // string id
  int32_t line = 0;
  bool operator==(const FrameEntry& o) const {
    return filename == o.filename && function == o.function && line == o.line;
  }
};

struct FrameEntryHash {
  size_t operator()(const FrameEntry& f) const {
    uint64_t h = (uint64_t{f.filename} << 32) ^ f.function;
    return static_cast<size_t>(h * 0x9E3779B97F4A7C15ull ^ static_cast<uint32_t>(f.line));
  }
};

// Node of the stack tree: a stack is the path from a node to the root. Node 0
// is the root (the empty stack); its fields are unused.
struct StackNode {
  uint32_t parent = 0;
  uint32_t frame = 0;
};

// Strings, frames and stack nodes, interned under one mutex. Lock order:
// the GIL (if taken at all) before mu; never call into Python or an allocator
// lock while holding mu.
class InternTables {
 public:
  static constexpr uint32_t kFull = UINT32_MAX;

  std::mutex mu;

  // All require mu. Return kFull when a table is full.
  uint32_t intern_string(const std::string& s);
  uint32_t intern_frame(const FrameEntry& f);
  uint32_t intern_node(uint32_t parent, uint32_t frame);

  void clear();  // between recordings; adds the root node

  AppendOnly<std::string_view> strings;  // characters in arena_
  AppendOnly<FrameEntry> frames;
  AppendOnly<StackNode> nodes;

 private:
  // Pages from mmap, never from the malloc heap: the tables grow by a few
  // bytes whenever a new string appears (a mark per step with the step's
  // number), and such small blocks, left among the blocks a training step
  // mallocs and frees, kept glibc from reusing or returning that memory: the
  // process grew by the step's working set every step (33 MiB per 1000 steps
  // in benchmarks/bench_long_run.py before; all of it free memory that
  // malloc_trim gave back).
  class Pages : public std::pmr::memory_resource {
    void* do_allocate(size_t bytes, size_t alignment) override;
    void do_deallocate(void* p, size_t bytes, size_t alignment) override;
    bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
  };
  Pages pages_;
  std::pmr::monotonic_buffer_resource arena_{size_t{1} << 20, &pages_};
  std::pmr::unordered_map<std::string_view, uint32_t> string_ids_{&arena_};
  std::pmr::unordered_map<FrameEntry, uint32_t, FrameEntryHash> frame_ids_{&arena_};
  std::pmr::unordered_map<uint64_t, uint32_t> node_ids_{&arena_};  // packed (parent, frame)
};

// Threads and streams are registered from inside allocator trace callbacks,
// which run under the allocator lock: these tables never allocate and use
// their own short mutexes.
struct ThreadEntry {
  // Nonzero while the thread is inside the recorder; stop() waits for zero.
  std::atomic<int32_t> busy{0};
  uint64_t tid = 0;
  char name[16] = {};
};

class ThreadTable {
 public:
  static constexpr uint32_t kMax = 4096;
  ThreadTable();
  // The calling thread's entry for this recording generation.
  ThreadEntry* current(uint64_t generation, uint16_t* index);
  ThreadEntry& entry(uint32_t i) { return entries_[i]; }
  uint32_t size() const { return size_.load(std::memory_order_seq_cst); }
  void clear();

 private:
  std::mutex mu_;
  std::array<ThreadEntry, kMax> entries_;
  std::atomic<uint32_t> size_{1};  // entry 0: threads beyond kMax
};

struct StreamEntry {
  int32_t device = -1;
  uint64_t handle = 0;
};

class StreamTable {
 public:
  static constexpr uint32_t kMax = 4096;
  StreamTable();
  uint16_t index(uint64_t generation, int32_t device, uint64_t handle);
  const StreamEntry& operator[](uint32_t i) const { return entries_[i]; }
  uint32_t size() const { return size_.load(std::memory_order_acquire); }
  void clear();

 private:
  std::mutex mu_;
  std::array<StreamEntry, kMax> entries_;
  std::atomic<uint32_t> size_{0};
};

}  // namespace allocscope
