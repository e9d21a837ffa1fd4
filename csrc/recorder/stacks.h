// Interning Python stacks: each distinct stack is stored once, as a path in
// the stack tree, and events carry its node id.
//
// Hot path: walk the thread's frames without the GIL (pystack.h); the same
// frames as the thread's last capture give its node; else hash the
// (code, instruction) pairs and look them up. Only a stack never seen before
// takes the GIL, to symbolize its new frames into (file, function, line) and
// to hold a reference to their code objects (so that a code address cannot be
// reused by another code object while it is a key here).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pystack.h"
#include "tables.h"

namespace allocscope {

class StackInterner {
 public:
  static constexpr int kMaxDepth = 128;  // innermost frames kept

  explicit StackInterner(InternTables* tables) : tables_(tables) {}

  // Requires the GIL. Chooses the walker (running its self-check on the
  // caller's stack) and clears the previous recording's state.
  void reset(std::string* walker_description);

  // Any thread, any time, no lock held by the caller except possibly the GIL.
  // Returns the stack node id; 0 for no Python frames.
  uint32_t capture();

  // Requires the GIL; no capture() may run concurrently (recording stopped).
  void release();

  uint64_t misses() const { return misses_; }
  uint64_t overflows() const { return overflows_; }

 private:
  struct Slot {
    uint64_t hash = 0;  // 0 = empty
    uint32_t node = 0;
    uint32_t depth = 0;
    size_t key = 0;  // offset into keys_
  };
  struct FrameKeyHash {
    size_t operator()(const std::pair<const void*, int32_t>& k) const {
      return reinterpret_cast<uintptr_t>(k.first) * 0x9E3779B97F4A7C15ull ^ static_cast<uint32_t>(k.second);
    }
  };

  // Require tables_->mu.
  bool lookup(uint64_t hash, const pystack::RawFrame* frames, int depth, uint32_t* node) const;
  void insert(uint64_t hash, const pystack::RawFrame* frames, int depth, uint32_t node);
  uint32_t miss(uint64_t hash, const pystack::RawFrame* frames, int depth);
  // The node of these frames: looked up, else interned (miss).
  uint32_t intern(const pystack::RawFrame* frames, int depth);

  InternTables* tables_;
  pystack::Walker walker_ = pystack::Walker::kGil;
  std::vector<Slot> slots_;  // open addressing, power-of-two size
  size_t used_ = 0;
  std::vector<pystack::RawFrame> keys_;
  std::unordered_map<std::pair<const void*, int32_t>, uint32_t, FrameKeyHash> frame_ids_;
  std::unordered_set<const void*> code_refs_;  // codes we hold a reference to
  uint64_t misses_ = 0;
  uint64_t overflows_ = 0;
  // Bumped whenever the table is cleared: a thread's last capture (stacks.cpp)
  // stands only for the epoch it was made in.
  std::atomic<uint64_t> epoch_{1};
};

}  // namespace allocscope
