// The virtual GPU's state, shared by the stand-in CUDA libraries
// (libcudart, libcuda, libnvidia-ml, libcublas) through libvgpu.so, which
// holds it once per process (devices.cpp, memory.cpp, streams.cpp).
// docs/vgpu.md describes the model; in short:
//
// - Devices come from presets (presets.h), chosen by ALLOCSCOPE_VGPU
//   ("H100-80GB", "2xH100-80GB", "H100-80GB,A100-40GB"); ALLOCSCOPE_VGPU_MEMORY
//   and ALLOCSCOPE_VGPU_CONTEXT override the total and the context's share (in
//   bytes). Unset or invalid: no device (and one line on stderr if invalid).
// - Device memory is address space in one reserved arena, mapped read-write
//   without reserve: it costs host memory only where written. Every
//   allocation and every physical handle is charged to its device in 2 MiB
//   units; a charge past the device's total is refused (out of memory). A
//   device's context takes its share when the context is created.
// - Streams complete their work at once, except that an event stays pending
//   for ALLOCSCOPE_VGPU_EVENT_POLLS queries (default 1), and that after a
//   busy kernel (torch.cuda._sleep) a stream's later events stay pending until
//   it is synchronized. Synchronizing a stream, its device or an event
//   completes what it waits for.
// - Work submitted to a capturing stream is not run: it becomes a node of the
//   capture's graph. Graph launches run nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "presets.h"

#define VGPU_API __attribute__((visibility("default")))

