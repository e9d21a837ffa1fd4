#pragma once

#include <cstdint>
#include <ctime>

// The recorder's few thread-locals (under 200 bytes: pointers where more is kept) use the initial-exec TLS
// model: each access is then one %fs-relative load instead of a call to
// __tls_get_addr, which a dlopen'ed library otherwise pays on the hot path.
#define ALLOCSCOPE_TLS static thread_local __attribute__((tls_model("initial-exec")))

namespace allocscope {

template <class T>
__attribute__((noinline)) T& make_per_thread(T*& slot) {
  slot = new T();
  return *slot;
}

// The calling thread's T, made at its first use there and never destroyed:
// a thread-local with a destructor could go before the thread's last op or
// allocation (other thread-locals' destructors free tensors and run ops).
// Only the pointer is thread-local (initial-exec: the state itself may be
// large), so the usual call is a load and a test.
template <class T>
inline T& leaked_per_thread() {
  ALLOCSCOPE_TLS T* instance = nullptr;
  return __builtin_expect(instance != nullptr, 1) ? *instance : make_per_thread(instance);
}

// CLOCK_MONOTONIC in ns (a vDSO call, ~20 ns). Every event time uses it; the
// metadata pairs one reading with the wall clock to convert.
inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace allocscope
