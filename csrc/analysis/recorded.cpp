// SegmentChecker's decisions (recorded.h), as recorded.py makes them.
#include "recorded.h"

#include "format/format.h"

namespace allocscope::replay {

namespace {

constexpr int kAllocKind = format::kSegmentAlloc;

}  // namespace

uint64_t Checker::address(int kind, uint64_t size) {
  if (enabled && !mismatch && j < recorded.size()) {
    const Recorded& r = recorded[j];
    if (r.kind == kind && (kind != kAllocKind || r.size == size)) return r.addr;
  }
  return (*synthetic)(size);
}

void Checker::check(const SegEvent& e) {
  if (!enabled || mismatch) return;
  if (j < recorded.size()) {
    const Recorded& r = recorded[j];
    if (r.kind == e.kind && r.addr == e.addr && r.size == e.size) {
      ++j;
      return;
    }
    has_recorded = true;
    rec = r;
  }
  mismatch = true;
  position = static_cast<int64_t>(j);
  sim = e;
}

}  // namespace allocscope::replay
