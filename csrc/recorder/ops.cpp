#include "ops.h"

#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "clock.h"
#include "format/format.h"
#include "gradients.h"
#include "recorder.h"

namespace allocscope::ops {
namespace {

// The engine wraps each node's call in a FUNCTION-scope frame of this name;
// the node's own BACKWARD_FUNCTION frame runs inside it, and gradients for the
// next nodes are summed in it after the node returns.
constexpr char kEvaluatePrefix[] = "autograd::engine::evaluate_function: ";
constexpr size_t kEvaluatePrefixLen = sizeof(kEvaluatePrefix) - 1;

struct Frame {
  const void* rf;            // the RecordFunction: start and end see the same object
  const char* name;          // as shown (a node's without the engine's prefix); valid while the op runs
  uint32_t node = 0;         // interned chain up to here; 0: not yet
  uint32_t forward_stack = 0;
  uint32_t owes_exit = 0;    // module scope (label + 1) to close when this frame ends
  bool backward = false;     // an autograd node (or the engine's frame around one)
};

struct Module {
  uint32_t label;
  bool leaf;
};

// The chain node of an op frame under its parent, by the name's pointer
// (an op's name is its schema's, the same pointer at every call) and checked
// by the name's text (a node's name is a string of its call, whose memory a
// later name may reuse). Direct-mapped: a miss interns as before.
struct NodeCacheEntry {
  const char* pointer = nullptr;
  uint32_t parent = 0;
  uint32_t node = 0;
  bool backward = false;
  std::string text;
};
constexpr size_t kNodeCacheSize = 256;

size_t node_cache_index(const char* pointer, uint32_t parent, bool backward) {
  uint64_t h = (reinterpret_cast<uintptr_t>(pointer) ^ (uint64_t{parent} << 20) ^ backward) * 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>(h >> 56) & (kNodeCacheSize - 1);
}

// Per thread. Caches hold ids of one recording (generation).
struct ThreadOps {
  std::vector<Frame> frames;
  uint64_t generation = 0;
  int64_t last_forward_seq = -1;
  uint32_t last_forward_module = 0;
  int backward_depth = 0;
  std::vector<Module> modules;  // forward module scopes open on this thread
  std::unordered_map<uint64_t, std::pair<uint32_t, std::string>> frame_ids;  // name hash -> (frame, name)
  std::unordered_map<uint64_t, uint32_t> node_ids;                           // (parent, frame) -> node
  std::unique_ptr<NodeCacheEntry[]> node_cache{new NodeCacheEntry[kNodeCacheSize]};
};

ThreadOps& this_thread() {
  return leaked_per_thread<ThreadOps>();  // (clock.h: read twice an op, a load)
}

// Forward stacks by (forward thread, sequence number), direct-mapped and
// lock-free: the forward thread writes, the engine's threads read. An entry
// is overwritten by the node made 2^18 forward ops later, so a graph kept for
// longer than that loses its stacks, never its memory bound.
constexpr size_t kSlots = size_t{1} << 18;
struct Slot {
  std::atomic<uint64_t> key{0};
  std::atomic<uint32_t> stack{0};
  std::atomic<uint32_t> module{0};  // label + 1, bit 31 leaf; 0: no module
};

struct Forward {
  uint32_t stack = 0;
  uint32_t module = 0;
};
constexpr uint32_t kLeafBit = uint32_t{1} << 31;
std::unique_ptr<Slot[]> g_slots;
std::atomic<bool> g_forward_stacks{false};
at::CallbackHandle g_handle = at::INVALID_CALLBACK_HANDLE;

uint64_t slot_key(uint64_t thread, int64_t seq) {
  return ((thread & 0xFFFFF) << 44 | (static_cast<uint64_t>(seq) & ((uint64_t{1} << 44) - 1))) + 1;
}

size_t slot_index(uint64_t key) {
  return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 46) & (kSlots - 1);
}

void keep_forward(uint64_t thread, int64_t seq, Forward f) {
  uint64_t key = slot_key(thread, seq);
  Slot& s = g_slots[slot_index(key)];
  s.key.store(0, std::memory_order_release);  // readers see a torn entry as missing
  s.stack.store(f.stack, std::memory_order_release);
  s.module.store(f.module, std::memory_order_release);
  s.key.store(key, std::memory_order_release);
}

Forward find_forward(uint64_t thread, int64_t seq) {
  uint64_t key = slot_key(thread, seq);
  Slot& s = g_slots[slot_index(key)];
  if (s.key.load(std::memory_order_acquire) != key) return {};
  Forward f{s.stack.load(std::memory_order_acquire), s.module.load(std::memory_order_acquire)};
  return s.key.load(std::memory_order_acquire) == key ? f : Forward{};
}

// A module's backward scope on this thread (format.h: kModuleEnter/Exit).
void emit_scope(uint8_t kind, uint32_t module) {
  EmitScope scope;
  if (!scope) return;
  RawEvent ev;
  ev.kind = kind;
  ev.arg = (module & ~kLeafBit) - 1;
  ev.addr = 1 | ((module & kLeafBit) ? 2 : 0);  // backward, leaf
  scope.push(ev);
}

uint64_t hash_name(const char* s) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001B3ull;
  return h;
}

