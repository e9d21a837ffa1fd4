// Handing out allocations that carry the recorder's own deleter, shared by the
// CPU and CUDA wrappers.
//
// Fast path: the wrapped allocator follows the raw_deleter contract (context
// == pointer, deleter == raw_deleter()). Then only the deleter is swapped for
// a plain function that records the free and calls the wrapped deleter: no
// allocation, and raw_allocate/raw_deleter users keep working.
// Otherwise the original DataPtr is boxed and the box's deleter frees it.
#pragma once

#include <c10/core/Allocator.h>

#include "format/format.h"
#include "clock.h"
#include "recorder.h"

namespace allocscope {

struct BoxedDataPtr {
  c10::DataPtr inner;
};

inline void adopt(c10::DataPtr& d, c10::DeleterFnPtr inner_deleter, c10::DeleterFnPtr fast,
                  c10::DeleterFnPtr boxed) {
  if (inner_deleter != nullptr && d.get_context() == d.get() && d.compare_exchange_deleter(inner_deleter, fast)) {
    return;
  }
  void* ptr = d.get();
  c10::Device device = d.device();
  auto* box = new BoxedDataPtr{std::move(d)};
  d = c10::DataPtr(ptr, box, boxed, device);
}

// Records a FREE before the memory goes back to the wrapped allocator, so that
// no later allocation of the same address can precede it in the stream.
inline void record_free(void* ptr, uint16_t stream) {
  if (ptr == nullptr) return;  // deleting nothing (some code wraps nullptr with raw_deleter())
  EmitScope scope;
  if (!scope) return;
  RawEvent ev;
  ev.kind = format::kFree;
  ev.addr = reinterpret_cast<uintptr_t>(ptr);
  ev.stream = stream;
  scope.push(ev);
}

// SetAllocator overwrites only at an equal or higher priority, and there is no
// getter for the priority in effect. Use the lowest priority that takes, and
// restore at that same priority, so the registry is left as it was.
template <typename Get, typename Set>
uint8_t set_at_lowest_priority(c10::Allocator* ours, Get get, Set set) {
  for (int p = 0; p <= 255; ++p) {
    set(ours, static_cast<uint8_t>(p));
    if (get() == ours) return static_cast<uint8_t>(p);
  }
  return 255;
}

}  // namespace allocscope
