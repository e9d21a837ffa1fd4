#include "cuda_allocator.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

#include "adopt.h"
#include "clock.h"
#include "backward_scopes.h"
#include "ops.h"
#include "torch_version.h"

namespace allocscope::cuda {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::TraceEntry;

c10::DeviceIndex real_current_device() {
  return c10::cuda::current_device();
}

uint64_t real_current_stream(c10::DeviceIndex device) {
  return reinterpret_cast<uintptr_t>(c10::cuda::getCurrentCUDAStream(device).stream());
}

const Environment kRealEnvironment = {&real_current_device, &real_current_stream};
const Environment* g_env = &kRealEnvironment;

// What the wrapper is doing on this thread, so that the trace tracker (called
// synchronously by the wrapped allocator on the same thread) can tell its
// events for the wrapper's own call from events of memory that bypassed it.
//
// Order across threads: the capture's order must be the wrapped allocator's
// own, or a replay of it takes different blocks (one thread's free recorded
// before another thread's allocation that the allocator served first). So
// where the native caching allocator reports them, the wrapper's ALLOC and
// FREE are pushed from its trace entries, under its lock; the wrapper pushes
// them itself only where no trace entry came (other backends, uncached mode).
struct PendingAlloc {
  RawEvent ev;     // stack, op and size filled before the wrapped call
  int64_t t0;      // when the wrapped call began
  bool pushed;     // by the ALLOC trace entry
};
struct CudaThreadState {
  int in_alloc;          // inside the wrapper's allocation call
  uintptr_t in_free;     // the pointer the wrapper is freeing, or 0
  bool free_pushed;      // the FREE of in_free was pushed by its trace entry
  uintptr_t just_freed;  // the last trace entry on this thread was this block's FREE_REQUESTED
  bool oom_seen;
  uint64_t oom_rounded;  // from the OOM trace entry: rounded request
  uint64_t oom_free;     // and the device's free bytes
  c10::MempoolId_t pool;  // from the ALLOC trace entry: the private pool that served it, or {0, 0}
  PendingAlloc* pending;  // the wrapper's innermost allocation call on this thread
  bool restoring;         // inside setCheckpointPoolState
  bool empty_pending;     // inside emptyCache, its EMPTY_CACHE not pushed yet
  c10::MempoolId_t empty_pool;
};
ALLOCSCOPE_TLS CudaThreadState t_state = {0, 0, false, 0, false, 0, 0, {0, 0}, nullptr, false, false, {0, 0}};
// The SNAPSHOT events of a baseline's snapshot call on this thread
// (begin_snapshot_marks), else nullptr.
thread_local std::vector<std::pair<int, uint64_t>>* t_snapshot_marks = nullptr;

// EMPTY_CACHE, the pool it empties in arg/block (both 0: the shared pools);
// size 1: the call released and completed nothing.
void push_empty_cache(c10::MempoolId_t pool, bool did_nothing) {
  EmitScope scope;
  if (!scope) return;
  RawEvent ev;
  ev.kind = format::kEmptyCache;
  ev.size = did_nothing ? 1 : 0;
  ev.arg = pool.first;
  ev.block = pool.second;
  ev.stream = format::kNoStream;
  scope.push(ev);
}

c10::DeleterFnPtr g_inner_deleter = nullptr;
// Frees through the native caching allocator reach its FREE_REQUESTED trace
// entry (tracker attached, caching on): their FREE is pushed there, and the
// DataPtrs it hands out keep its own deleter. Torch compares deleters with
// the current allocator's raw_deleter() (cudagraph trees decide by it whether
// to free a storage: _has_Standard_Deleter); a deleter of ours would answer
// differently for tensors made before recording, or kept after it.
bool g_free_traced = false;
// The native caching allocator reports to our tracker (attached once, for
// the life of the process): an allocation it made without a trace entry
// bypassed its cache.
bool g_tracker_attached = false;

// Blocks used on another stream (recordStream): their free may complete
// later, so its completion is always recorded. Every other free completes
// inside the free() that requested it, and the FREE says it all. Erased at
// the block's free; the count spares the lock while none is pending.
std::mutex g_streamed_mutex;
std::unordered_set<uintptr_t> g_streamed;
std::atomic<size_t> g_streamed_count{0};

void note_streamed(uintptr_t addr) {
  std::lock_guard<std::mutex> lock(g_streamed_mutex);
  if (g_streamed.insert(addr).second) g_streamed_count.fetch_add(1, std::memory_order_relaxed);
}

bool take_streamed(uintptr_t addr) {
  if (g_streamed_count.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> lock(g_streamed_mutex);
  if (g_streamed.erase(addr) == 0) return false;
  g_streamed_count.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

uint16_t stream_index(c10::DeviceIndex device, uint64_t handle) {
  return Recorder::get().stream_index(device, handle);
}

// Frees `ptr` through `free_fn`, recording the free under the allocator's
// lock (on_trace) where it reports it, else first (see record_free). The FREE
// names no stream: the ALLOC of ptr names it.
template <typename Free>
void free_through(void* ptr, bool traced, Free&& free_fn) {
  if (!traced) record_free(ptr, format::kNoStream);
  CudaThreadState& tl = t_state;
  auto restore = c10::make_scope_exit([&tl, in_free = tl.in_free, free_pushed = tl.free_pushed] {
    tl.in_free = in_free;
    tl.free_pushed = free_pushed;
  });
  tl.in_free = reinterpret_cast<uintptr_t>(ptr);
  tl.free_pushed = !traced;
  free_fn();
  // Freed without a trace entry (a pointer the caching allocator does not
  // own): recorded after, never lost.
  if (!tl.free_pushed) record_free(ptr, format::kNoStream);
}

void delete_fast(void* ptr) {
  free_through(ptr, g_free_traced, [ptr] { g_inner_deleter(ptr); });
}

void delete_boxed(void* ctx) {
  // Not the caching allocator's own deleter (uncached mode, another backend):
  // it may not report the free.
  auto* box = static_cast<BoxedDataPtr*>(ctx);
  free_through(box->inner.get(), false, [box] { delete box; });
}

// Before the ALLOC or OOM `ev`: the private pool that served (or failed)
// it, if it was one.
void push_pool_route(EmitScope& scope, const RawEvent& ev, c10::MempoolId_t pool) {
  if (pool.first == 0 && pool.second == 0) return;
  RawEvent routed;
  routed.kind = format::kPoolAlloc;
  routed.addr = ev.addr;
  routed.stream = ev.stream;
  routed.time_ns = ev.time_ns;
  routed.arg = pool.first;
  routed.block = pool.second;
  scope.push(routed);
}

// The wrapper's ALLOC, completed from the trace entry of the block that
// serves it. Under the allocator's lock (on_trace).
void push_pending_alloc(CudaThreadState& tl, const TraceEntry& te) {
  PendingAlloc* pending = tl.pending;
  if (pending == nullptr || pending->pushed) return;
  EmitScope scope;
  if (!scope) return;
  pending->pushed = true;
  RawEvent& ev = pending->ev;
  ev.addr = te.addr_;
  ev.stream = stream_index(te.device_, reinterpret_cast<uintptr_t>(te.stream_));
  ev.time_ns = now_ns();
  ev.arg = static_cast<uint64_t>(ev.time_ns - pending->t0);
  push_pool_route(scope, ev, te.mempool_);
  scope.push(ev);
}

// Runs under the wrapped allocator's device lock: no Python, no allocation
// through any allocator, nothing that could wait for the GIL.
void on_trace(const TraceEntry& te) {
  CudaThreadState& tl = t_state;
  if (tl.empty_pending) {
    // The first entry of an emptyCache call (a completion it forced, a
    // segment it released): the call has the lock, so EMPTY_CACHE goes here,
    // after everything other threads did before it.
    tl.empty_pending = false;
    push_empty_cache(tl.empty_pool, false);
  }
  const uint64_t addr = te.addr_;
  RawEvent ev;
  ev.addr = addr;
  ev.size = te.size_;
  // Decide before entering the recorder: most entries repeat what the
  // wrapper's own call records (each allocation's ALLOC, each free's request
  // and immediate completion).
  // An immediate completion is the next entry after its FREE_REQUESTED, in
  // the same free() call, of a block no other stream used.
  const uintptr_t just_freed = tl.just_freed;
  tl.just_freed = 0;
  switch (te.action_) {
    case TraceEntry::ALLOC:
      if (tl.in_alloc > 0) {  // the wrapper's call: its event, pushed here
        tl.pool = te.mempool_;
        push_pending_alloc(tl, te);
        return;
      }
      ev.kind = format::kAlloc | format::kViaAllocator;
      if (tl.restoring && (te.mempool_.first != 0 || te.mempool_.second != 0)) {
        // setCheckpointPoolState allocates the checkpoint's blocks where they
        // were, not where a request would land: say so (POOL_ALLOC size 1).
        EmitScope scope;
        if (!scope) return;
        RawEvent placed;
        placed.kind = format::kPoolAlloc;
        placed.addr = addr;
        placed.size = 1;
        placed.stream = stream_index(te.device_, reinterpret_cast<uintptr_t>(te.stream_));
        placed.arg = te.mempool_.first;
        placed.block = te.mempool_.second;
        scope.push(placed);
      }
      break;
    case TraceEntry::FREE_REQUESTED:
      if (tl.in_free == addr) {  // the wrapper's call
        take_streamed(addr);
        if (!tl.free_pushed) {
          tl.free_pushed = true;
          record_free(reinterpret_cast<void*>(addr), format::kNoStream);
        }
        return;
      }
      // A tensor's free (its DataPtr keeps c10's deleter), or memory freed
      // past the wrapper.
      ev.kind = format::kFree | format::kViaAllocator;
      if (!take_streamed(addr)) tl.just_freed = addr;
      break;
    case TraceEntry::FREE_COMPLETED:
      // Completed at once, in the free that requested it: the FREE says it
      // all. Completions in a later call were deferred (cross-stream use),
      // and so are recorded.
      if (tl.in_free == addr || just_freed == addr) return;
      ev.kind = format::kFreeCompleted;
      break;
    case TraceEntry::SEGMENT_ALLOC:
      ev.kind = format::kSegmentAlloc;
      break;
    case TraceEntry::SEGMENT_FREE:
      ev.kind = format::kSegmentFree;
      break;
    case TraceEntry::SEGMENT_MAP:
      ev.kind = format::kSegmentMap;
      break;
    case TraceEntry::SEGMENT_UNMAP:
      ev.kind = format::kSegmentUnmap;
      break;
    case TraceEntry::OOM:
      if (tl.in_alloc > 0) {  // the wrapper records it, with its stack
        tl.oom_seen = true;
        tl.oom_rounded = te.size_;
        tl.oom_free = addr;
        tl.pool = te.mempool_;
        return;
      }
      ev.kind = format::kOom | format::kViaAllocator;
      ev.addr = 0;
      ev.size = 0;
      ev.block = te.size_;
      ev.arg = addr;
      break;
    case TraceEntry::SNAPSHOT:
      ev.kind = format::kSnapshot;
      break;
    default:  // annotations (2.14) and later additions
      return;
  }
  if (ev.kind >= format::kSegmentAlloc && ev.kind <= format::kSegmentUnmap) {
    ev.arg = te.mempool_.first;  // the segment's pool ({0, 0}: the shared pools)
    ev.block = te.mempool_.second;
  }
  EmitScope scope;
  if (!scope) return;
  ev.stream = stream_index(te.device_, reinterpret_cast<uintptr_t>(te.stream_));
  uint64_t seq = scope.push(ev);
  if (ev.kind == format::kSnapshot && t_snapshot_marks != nullptr) {
    t_snapshot_marks->emplace_back(static_cast<int>(te.device_), seq);
  }
}

class RecordingCUDAAllocator final : public cca::CUDAAllocator {
 public:
  explicit RecordingCUDAAllocator(cca::CUDAAllocator* inner) : inner_(inner) {}
  cca::CUDAAllocator* inner() const { return inner_; }

  // ---- allocation: recorded

  c10::DataPtr allocate(size_t n) override {
    return record_alloc<c10::DataPtr>(n, nullptr, [&] { return inner_->allocate(n); });
  }

  void* raw_alloc(size_t n) override {
    return record_alloc<void*>(n, nullptr, [&] { return inner_->raw_alloc(n); });
  }

  void* raw_alloc_with_stream(size_t n, cudaStream_t stream) override {
    return record_alloc<void*>(n, &stream, [&] { return inner_->raw_alloc_with_stream(n, stream); });
  }

  void raw_delete(void* ptr) override {
    free_through(ptr, g_free_traced, [&] { inner_->raw_delete(ptr); });
  }

  c10::DeleterFnPtr raw_deleter() const override {
    // c10's answer changes with caching_allocator_enable (uncached_delete
    // while disabled): forwarded, so that a raw_alloc freed by it goes back
    // the way it came.
    if (g_free_traced) return inner_->raw_deleter();
    return g_inner_deleter != nullptr ? &delete_fast : nullptr;
  }

  // EMPTY_CACHE is sequenced by the call's first trace entry, under the
  // allocator's lock (on_trace). A call that released and completed nothing
  // has none: it is pushed when it returns, saying so (the replay then does
  // nothing either: where it stands in the capture, another thread may have
  // freed a segment the call never saw). Sequenced before the call, a free
  // by another thread just before the lock came after it in the capture,
  // and the replay kept that block's segment.
  void emptyCache(c10::MempoolId_t mempool_id) override {
    CudaThreadState& tl = t_state;
    auto restore = c10::make_scope_exit([&tl] { tl.empty_pending = false; });
    tl.empty_pool = mempool_id;
    tl.empty_pending = true;
    inner_->emptyCache(mempool_id);
    if (tl.empty_pending) {
      tl.empty_pending = false;
      push_empty_cache(mempool_id, true);
    }
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    // arg: the fraction to 9 digits (readable at a glance); block: its exact
    // bits, from which a replay computes c10's limit to the byte.
    uint64_t bits = 0;
    std::memcpy(&bits, &fraction, sizeof bits);
    record_call(format::kSetFraction, device, static_cast<uint64_t>(fraction * 1e9 + 0.5), bits);
    inner_->setMemoryFraction(fraction, device);
  }

  // The native allocator silently ignores DataPtrs whose deleter is not its
  // own (it takes them for IPC memory). Hand it a view with its deleter, so
  // that memory used on a side stream is not reused too early.
  using cca::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (g_free_traced && ptr.get() != nullptr) note_streamed(reinterpret_cast<uintptr_t>(ptr.get()));
    c10::DeleterFnPtr deleter = ptr.get_deleter();
    if (deleter == &delete_fast) {
      c10::DataPtr view(ptr.get(), ptr.get_context(), g_inner_deleter, ptr.device());
      struct Release {
        c10::DataPtr& view;
        ~Release() { view.release_context(); }  // the view never frees
      } release{view};
      inner_->recordStream(view, stream);
    } else if (deleter == &delete_boxed) {
      inner_->recordStream(static_cast<BoxedDataPtr*>(ptr.get_context())->inner, stream);
    } else {
      inner_->recordStream(ptr, stream);
    }
  }

  // ---- everything else: forwarded unchanged

  void copy_data(void* dest, const void* src, size_t count) const override {
    inner_->copy_data(dest, src, count);
  }
  bool is_simple_data_ptr(const c10::DataPtr& data_ptr) const override {
    return inner_->is_simple_data_ptr(data_ptr);
  }
  bool initialized() override { return inner_->initialized(); }
  DeviceStats getDeviceStats(c10::DeviceIndex device) override { return inner_->getDeviceStats(device); }
  void resetAccumulatedStats(c10::DeviceIndex device) override { inner_->resetAccumulatedStats(device); }
  void resetPeakStats(c10::DeviceIndex device) override { inner_->resetPeakStats(device); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override { return inner_->getMemoryInfo(device); }
  void init(int device_count) override { inner_->init(device_count); }
  double getMemoryFraction(c10::DeviceIndex device) override { return inner_->getMemoryFraction(device); }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    return inner_->getExpandableSegmentSizes(device);
  }
  void enable(bool value) override { inner_->enable(value); }
  bool isEnabled() const override { return inner_->isEnabled(); }
  void cacheInfo(c10::DeviceIndex device, size_t* largest) override { inner_->cacheInfo(device, largest); }
  void* getBaseAllocation(void* ptr, size_t* size) override { return inner_->getBaseAllocation(ptr, size); }
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override {
    return inner_->snapshot(mempool_id, include_traces);
  }
  // ---- private pools: recorded, so that a replay can follow CUDA graph captures

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    inner_->beginAllocateToPool(device, mempool_id, std::move(filter));
    record_pool(format::kPoolBegin, device, mempool_id, 0);
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    inner_->endAllocateToPool(device, mempool_id);
    record_pool(format::kPoolEnd, device, mempool_id, 0);
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    record_pool(format::kPoolRelease, device, mempool_id, 0);
    inner_->releasePool(device, mempool_id);
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    return inner_->getPoolUseCount(device, mempool_id);
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    inner_->createOrIncrefPool(device, mempool_id, std::move(allocator));
    record_pool(format::kPoolBegin, device, mempool_id, 1);
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override {
    inner_->setUseOnOOM(device, mempool_id, use_on_oom);
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    inner_->setNoSplit(device, mempool_id);
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override {
    return inner_->checkPoolLiveAllocations(device, mempool_id, expected_live_allocations);
  }
  cca::ShareableHandle shareIpcHandle(void* ptr) override { return inner_->shareIpcHandle(ptr); }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override { return inner_->getIpcDevPtr(std::move(handle)); }
  bool isHistoryEnabled() override { return inner_->isHistoryEnabled(); }
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cca::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override {
    inner_->recordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clear_history, skip_actions);
  }
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    inner_->recordAnnotation(md);
  }
  void pushCompileContext(std::string& md) override { inner_->pushCompileContext(md); }
  void popCompileContext() override { inner_->popCompileContext(); }
  void setUserMetadata(const std::string& metadata) override { inner_->setUserMetadata(metadata); }
  std::string getUserMetadata() override { return inner_->getUserMetadata(); }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    inner_->attachOutOfMemoryObserver(std::move(observer));
  }
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    inner_->attachAllocatorTraceTracker(std::move(tracker));
  }
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    inner_->enablePeerAccess(dev, dev_to_access);
  }
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    return inner_->memcpyAsync(dst, dst_device, src, src_device, count, stream, p2p_enabled);
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    return inner_->getCheckpointState(device, id);
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override {
    CudaThreadState& tl = t_state;
    auto restore = c10::make_scope_exit([&tl, outer = tl.restoring] { tl.restoring = outer; });
    tl.restoring = true;
    return inner_->setCheckpointPoolState(device, std::move(pps));
  }
  std::string name() override { return inner_->name(); }