ThreadOps& ops_of_this_thread() {
  ThreadOps& t = this_thread();
  uint64_t generation = Recorder::get().generation();
  if (t.generation != generation) {
    t.generation = generation;
    t.last_forward_seq = -1;
    t.last_forward_module = 0;
    t.modules.clear();
    t.frame_ids.clear();
    t.node_ids.clear();
    for (size_t i = 0; i < kNodeCacheSize; ++i) t.node_cache[i].pointer = nullptr;
    for (Frame& f : t.frames) f.node = 0;
  }
  return t;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadOps& t = ops_of_this_thread();
  const char* name = fn.name();
  // (the first two letters tell "autograd::engine::..." from "aten::..." without a call)
  bool evaluate = name[0] == 'a' && name[1] == 'u' && std::strncmp(name, kEvaluatePrefix, kEvaluatePrefixLen) == 0;
  bool backward = evaluate || fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  Frame f{&fn, evaluate ? name + kEvaluatePrefixLen : name};
  f.backward = backward;
  if (!t.frames.empty()) f.forward_stack = t.frames.back().forward_stack;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    Forward fw = find_forward(fn.forwardThreadId(), fn.seqNr());
    // The engine's frame around the node sums gradients after it returns:
    // it takes the node's stack and module scope.
    Frame* outer = !t.frames.empty() && t.frames.back().backward ? &t.frames.back() : &f;
    if (fw.stack != 0) {
      f.forward_stack = fw.stack;
      if (outer->forward_stack == 0) outer->forward_stack = fw.stack;
    }
    if (fw.module != 0 && outer->owes_exit == 0) {
      emit_scope(format::kModuleEnter, fw.module);
      outer->owes_exit = fw.module;
    }
  } else if (!backward && t.backward_depth == 0 && fn.seqNr() >= 0 && c10::GradMode::is_enabled() &&
             (fn.seqNr() != t.last_forward_seq ||
              (!t.modules.empty() && t.modules.back().label + 1 != t.last_forward_module))) {
    // A forward op that may make an autograd node: keep its Python stack
    // and module once per sequence number (nested ops share their caller's).
    EmitScope scope;
    if (scope) {
      Forward fw;
      if (!t.modules.empty()) fw.module = (t.modules.back().label + 1) | (t.modules.back().leaf ? kLeafBit : 0);
      if (g_forward_stacks.load(std::memory_order_relaxed)) fw.stack = Recorder::get().capture_stack();
      if (fw.stack != 0 || fw.module != 0) keep_forward(fn.threadId(), fn.seqNr(), fw);
      t.last_forward_seq = fn.seqNr();
      t.last_forward_module = fw.module & ~kLeafBit;
    }
  }
  t.backward_depth += backward;
  t.frames.push_back(f);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  // An AccumulateGrad node (sequence number -1) ends: its parameter's
  // gradient is in (gradients.h).
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION && fn.seqNr() == -1 && gradients::any()) {
    gradients::accumulated();
  }
  ThreadOps& t = this_thread();
  if (!t.frames.empty() && t.frames.back().rf == &fn && t.frames.back().owes_exit == 0) {  // (the usual case)
    t.backward_depth -= t.frames.back().backward;
    t.frames.pop_back();
    return;
  }
  // Normally the top; an op whose start this thread did not see (the
  // callback came or went while it ran, or an async op) leaves it alone.
  for (size_t i = t.frames.size(); i-- > 0;) {
    if (t.frames[i].rf == &fn) {
      for (size_t j = t.frames.size(); j-- > i;) {
        t.backward_depth -= t.frames[j].backward;
        if (t.frames[j].owes_exit != 0) emit_scope(format::kModuleExit, t.frames[j].owes_exit);
      }
      t.frames.resize(i);
      return;
    }
  }
}

