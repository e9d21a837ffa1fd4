// Walking the calling thread's Python stack from inside an allocator.
//
// Most allocations happen while the allocating thread has released the GIL
// (op dispatch releases it), and taking the GIL there can stall for a whole
// switch interval behind another Python thread. But a thread that released the
// GIL cannot push or pop Python frames, and its frames keep their code objects
// alive, so the thread may read its *own* frame chain without the GIL. The
// internal walker does exactly that, for the CPython versions whose frame
// layout is declared in pystack.cpp; self_check() compares it with the public
// API before it is trusted. Elsewhere the GIL walker takes the GIL and uses the
// public API, as torch's own CapturedTraceback does.
//
// Depends on Python.h only (not torch), so it can be tested on any CPython.
#pragma once

#include <cstdint>
#include <string>

namespace allocscope::pystack {

// A frame as walked: the code object and the instruction index within it (in
// code units). Where the instruction cannot be had (CPython < 3.11, GIL
// walker), `instr` holds the line number and `instr_is_line` is true.
struct RawFrame {
  const void* code;
  int32_t instr;
};

enum class Walker : uint8_t {
  kInternal = 0,  // reads the thread's own frames; never takes the GIL
  kGil = 1,       // takes the GIL, public API
};

// True when this build has a frame layout for the running CPython.
bool internal_walker_compiled();

// The walker to use: kInternal when compiled and self_check() passed.
// Requires the GIL (runs the self-check once per call).
Walker choose_walker(std::string* reason);

// Walks the calling thread's stack, innermost first, into out[0..max_depth),
// leaving out the innermost frames of hidden code (below). Returns the depth;
// 0 for threads with no Python state or no Python frames.
int walk(Walker walker, RawFrame* out, int max_depth);

// Requires the GIL. Frames of this code object, where they are the innermost
// ones, are not the program's: the virtual GPU's Python kernels (values.py),
// which allocate on behalf of the op the program called. The code object is
// kept alive; at most kMaxHidden of them. False when the list is full.
constexpr int kMaxHidden = 64;
bool hide(const void* code);

// Requires the GIL. Compares walk(kInternal) with the public API on the
// current stack; on a mismatch, says why.
bool self_check(std::string* why);

// Requires the GIL.
struct Symbol {
  std::string filename;
  std::string function;
  int line;
};
Symbol symbolize(const RawFrame& frame, Walker walker);
void incref_code(const void* code);
void decref_code(const void* code);

// Whether this thread may take the GIL now (an interpreter exists and is not
// finalizing, and the thread has a Python thread state).
bool can_take_gil();

// RAII GIL holder that works whether or not the thread already holds it.
class GilGuard {
 public:
  GilGuard();
  ~GilGuard();
  GilGuard(const GilGuard&) = delete;
  GilGuard& operator=(const GilGuard&) = delete;

 private:
  int state_;
};

// RAII GIL release for a thread that holds it (no-op otherwise).
class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  void* saved_;
};

}  // namespace allocscope::pystack
