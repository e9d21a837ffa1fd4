// The recorder in front of PyTorch's CUDA allocator.
//
// install() stores a forwarding CUDAAllocator into both places the CUDA
// allocator is read from (the `allocator` atomic and c10's allocator registry)
// and attaches, once per process, a trace tracker to the wrapped allocator for
// its own events (segments, deferred frees, OOM). Everything else the
// allocator does is forwarded unchanged.
#pragma once

#include <c10/core/Device.h>

namespace c10::cuda::CUDACachingAllocator {
class CUDAAllocator;
}

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace allocscope::cuda {

// Throws std::runtime_error if CUDA is not initialized or the CUDA allocator
// was replaced since the first install in this process.
void install();
void uninstall();
bool installed();
// Whether the wrapped allocator accepted the trace tracker (the native caching
// allocator does; other backends may not).
bool tracker_attached();
// The allocator the wrapper forwards to (the current one before any install).
c10::cuda::CUDACachingAllocator::CUDAAllocator* wrapped();
std::string wrapped_name();

// The wrapped allocator's snapshot (segments and blocks), statistics, settings
// and the devices' memory info, as a JSON object (cuda_baseline.cpp). The
// memory info (free, total, used) only for devices in with_context: asking
// a device without a CUDA context for it creates one.
std::string baseline_json(const std::string& label, const std::vector<int>& devices,
                          const std::vector<int>& with_context);

// The SNAPSHOT events of one snapshot call on this thread: between
// begin_snapshot_marks() and end_snapshot_marks(), each device's SNAPSHOT
// trace entry (written under that device's lock, where the snapshot reads
// it) is noted with its sequence number: (device, seq) pairs, in order.
void begin_snapshot_marks();
std::vector<std::pair<int, uint64_t>> end_snapshot_marks();

// Test seam: where the wrapper reads the current device and stream from. The
// real functions need a GPU; the test harness installs fakes.
struct Environment {
  c10::DeviceIndex (*current_device)();
  uint64_t (*current_stream)(c10::DeviceIndex device);
};
void set_environment(const Environment* env);  // nullptr: the real one

}  // namespace allocscope::cuda