namespace vgpu {

enum class Result {
  kOk,
  kOutOfMemory,
  kInvalidValue,
  kInvalidDevice,
  kInvalidHandle,
  kNotReady,
  kNoDevice,
  kNotSupported,
  kCaptureUnsupported,  // e.g. capturing the legacy default stream
  kIllegalState,        // e.g. ending a capture the stream did not begin
};

// Memory is charged, mapped and aligned in units of this size.
inline constexpr size_t kGranularity = 2u << 20;

struct DeviceInfo {
  const Preset* preset;
  uint64_t total;          // bytes
  uint64_t context_bytes;  // taken when the context is created
};

VGPU_API int device_count();
VGPU_API const DeviceInfo* device(int index);  // nullptr outside [0, device_count())
VGPU_API int event_polls();

// A device attribute by its number (cudaDeviceAttr and CUdevice_attribute
// share their numbering); attributes the model has no value for read 0.
VGPU_API Result device_attribute(int device, int attribute, int* value);
// The device's PCI bus number (devices sit on buses 0x18, 0x19, ...).
VGPU_API int pci_bus(int device);

// The calling thread's current device (the runtime's cudaSetDevice).
VGPU_API int current_device();
VGPU_API Result set_current_device(int device);

// ---- device memory

VGPU_API Result create_context(int device);  // once per device; later calls do nothing
VGPU_API bool has_context(int device);        // whether this process created it
VGPU_API Result mem_info(int device, uint64_t* free, uint64_t* total);
// What the card has in use: this process's context and allocations, and,
// where the processes of a run share their cards (ALLOCSCOPE_VGPU_SHARED,
// shared.h), every other process's.
VGPU_API uint64_t used_bytes(int device);
VGPU_API uint64_t own_bytes(int device);  // this process's alone
// What the other processes of the run hold on the card, and how many of
// them created a context there.
VGPU_API uint64_t other_process_bytes(int device, int* contexts);
VGPU_API Result malloc_device(int device, size_t size, void** out);
VGPU_API Result free_device(void* ptr);  // the start of a malloc_device allocation, or nullptr
// A malloc_device allocation that NCCL makes for itself (its connection
// buffers): counted apart so that reports can name it. Freed by free_device.
VGPU_API Result malloc_nccl(int device, size_t size, void** out);
VGPU_API uint64_t nccl_bytes(int device, uint64_t* peak = nullptr);  // now, and the most ever held
// Contexts created on the card by any process of the run, ever.
VGPU_API int contexts_created(int device);

// Virtual memory management (the driver's cuMem* entry points).
VGPU_API Result va_reserve(size_t size, size_t alignment, void** out);
VGPU_API Result va_free(void* ptr, size_t size);
VGPU_API Result phys_create(int device, size_t size, uint64_t* handle);
VGPU_API Result phys_release(uint64_t handle);
VGPU_API Result phys_map(void* ptr, size_t size, uint64_t handle);
VGPU_API Result phys_unmap(void* ptr, size_t size);
VGPU_API Result phys_size(uint64_t handle, int* device, size_t* size);

// Memory another process exported (CUDA IPC, cudaIpcOpenMemHandle): mapped
// in this process's address space, on the exporter's device, and charged
// to no one here (the exporter holds it); ipc_close unmaps it.
VGPU_API Result ipc_import(int device, size_t size, void** out);
VGPU_API Result ipc_close(void* ptr);

// Host memory: page-locked in CUDA, plain host memory here.
VGPU_API Result host_alloc(size_t size, void** out);
VGPU_API Result host_free(void* ptr);
VGPU_API Result host_register(void* ptr, size_t size);
VGPU_API Result host_unregister(void* ptr);

struct PointerInfo {
  enum Kind { kUnregistered, kDevice, kHost } kind;
  int device;
  void* base;
  size_t size;
};
VGPU_API PointerInfo pointer_info(const void* ptr);
// Whether [ptr, ptr + n) may be read and written (see copy).
VGPU_API bool accessible(const void* ptr, size_t n);

// Copies and sets run at once (see submit). A range in device address space
// must lie in mapped memory (else kInvalidValue); host ranges are trusted, as
// CUDA trusts pageable host pointers.
VGPU_API Result copy(void* dst, const void* src, size_t n);
VGPU_API Result set(void* dst, int value, size_t n);

// ---- streams, events, graphs (opaque; their pointers are the CUDA handles)

struct Stream;
struct Event;
struct Graph;
struct GraphExec;

// The legacy default stream and the per-thread default stream (handles 0, 1
// and 2) resolve to the current device's default stream.
VGPU_API Stream* resolve_stream(const void* handle);  // nullptr if not a stream
VGPU_API Result stream_create(int device, unsigned flags, int priority, Stream** out);
VGPU_API Result stream_destroy(Stream* stream);
VGPU_API int stream_device(const Stream* stream);
VGPU_API int stream_priority(const Stream* stream);
VGPU_API unsigned stream_flags(const Stream* stream);
VGPU_API Result stream_query(Stream* stream);
VGPU_API Result stream_synchronize(Stream* stream);
VGPU_API Result device_synchronize(int device);
VGPU_API Result stream_wait_event(Stream* stream, Event* event);

VGPU_API Event* resolve_event(const void* handle);  // nullptr if not an event
VGPU_API Result event_create(unsigned flags, Event** out);
VGPU_API Result event_destroy(Event* event);
VGPU_API Result event_record(Event* event, Stream* stream);
VGPU_API Result event_query(Event* event);
VGPU_API Result event_synchronize(Event* event);
VGPU_API Result event_elapsed_ms(Event* start, Event* end, float* ms);
inline constexpr unsigned kEventDisableTiming = 0x2;  // cudaEventDisableTiming

enum class Work { kKernel, kBusyKernel, kCopy, kSet, kHostFunction, kGraph };
// Work submitted to a stream: returns true if it is to run now, false if the
// stream is capturing (the work became a node of the capture's graph).
VGPU_API bool submit(Stream* stream, Work work);

enum class CaptureStatus { kNone = 0, kActive = 1, kInvalidated = 2 };
// `into`: an existing graph to capture into (nullptr: a new one).
VGPU_API Result capture_begin(Stream* stream, int mode, Graph* into);
VGPU_API Result capture_end(Stream* stream, Graph** out);
// The capture's dependency graph is kept as CUDA keeps it: each piece of
// work a node that depends on the stream's current terminal nodes, which it
// then replaces; an event recorded in a capture carries the stream's
// terminals to the streams that wait on it. c10 reads it to decide when a
// block freed in a capture may be reused (graph_capture_record_stream_reuse).
// `terminals`: the stream's terminal nodes (valid until the stream's next
// capture call), their number in `count`.
VGPU_API void capture_info(const Stream* stream, CaptureStatus* status, uint64_t* id, Graph** graph,
                           void* const** terminals = nullptr, size_t* count = nullptr);
// cudaStreamUpdateCaptureDependencies: add the nodes to the stream's
// terminals, or (set) make them its terminals.
VGPU_API Result capture_update_dependencies(Stream* stream, void* const* nodes, size_t count, bool set);
VGPU_API int exchange_capture_mode(int mode);  // the thread's capture mode; returns the previous one

VGPU_API Graph* resolve_graph(const void* handle);
VGPU_API Result graph_create(Graph** out);
VGPU_API Result graph_destroy(Graph* graph);
// Node handles: `count` in, number of nodes out; fills `nodes` if not null.
VGPU_API Result graph_nodes(Graph* graph, void** nodes, size_t* count);
// A node added by hand (cudaGraphAddNode, cudaGraphAddEmptyNode), after `deps`.
VGPU_API Result graph_add_node(Graph* graph, void* const* deps, size_t count, void** out);
// A node's dependencies: `count` in, their number out; fills `deps` if not null.
VGPU_API Result node_dependencies(const void* node, void** deps, size_t* count);
VGPU_API Result graph_instantiate(Graph* graph, GraphExec** out);
VGPU_API Result graph_exec_destroy(GraphExec* exec);
VGPU_API Result graph_launch(GraphExec* exec, Stream* stream);

// ---- kernels: which host function is torch's busy-wait kernel

VGPU_API void register_kernel(const void* host_function, const char* device_name);
VGPU_API bool is_busy_kernel(const void* host_function);

}  // namespace vgpu

// For allocscope's Python side (ctypes): no torch, no CUDA names involved.
extern "C" {
// Every preset, as a JSON array of objects (static storage).
VGPU_API const char* allocscope_vgpu_presets_json();
// The devices and their memory accounting now, as JSON; owned by the caller's
// thread until its next call.
VGPU_API const char* allocscope_vgpu_state_json();
}
