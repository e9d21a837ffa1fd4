#include "stacks.h"

#include <algorithm>
#include <utility>

#include "clock.h"


namespace allocscope {
namespace {

constexpr size_t kMaxSlots = size_t{1} << 22;

uint64_t hash_frames(const pystack::RawFrame* frames, int depth) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(depth);
  for (int i = 0; i < depth; ++i) {
    uint64_t x = reinterpret_cast<uintptr_t>(frames[i].code) ^ (uint64_t(uint32_t(frames[i].instr)) << 40);
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    h = (h ^ x) * 0xC4CEB9FE1A85EC53ull;
  }
  h ^= h >> 29;
  return h == 0 ? 1 : h;  // 0 marks an empty slot
}

bool same_frames(const pystack::RawFrame* a, const pystack::RawFrame* b, int depth) {
  for (int i = 0; i < depth; ++i) {
    if (a[i].code != b[i].code || a[i].instr != b[i].instr) return false;
  }
  return true;
}

// The calling thread's last stack: consecutive captures often see the same
// frames (the ops of one Python line, the allocations of one op), and then
// its node is known without the hash, the tables' mutex and the lookup.
// A capture walks into `spare` and, where it names a node, swaps it with
// `frames` (no copy); a capture that starts while another runs on this thread
// (`busy`: reentered from what miss() calls) walks into its own array.
struct LastCapture {
  const void* owner = nullptr;
  uint64_t epoch = 0;
  int depth = 0;
  uint32_t node = 0;
  bool busy = false;
  pystack::RawFrame* frames = buffers[0];
  pystack::RawFrame* spare = buffers[1];
  pystack::RawFrame buffers[2][StackInterner::kMaxDepth];
};

// Per thread (clock.h's leaked_per_thread: the frames would take 4 KiB of
// the static TLS space glibc keeps for libraries loaded later).
LastCapture& last_capture() {
  return leaked_per_thread<LastCapture>();
}

}  // namespace

void StackInterner::reset(std::string* walker_description) {
  walker_ = pystack::choose_walker(walker_description);
  std::lock_guard<std::mutex> lock(tables_->mu);
  slots_.assign(1024, Slot{});
  used_ = 0;
  keys_.clear();
  frame_ids_.clear();
  epoch_.fetch_add(1);
  misses_ = 0;
  overflows_ = 0;
}

bool StackInterner::lookup(uint64_t hash, const pystack::RawFrame* frames, int depth, uint32_t* node) const {
  size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return false;
    if (s.hash == hash && s.depth == uint32_t(depth) && same_frames(&keys_[s.key], frames, depth)) {
      *node = s.node;
      return true;
    }
  }
}

void StackInterner::insert(uint64_t hash, const pystack::RawFrame* frames, int depth, uint32_t node) {
  if ((used_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{});
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.hash == 0) continue;
      size_t i = s.hash & mask;
      while (slots_[i].hash != 0) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  slots_[i] = Slot{hash, node, uint32_t(depth), keys_.size()};
  keys_.insert(keys_.end(), frames, frames + depth);
  ++used_;
}

uint32_t StackInterner::capture() {
  LastCapture& last = last_capture();
  if (last.busy) {
    pystack::RawFrame frames[kMaxDepth];
    int depth = pystack::walk(walker_, frames, kMaxDepth);
    return depth == 0 ? 0u : intern(frames, depth);
  }
  struct Busy {
    bool& flag;
    explicit Busy(bool& f) : flag(f) { flag = true; }
    ~Busy() { flag = false; }
  } busy(last.busy);
  pystack::RawFrame* frames = last.spare;
  int depth = pystack::walk(walker_, frames, kMaxDepth);
  uint32_t node = 0;
  uint64_t epoch = epoch_.load(std::memory_order_acquire);
  if (depth == 0) {
    // (no Python frames)
  } else if (last.owner == this && last.epoch == epoch && last.depth == depth &&
             same_frames(last.frames, frames, depth)) {
    node = last.node;
  } else {
    node = intern(frames, depth);
    if (node != 0) {
      last.owner = this;
      last.epoch = epoch;
      last.depth = depth;
      last.node = node;
      std::swap(last.frames, last.spare);
    }
  }
  return node;
}

uint32_t StackInterner::intern(const pystack::RawFrame* frames, int depth) {
  uint64_t hash = hash_frames(frames, depth);
  uint32_t node = 0;
  bool found;
  {
    std::lock_guard<std::mutex> lock(tables_->mu);
    found = lookup(hash, frames, depth, &node);
  }
  return found ? node : miss(hash, frames, depth);
}

uint32_t StackInterner::miss(uint64_t hash, const pystack::RawFrame* frames, int depth) {
  // Symbolizing needs the GIL. Never wait for it while holding tables_->mu: a
  // thread that holds the GIL may be waiting for mu in capture().
  if (!pystack::can_take_gil()) return 0u;
  pystack::GilGuard gil;
  // Inserters all hold the GIL, so from here no other thread inserts; readers
  // may still look up under mu.
  std::vector<pystack::Symbol> symbols(depth);
  std::vector<bool> known(depth);
  {
    std::lock_guard<std::mutex> lock(tables_->mu);
    uint32_t node = 0;
    if (lookup(hash, frames, depth, &node)) return node;
    for (int i = 0; i < depth; ++i) known[i] = frame_ids_.count({frames[i].code, frames[i].instr}) != 0;
  }
  for (int i = 0; i < depth; ++i) {
    if (!known[i]) symbols[i] = pystack::symbolize(frames[i], walker_);
  }
  std::lock_guard<std::mutex> lock(tables_->mu);
  ++misses_;
  if (slots_.size() >= kMaxSlots && (used_ + 1) * 2 > slots_.size()) {
    ++overflows_;
    return 0u;
  }
  uint32_t node = 0;  // build the path from the outermost frame inwards
  for (int i = depth - 1; i >= 0; --i) {
    std::pair<const void*, int32_t> key{frames[i].code, frames[i].instr};
    auto it = frame_ids_.find(key);
    uint32_t frame_id;
    if (it != frame_ids_.end()) {
      frame_id = it->second;
    } else {
      FrameEntry entry;
      entry.filename = tables_->intern_string(symbols[i].filename);
      entry.function = tables_->intern_string(symbols[i].function);
      entry.line = symbols[i].line;
      frame_id = (entry.filename == InternTables::kFull || entry.function == InternTables::kFull)
          ? InternTables::kFull
          : tables_->intern_frame(entry);
      if (frame_id == InternTables::kFull) {
        ++overflows_;
        return 0u;
      }
      frame_ids_.emplace(key, frame_id);
      if (code_refs_.insert(frames[i].code).second) pystack::incref_code(frames[i].code);
    }
    node = tables_->intern_node(node, frame_id);
    if (node == InternTables::kFull) {
      ++overflows_;
      return 0u;
    }
  }
  insert(hash, frames, depth, node);
  return node;
}

void StackInterner::release() {
  std::unordered_set<const void*> refs;
  {
    std::lock_guard<std::mutex> lock(tables_->mu);
    refs.swap(code_refs_);
    frame_ids_.clear();
    slots_.assign(1024, Slot{});
    used_ = 0;
    keys_.clear();
    epoch_.fetch_add(1);
  }
  for (const void* code : refs) pystack::decref_code(code);
}

}  // namespace allocscope