#if ALLOCSCOPE_TORCH_AT_LEAST(2, 13)
  void markCaptureBegin(c10::DeviceIndex device) override { inner_->markCaptureBegin(device); }
  void markCaptureEnd(c10::DeviceIndex device) override { inner_->markCaptureEnd(device); }
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    return inner_->getContextForPointer(ptr);
  }
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override {
    inner_->attachOomRejectionObserver(std::move(observer));
  }
  c10::DataPtr allocateWithAddress(size_t size, void* addr) override {
    return record_alloc<c10::DataPtr>(size, nullptr, [&] { return inner_->allocateWithAddress(size, addr); });
  }
#endif
#if ALLOCSCOPE_TORCH_AT_LEAST(2, 14)
  bool supportsUserMetadata() override { return inner_->supportsUserMetadata(); }
  void annotateMemory(const void* ptr, const std::string& metadata) override {
    inner_->annotateMemory(ptr, metadata);
  }
#endif

 private:
  static void* pointer_of(const c10::DataPtr& d) { return d.get(); }
  static void* pointer_of(void* p) { return p; }
  static c10::DeviceIndex device_of(const c10::DataPtr& d) { return d.device().index(); }
  static c10::DeviceIndex device_of(void*) { return g_env->current_device(); }
  static void adopt_result(c10::DataPtr& d) {
    if (!g_free_traced) adopt(d, g_inner_deleter, &delete_fast, &delete_boxed);
  }
  static void adopt_result(void*) {}  // raw pointers are freed via raw_delete
  static void adopt_uncached(c10::DataPtr& d) {
    if (g_free_traced) adopt(d, nullptr, &delete_fast, &delete_boxed);  // (else adopt_result did)
  }
  static void adopt_uncached(void*) {}

  // The recorded allocation path shared by allocate, raw_alloc and
  // allocateWithAddress. `stream` is the explicit stream, if any.
  template <typename Result, typename Alloc>
  Result record_alloc(size_t n, const cudaStream_t* stream, Alloc&& alloc) {
    EmitScope scope;
    if (!scope) return alloc();
    // The stack and op are taken before the wrapped allocator runs: no
    // allocator lock is held here. In an autograd node, the stack is that of
    // the forward op that made the node (ops.h).
    backward_scopes::sync(scope);
    ops::Current op = ops::current();
    uint32_t stack = op.forward_stack != 0 ? op.forward_stack : Recorder::get().capture_stack();
    CudaThreadState& tl = t_state;
    tl.oom_seen = false;
    tl.pool = {0, 0};
    PendingAlloc pending;
    pending.ev.kind = format::kAlloc;
    pending.ev.size = n;
    pending.ev.stack = stack;
    pending.ev.op = op.op;
    pending.pushed = false;
    auto restore = c10::make_scope_exit([&tl, outer = tl.pending] {
      --tl.in_alloc;
      tl.pending = outer;
    });
    tl.pending = &pending;
    ++tl.in_alloc;
    int64_t t0 = now_ns();
    pending.t0 = t0;
    Result result;
    try {
      result = alloc();
    } catch (const c10::OutOfMemoryError&) {
      c10::DeviceIndex device = g_env->current_device();
      RawEvent ev;
      ev.kind = format::kOom;
      ev.size = n;
      ev.stack = stack;
      ev.op = op.op;
      ev.block = tl.oom_seen ? tl.oom_rounded : 0;
      ev.arg = tl.oom_seen ? tl.oom_free : 0;
      ev.stream = stream_index(device, stream ? reinterpret_cast<uintptr_t>(*stream) : g_env->current_stream(device));
      push_pool_route(scope, ev, tl.pool);
      scope.push(ev);
      Recorder::get().request_flush();  // the process may not survive this OOM
      throw;
    }
    void* ptr = pointer_of(result);
    if (ptr == nullptr) return result;
    adopt_result(result);
    if (pending.pushed) return result;
    // No trace entry (not the native caching allocator, or uncached mode):
    // recorded after the call, with the call's stream. From the native
    // caching allocator (its tracker attached), that is its uncached path
    // (caching_allocator_enable(False), PYTORCH_NO_CUDA_MEMORY_CACHING): a
    // cudaMalloc of its own, in no segment, which a replay must not serve;
    // the ALLOC's block says so (= size, docs/format.md). c10's deleter for
    // it (uncached_delete) reports no free: the DataPtr is boxed to record it.
    const bool uncached = g_tracker_attached;
    if (uncached) adopt_uncached(result);
    int64_t t1 = now_ns();
    c10::DeviceIndex device = device_of(result);
    RawEvent ev;
    ev.stream = stream_index(device, stream ? reinterpret_cast<uintptr_t>(*stream) : g_env->current_stream(device));
    ev.addr = reinterpret_cast<uintptr_t>(ptr);
    ev.time_ns = t1;
    push_pool_route(scope, ev, tl.pool);
    ev.kind = format::kAlloc;
    ev.size = n;
    ev.block = uncached ? n : 0;
    ev.stack = stack;
    ev.op = op.op;
    ev.arg = static_cast<uint64_t>(t1 - t0);
    scope.push(ev);
    return result;
  }

  void record_call(uint8_t kind, int device, uint64_t arg, uint64_t block = 0) {
    EmitScope scope;
    if (!scope) return;
    RawEvent ev;
    ev.kind = kind;
    ev.arg = arg;
    ev.block = block;
    ev.stream = device < 0 ? format::kNoStream : stream_index(static_cast<c10::DeviceIndex>(device), 0);
    scope.push(ev);
  }

  void record_pool(uint8_t kind, c10::DeviceIndex device, c10::MempoolId_t id, uint64_t addr) {
    EmitScope scope;
    if (!scope) return;
    RawEvent ev;
    ev.kind = kind;
    ev.addr = addr;
    ev.arg = id.first;
    ev.block = id.second;
    ev.stream = stream_index(device, g_env->current_stream(device));
    scope.push(ev);
  }

  cca::CUDAAllocator* inner_;
};

