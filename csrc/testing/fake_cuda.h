// Test-only: a host-memory stand-in for the native CUDA caching allocator, so
// that the CUDA wrapper's bookkeeping, deleters, install/uninstall, tracker
// coordination and stack capture are tested on machines without a GPU.
//
// What it copies from the native allocator, because the wrapper depends on
// it: the raw_deleter contract (context == pointer); recordStream ignoring
// DataPtrs with a foreign deleter; frees of blocks used on another stream
// deferred until process_events(); freed blocks cached and reused for the
// same rounded size (so addresses repeat); empty_cache and an OOM that first
// releases the cache; trace events reported to trackers under its lock.
// It does not replace GPU tests of the real allocator.
#pragma once

#include <c10/core/Allocator.h>

#include "recorder/cuda_allocator.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace allocscope::testing {

// Makes the fake the current CUDA allocator (atomic and registry). Returns
// the fake devices and streams the wrapper must read instead of CUDA's
// (allocscope._C.set_cuda_environment, given it as a capsule). Idempotent.
const cuda::Environment* install_fake();
bool fake_installed();

std::map<std::string, int64_t> counters();
void reset_counters();
void set_limit(uint64_t bytes);  // 0: no limit
void set_stream(uint64_t handle);  // this thread's current stream
void process_events();           // completes deferred frees
uint64_t live_bytes();           // rounded bytes allocated in the fake

// Allocations made through the *current* CUDA allocator (the wrapper while
// recording), as at::empty_cuda would; or directly in the fake (memory that
// bypasses the wrapper).
c10::DataPtr allocate(uint64_t n, bool bypass);
uint64_t raw_alloc(uint64_t n, bool with_stream);
void raw_delete(uint64_t ptr);
void record_stream(const c10::DataPtr& ptr, uint64_t stream_handle);
void empty_cache();

// Calls every forwarded method once through the current CUDA allocator;
// returns the names of those that did not reach the fake.
std::vector<std::string> check_forwarding();

}  // namespace allocscope::testing