// The chain node of frame `f` under `parent` (interned into the stack tree
// under the tables' mutex where this thread has not met it); kFull when the
// tables are full.
uint32_t intern_frame_node(ThreadOps& t, const Frame& f, uint32_t parent) {
  InternTables& tables = Recorder::get().tables();
  uint64_t h = hash_name(f.name) ^ (f.backward ? 0x5bd1e995ull : 0);
  auto it = t.frame_ids.find(h);
  uint32_t frame = InternTables::kFull;
  if (it != t.frame_ids.end() && it->second.second == f.name) frame = it->second.first;
  std::unique_lock<std::mutex> lock(tables.mu, std::defer_lock);
  if (frame == InternTables::kFull) {
    lock.lock();
    FrameEntry e;
    e.filename = tables.intern_string(f.backward ? "<autograd>" : "<aten>");
    e.function = tables.intern_string(f.name);
    e.line = 0;
    if (e.filename == InternTables::kFull || e.function == InternTables::kFull) return InternTables::kFull;
    frame = tables.intern_frame(e);
    if (frame == InternTables::kFull) return InternTables::kFull;
    t.frame_ids[h] = {frame, f.name};
  }
  uint64_t key = (uint64_t{parent} << 32) | frame;
  auto nit = t.node_ids.find(key);
  if (nit != t.node_ids.end()) return nit->second;
  if (!lock.owns_lock()) lock.lock();
  uint32_t node = tables.intern_node(parent, frame);
  if (node != InternTables::kFull) t.node_ids.emplace(key, node);
  return node;
}

}  // namespace

bool active() {
  return g_handle != at::INVALID_CALLBACK_HANDLE;
}

void module_entered(uint32_t label, bool leaf) {
  ThreadOps& t = ops_of_this_thread();
  t.modules.push_back(Module{label, leaf});
}

uint32_t innermost_module(uint32_t none) {
  ThreadOps& t = ops_of_this_thread();
  return t.modules.empty() ? none : t.modules.back().label;
}

uint32_t innermost_packed() {
  ThreadOps& t = ops_of_this_thread();
  return t.modules.empty() ? 0 : (t.modules.back().label + 1) | (t.modules.back().leaf ? kLeafBit : 0);
}

void module_exited(uint32_t label) {
  ThreadOps& t = ops_of_this_thread();
  for (size_t i = t.modules.size(); i-- > 0;) {
    if (t.modules[i].label == label) {
      t.modules.resize(i);
      return;
    }
  }
}

void start(bool forward_stacks) {
  if (!g_slots) g_slots.reset(new Slot[kSlots]);
  for (size_t i = 0; i < kSlots; ++i) g_slots[i].key.store(0, std::memory_order_relaxed);
  g_forward_stacks.store(forward_stacks);
  if (g_handle == at::INVALID_CALLBACK_HANDLE) {
    g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                         .needsInputs(false)
                                         .needsOutputs(false)
                                         .needsIds(false)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  }
}

void stop() {
  if (g_handle != at::INVALID_CALLBACK_HANDLE) {
    at::removeCallback(g_handle);
    g_handle = at::INVALID_CALLBACK_HANDLE;
  }
  g_forward_stacks.store(false);
}

Current current() {
  ThreadOps& t = ops_of_this_thread();
  if (t.frames.empty()) return {};
  Current c;
  c.forward_stack = t.frames.back().forward_stack;
  // Intern the frames not interned yet, outermost first. A node's engine
  // frame and the node itself carry one name: the chain shows it once.
  size_t first = t.frames.size();
  while (first > 0 && t.frames[first - 1].node == 0) --first;
  if (first == t.frames.size()) {
    c.op = t.frames.back().node;
    return c;
  }
  uint32_t parent = first > 0 ? t.frames[first - 1].node : 0;
  const char* parent_name = first > 0 ? t.frames[first - 1].name : "";
  for (size_t i = first; i < t.frames.size(); ++i) {
    Frame& f = t.frames[i];
    const char* name = f.name;
    if (parent != 0 && (name == parent_name || std::strcmp(name, parent_name) == 0)) {
      f.node = parent;
      continue;
    }
    NodeCacheEntry& cached = t.node_cache[node_cache_index(name, parent, f.backward)];
    if (cached.pointer == name && cached.parent == parent && cached.backward == f.backward &&
        std::strcmp(cached.text.c_str(), name) == 0) {
      f.node = parent = cached.node;
      parent_name = name;
      continue;
    }
    uint32_t node = intern_frame_node(t, f, parent);
    if (node == InternTables::kFull) break;
    cached.pointer = name;
    cached.parent = parent;
    cached.node = node;
    cached.backward = f.backward;
    cached.text = name;
    f.node = parent = node;
    parent_name = name;
  }
  c.op = t.frames.back().node;
  return c;
}

}  // namespace allocscope::ops