RecordingCUDAAllocator* g_wrapper = nullptr;  // leaked: its deleters outlive everything
c10::Allocator* g_registry_before = nullptr;
uint8_t g_priority = 0;

}  // namespace

void set_environment(const Environment* env) {
  g_env = env != nullptr ? env : &kRealEnvironment;
}

void install() {
  cca::CUDAAllocator* current = cca::allocator.load();
  if (g_wrapper != nullptr && current == g_wrapper) return;
  if (g_wrapper == nullptr) {
    if (!current->initialized()) {
      throw std::runtime_error("the CUDA allocator is not initialized: initialize CUDA before recording");
    }
    g_inner_deleter = current->raw_deleter();
    g_wrapper = new RecordingCUDAAllocator(current);
  } else if (g_wrapper->inner() != current) {
    throw std::runtime_error(
        "the CUDA allocator was replaced after allocscope first wrapped it; allocscope can only record the "
        "CUDA allocator that was current at its first recording in this process");
  }
  if (!g_tracker_attached) {
    // Trackers cannot be detached: attach one for the life of the process and
    // let it do nothing while no recording is active.
    try {
      current->attachAllocatorTraceTracker(&on_trace);
      g_tracker_attached = true;
      // Uncached mode (c10 reads this variable once) allocates and frees
      // without trace entries.
      g_free_traced = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING") == nullptr;
    } catch (const c10::Error&) {
      // Not the native caching allocator: no segment events.
    }
  }
  g_registry_before = c10::GetAllocator(c10::kCUDA);
  cca::allocator.store(g_wrapper);
  g_priority = set_at_lowest_priority(
      g_wrapper, [] { return c10::GetAllocator(c10::kCUDA); },
      [](c10::Allocator* a, uint8_t p) { c10::SetAllocator(c10::kCUDA, a, p); });
}

