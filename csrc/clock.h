#pragma once

#include <cstdint>
#include <ctime>

namespace allocscope {

// CLOCK_MONOTONIC in ns (a vDSO call, ~20 ns). Every event time uses it; the
// metadata pairs one reading with the wall clock to convert.
inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace allocscope