void uninstall() {
  if (g_wrapper == nullptr) return;
  if (cca::allocator.load() == g_wrapper) cca::allocator.store(g_wrapper->inner());
  if (c10::GetAllocator(c10::kCUDA) == g_wrapper && g_registry_before != nullptr) {
    c10::SetAllocator(c10::kCUDA, g_registry_before, g_priority);
  }
}

bool installed() {
  return g_wrapper != nullptr && cca::allocator.load() == g_wrapper;
}

bool tracker_attached() {
  return g_tracker_attached;
}

c10::cuda::CUDACachingAllocator::CUDAAllocator* wrapped() {
  return g_wrapper != nullptr ? g_wrapper->inner() : cca::allocator.load();
}

std::string wrapped_name() {
  return wrapped()->name();
}

void begin_snapshot_marks() {
  delete t_snapshot_marks;
  t_snapshot_marks = new std::vector<std::pair<int, uint64_t>>();
}

std::vector<std::pair<int, uint64_t>> end_snapshot_marks() {
  std::vector<std::pair<int, uint64_t>> out;
  if (t_snapshot_marks != nullptr) out.swap(*t_snapshot_marks);
  delete t_snapshot_marks;
  t_snapshot_marks = nullptr;
  return out;
}

}  // namespace allocscope::cuda
