#include "fake_cuda.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "recorder/cuda_allocator.h"
#include "recorder/torch_version.h"

namespace allocscope::testing {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::TraceEntry;

thread_local uint64_t t_stream = 0;

c10::DeviceIndex fake_device() {
  return 0;
}
uint64_t fake_stream(c10::DeviceIndex) {
  return t_stream;
}
const cuda::Environment kFakeEnvironment = {&fake_device, &fake_stream};

uint64_t round_up(uint64_t n) {
  return n < 512 ? 512 : (n + 511) / 512 * 512;
}

void fake_delete(void* ptr);

class FakeCUDAAllocator final : public cca::CUDAAllocator {
 public:
  struct Block {
    uint64_t size = 0;       // rounded
    uint64_t requested = 0;
    uint64_t stream = 0;
    int stream_uses = 0;
    bool allocated = false;
    bool pending = false;    // freed, waiting for its other-stream uses
  };

  std::recursive_mutex mu;  // like the native device lock
  std::unordered_map<uintptr_t, Block> blocks;
  std::vector<cca::AllocatorTraceTracker> trackers;
  std::map<std::string, int64_t> calls;
  uint64_t limit = 0;

  void count(const char* name) {
    std::lock_guard<std::recursive_mutex> lock(mu);
    ++calls[name];
  }

  void trace(TraceEntry::Action action, uint64_t addr, uint64_t size, uint64_t stream) {
    TraceEntry te(action, 0, addr, size, reinterpret_cast<void*>(stream), {0, 0}, 0);
    for (auto& t : trackers) t(te);
  }

  uint64_t reserved_locked() const {
    uint64_t total = 0;
    for (const auto& [p, b] : blocks) total += b.size;
    return total;
  }

  void release_cached_locked() {
    for (auto it = blocks.begin(); it != blocks.end();) {
      if (!it->second.allocated && !it->second.pending) {
        trace(TraceEntry::SEGMENT_FREE, it->first, it->second.size, it->second.stream);
        std::free(reinterpret_cast<void*>(it->first));
        it = blocks.erase(it);
      } else {
        ++it;
      }
    }
  }

  void process_events_locked() {
    for (auto& [p, b] : blocks) {
      if (b.pending) {
        b.pending = false;
        b.stream_uses = 0;
        trace(TraceEntry::FREE_COMPLETED, p, b.requested, b.stream);
      }
    }
  }

  void* malloc_block(uint64_t n, uint64_t stream) {
    std::lock_guard<std::recursive_mutex> lock(mu);
    ++calls["malloc"];
    uint64_t size = round_up(n);
    for (auto& [p, b] : blocks) {  // reuse a cached block of the same size and stream
      if (!b.allocated && !b.pending && b.size == size && b.stream == stream) {
        b.allocated = true;
        b.requested = n;
        trace(TraceEntry::ALLOC, p, n, stream);
        return reinterpret_cast<void*>(p);
      }
    }
    if (limit != 0 && reserved_locked() + size > limit) {
      release_cached_locked();  // the native allocator's release-and-retry
      if (reserved_locked() + size > limit) {
        trace(TraceEntry::OOM, limit - reserved_locked(), size, stream);
        TORCH_CHECK_WITH(OutOfMemoryError, false, "fake CUDA out of memory. Tried to allocate ", n, " bytes");
      }
    }
    void* p = std::aligned_alloc(512, size);
    std::memset(p, 0, size);
    blocks[reinterpret_cast<uintptr_t>(p)] = Block{size, n, stream, 0, true, false};
    trace(TraceEntry::SEGMENT_ALLOC, reinterpret_cast<uintptr_t>(p), size, stream);
    trace(TraceEntry::ALLOC, reinterpret_cast<uintptr_t>(p), n, stream);
    return p;
  }

  void free_block(void* ptr) {
    std::lock_guard<std::recursive_mutex> lock(mu);
    ++calls["free"];
    auto it = blocks.find(reinterpret_cast<uintptr_t>(ptr));
    TORCH_CHECK(it != blocks.end() && it->second.allocated, "fake CUDA: invalid free");
    Block& b = it->second;
    b.allocated = false;
    trace(TraceEntry::FREE_REQUESTED, it->first, b.requested, b.stream);
    if (b.stream_uses > 0) {
      b.pending = true;  // completes in process_events, like native's events
    } else {
      trace(TraceEntry::FREE_COMPLETED, it->first, b.requested, b.stream);
    }
  }

  // ---- CUDAAllocator
  c10::DataPtr allocate(size_t n) override {
    count("allocate");
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &fake_delete, c10::Device(c10::kCUDA, 0));
    process_events();
    void* p = malloc_block(n, t_stream);
    return c10::DataPtr(p, p, &fake_delete, c10::Device(c10::kCUDA, 0));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &fake_delete; }
  void* raw_alloc(size_t n) override {
    count("raw_alloc");
    return malloc_block(n, t_stream);
  }
  void* raw_alloc_with_stream(size_t n, cudaStream_t stream) override {
    count("raw_alloc_with_stream");
    return malloc_block(n, reinterpret_cast<uintptr_t>(stream));
  }
  void raw_delete(void* ptr) override {
    count("raw_delete");
    free_block(ptr);
  }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    // Like native: a DataPtr with a foreign deleter is silently ignored.
    if (ptr.get_deleter() != &fake_delete) {
      ++calls["record_stream_ignored"];
      return;
    }
    ++calls["record_stream_accepted"];
    ++blocks.at(reinterpret_cast<uintptr_t>(ptr.get())).stream_uses;
  }
  using cca::CUDAAllocator::recordStream;
  void emptyCache(c10::MempoolId_t) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    ++calls["emptyCache"];
    release_cached_locked();
  }
  cca::SnapshotInfo snapshot(c10::MempoolId_t, bool) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    ++calls["snapshot"];
    cca::SnapshotInfo info;
    uint64_t active = 0;
    for (const auto& [p, b] : blocks) {
      c10::CachingDeviceAllocator::SegmentInfo seg;
      seg.device = 0;
      seg.address = p;
      seg.total_size = b.size;
      seg.allocated_size = b.allocated ? b.size : 0;
      seg.active_size = (b.allocated || b.pending) ? b.size : 0;
      seg.requested_size = (b.allocated || b.pending) ? b.requested : 0;
      seg.stream = reinterpret_cast<void*>(b.stream);
      seg.is_large = b.size > (1 << 20);
      c10::CachingDeviceAllocator::BlockInfo block;
      block.size = b.size;
      block.requested_size = b.requested;
      block.allocated = b.allocated;
      block.active = b.allocated || b.pending;
      seg.blocks.push_back(block);
      info.segments.push_back(seg);
      active += seg.active_size;
    }
    trace(TraceEntry::SNAPSHOT, 0, active, 0);
    return info;
  }
  DeviceStats getDeviceStats(c10::DeviceIndex) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    ++calls["getDeviceStats"];
    DeviceStats s;
    for (const auto& [p, b] : blocks) {
      s.reserved_bytes[0].current += b.size;
      if (b.allocated) s.allocated_bytes[0].current += b.size;
    }
    return s;
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex) override {
    count("getMemoryInfo");
    return {size_t{1} << 30, size_t{2} << 30};
  }
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::recursive_mutex> lock(mu);
    ++calls["attachAllocatorTraceTracker"];
    trackers.push_back(std::move(tracker));
  }
  std::string name() override {
    count("name");
    return "fake";
  }

  // Forwarding targets that only count.
  void copy_data(void* dest, const void* src, size_t n) const override {
    const_cast<FakeCUDAAllocator*>(this)->count("copy_data");
    std::memcpy(dest, src, n);
  }
  bool is_simple_data_ptr(const c10::DataPtr& d) const override {
    const_cast<FakeCUDAAllocator*>(this)->count("is_simple_data_ptr");
    return d.get() == d.get_context();
  }
  bool initialized() override { return count("initialized"), true; }
  void resetAccumulatedStats(c10::DeviceIndex) override { count("resetAccumulatedStats"); }
  void resetPeakStats(c10::DeviceIndex) override { count("resetPeakStats"); }
  void init(int) override { count("init"); }
  double getMemoryFraction(c10::DeviceIndex) override { return count("getMemoryFraction"), 1.0; }
  void setMemoryFraction(double, c10::DeviceIndex) override { count("setMemoryFraction"); }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return count("getExpandableSegmentSizes"), std::vector<cca::StreamSegmentSize>{};
  }
  void enable(bool) override { count("enable"); }
  bool isEnabled() const override { return const_cast<FakeCUDAAllocator*>(this)->count("isEnabled"), true; }
  void cacheInfo(c10::DeviceIndex, size_t* largest) override {
    count("cacheInfo");
    *largest = 0;
  }
  void* getBaseAllocation(void* ptr, size_t*) override { return count("getBaseAllocation"), ptr; }
  void beginAllocateToPool(c10::DeviceIndex, c10::MempoolId_t, std::function<bool(cudaStream_t)>) override {
    count("beginAllocateToPool");
  }
  void endAllocateToPool(c10::DeviceIndex, c10::MempoolId_t) override { count("endAllocateToPool"); }
  void releasePool(c10::DeviceIndex, c10::MempoolId_t) override { count("releasePool"); }
  int getPoolUseCount(c10::DeviceIndex, c10::MempoolId_t) override { return count("getPoolUseCount"), 0; }
  void createOrIncrefPool(c10::DeviceIndex, c10::MempoolId_t, std::shared_ptr<cca::CUDAAllocator>) override {
    count("createOrIncrefPool");
  }
  void setUseOnOOM(c10::DeviceIndex, c10::MempoolId_t, bool) override { count("setUseOnOOM"); }
  void setNoSplit(c10::DeviceIndex, c10::MempoolId_t) override { count("setNoSplit"); }
  bool checkPoolLiveAllocations(c10::DeviceIndex, c10::MempoolId_t, const std::unordered_set<void*>&) override {
    return count("checkPoolLiveAllocations"), true;
  }
  cca::ShareableHandle shareIpcHandle(void*) override { return count("shareIpcHandle"), cca::ShareableHandle{0, ""}; }
  std::shared_ptr<void> getIpcDevPtr(std::string) override { return count("getIpcDevPtr"), nullptr; }
  bool isHistoryEnabled() override { return count("isHistoryEnabled"), false; }
  void recordHistory(bool, cca::CreateContextFn, size_t, cca::RecordContext, bool,
                     const std::vector<std::string>&) override {
    count("recordHistory");
  }
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>&) override {
    count("recordAnnotation");
  }
  void pushCompileContext(std::string&) override { count("pushCompileContext"); }
  void popCompileContext() override { count("popCompileContext"); }
  void setUserMetadata(const std::string&) override { count("setUserMetadata"); }
  std::string getUserMetadata() override { return count("getUserMetadata"), ""; }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver) override { count("attachOutOfMemoryObserver"); }
  void enablePeerAccess(c10::DeviceIndex, c10::DeviceIndex) override { count("enablePeerAccess"); }
  cudaError_t memcpyAsync(void*, int, const void*, int, size_t, cudaStream_t, bool) override {
    return count("memcpyAsync"), cudaSuccess;
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex, c10::MempoolId_t) override {
    return count("getCheckpointState"), nullptr;
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex, std::shared_ptr<cca::AllocatorState>) override {
    return count("setCheckpointPoolState"), cca::CheckpointDelta{};
  }
#if ALLOCSCOPE_TORCH_AT_LEAST(2, 13)
  void markCaptureBegin(c10::DeviceIndex) override { count("markCaptureBegin"); }
  void markCaptureEnd(c10::DeviceIndex) override { count("markCaptureEnd"); }
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void*) override {
    return count("getContextForPointer"), nullptr;
  }
  void attachOomRejectionObserver(cca::OomRejectionObserver) override { count("attachOomRejectionObserver"); }
  c10::DataPtr allocateWithAddress(size_t n, void*) override {
    count("allocateWithAddress");
    void* p = malloc_block(n, t_stream);
    return c10::DataPtr(p, p, &fake_delete, c10::Device(c10::kCUDA, 0));
  }
#endif
#if ALLOCSCOPE_TORCH_AT_LEAST(2, 14)
  bool supportsUserMetadata() override { return count("supportsUserMetadata"), false; }
  void annotateMemory(const void*, const std::string&) override { count("annotateMemory"); }
#endif
};

FakeCUDAAllocator* g_fake = nullptr;  // leaked, like the real allocator

void fake_delete(void* ptr) {
  if (ptr != nullptr) g_fake->free_block(ptr);
}

}  // namespace

const cuda::Environment* install_fake() {
  if (g_fake == nullptr) g_fake = new FakeCUDAAllocator();
  if (cca::allocator.load() != g_fake) {
    cca::allocator.store(g_fake);
    c10::SetAllocator(c10::kCUDA, g_fake, 255);
  }
  return &kFakeEnvironment;
}

bool fake_installed() {
  return g_fake != nullptr;
}

std::map<std::string, int64_t> counters() {
  std::lock_guard<std::recursive_mutex> lock(g_fake->mu);
  return g_fake->calls;
}

void reset_counters() {
  std::lock_guard<std::recursive_mutex> lock(g_fake->mu);
  g_fake->calls.clear();
}

void set_limit(uint64_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(g_fake->mu);
  g_fake->limit = bytes;
}

void set_stream(uint64_t handle) {
  t_stream = handle;
}

void process_events() {
  std::lock_guard<std::recursive_mutex> lock(g_fake->mu);
  g_fake->process_events_locked();
}

uint64_t live_bytes() {
  std::lock_guard<std::recursive_mutex> lock(g_fake->mu);
  uint64_t total = 0;
  for (const auto& [p, b] : g_fake->blocks) total += b.allocated ? b.size : 0;
  return total;
}

c10::DataPtr allocate(uint64_t n, bool bypass) {
  return bypass ? g_fake->allocate(n) : cca::get()->allocate(n);
}

uint64_t raw_alloc(uint64_t n, bool with_stream) {
  void* p = with_stream ? cca::get()->raw_alloc_with_stream(n, reinterpret_cast<cudaStream_t>(t_stream))
                        : cca::get()->raw_alloc(n);
  return reinterpret_cast<uintptr_t>(p);
}

void raw_delete(uint64_t ptr) {
  cca::get()->raw_delete(reinterpret_cast<void*>(ptr));
}

void record_stream(const c10::DataPtr& ptr, uint64_t stream_handle) {
  c10::Stream stream(c10::Stream::UNSAFE, c10::Device(c10::kCUDA, 0), static_cast<c10::StreamId>(stream_handle));
  cca::get()->recordStream(ptr, c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, stream));
}

void empty_cache() {
  cca::get()->emptyCache({0, 0});
}

std::vector<std::string> check_forwarding() {
  cca::CUDAAllocator* a = cca::get();
  std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"copy_data", [a] { char x = 1, y = 0; a->copy_data(&y, &x, 1); }},
      {"is_simple_data_ptr", [a] { a->is_simple_data_ptr(c10::DataPtr()); }},
      {"initialized", [a] { a->initialized(); }},
      {"emptyCache", [a] { a->emptyCache({0, 0}); }},
      {"getDeviceStats", [a] { a->getDeviceStats(0); }},
      {"resetAccumulatedStats", [a] { a->resetAccumulatedStats(0); }},
      {"resetPeakStats", [a] { a->resetPeakStats(0); }},
      {"getMemoryInfo", [a] { a->getMemoryInfo(0); }},
      {"init", [a] { a->init(1); }},
      {"getMemoryFraction", [a] { a->getMemoryFraction(0); }},
      {"setMemoryFraction", [a] { a->setMemoryFraction(0.5, 0); }},
      {"getExpandableSegmentSizes", [a] { a->getExpandableSegmentSizes(0); }},
      {"enable", [a] { a->enable(true); }},
      {"isEnabled", [a] { a->isEnabled(); }},
      {"cacheInfo", [a] { size_t x = 0; a->cacheInfo(0, &x); }},
      {"getBaseAllocation", [a] { size_t s = 0; a->getBaseAllocation(nullptr, &s); }},
      {"snapshot", [a] { a->snapshot({0, 0}, false); }},
      {"beginAllocateToPool", [a] { a->beginAllocateToPool(0, {1, 1}, [](cudaStream_t) { return true; }); }},
      {"endAllocateToPool", [a] { a->endAllocateToPool(0, {1, 1}); }},
      {"releasePool", [a] { a->releasePool(0, {1, 1}); }},
      {"getPoolUseCount", [a] { a->getPoolUseCount(0, {1, 1}); }},
      {"createOrIncrefPool", [a] { a->createOrIncrefPool(0, {1, 1}, nullptr); }},
      {"setUseOnOOM", [a] { a->setUseOnOOM(0, {1, 1}, true); }},
      {"setNoSplit", [a] { a->setNoSplit(0, {1, 1}); }},
      {"checkPoolLiveAllocations", [a] { a->checkPoolLiveAllocations(0, {1, 1}, {}); }},
      {"shareIpcHandle", [a] { a->shareIpcHandle(nullptr); }},
      {"getIpcDevPtr", [a] { a->getIpcDevPtr(""); }},
      {"isHistoryEnabled", [a] { a->isHistoryEnabled(); }},
      {"recordHistory", [a] { a->recordHistory(false, nullptr, 0, cca::RecordContext::NEVER, false, {}); }},
      {"recordAnnotation", [a] { a->recordAnnotation({}); }},
      {"pushCompileContext", [a] { std::string md = "x"; a->pushCompileContext(md); }},
      {"popCompileContext", [a] { a->popCompileContext(); }},
      {"setUserMetadata", [a] { a->setUserMetadata("x"); }},
      {"getUserMetadata", [a] { a->getUserMetadata(); }},
      {"attachOutOfMemoryObserver", [a] { a->attachOutOfMemoryObserver([](int64_t, size_t, size_t, size_t) {}); }},
      {"enablePeerAccess", [a] { a->enablePeerAccess(0, 0); }},
      {"memcpyAsync", [a] { a->memcpyAsync(nullptr, 0, nullptr, 0, 0, nullptr, false); }},
      {"getCheckpointState", [a] { a->getCheckpointState(0, {1, 1}); }},
      {"setCheckpointPoolState", [a] { a->setCheckpointPoolState(0, nullptr); }},
      {"name", [a] { a->name(); }},
#if ALLOCSCOPE_TORCH_AT_LEAST(2, 13)
      {"markCaptureBegin", [a] { a->markCaptureBegin(0); }},
      {"markCaptureEnd", [a] { a->markCaptureEnd(0); }},
      {"getContextForPointer", [a] { a->getContextForPointer(nullptr); }},
      {"attachOomRejectionObserver", [a] { a->attachOomRejectionObserver([](int64_t, size_t, size_t, size_t) {}); }},
      {"allocateWithAddress", [a] { a->allocateWithAddress(64, nullptr); }},
#endif
#if ALLOCSCOPE_TORCH_AT_LEAST(2, 14)
      {"supportsUserMetadata", [a] { a->supportsUserMetadata(); }},
      {"annotateMemory", [a] { a->annotateMemory(nullptr, "x"); }},
#endif
  };
  std::vector<std::string> missed;
  for (auto& [name, call] : calls) {
    int64_t before = counters()[name];
    call();
    if (counters()[name] == before) missed.push_back(name);
  }
  return missed;
}

}  // namespace allocscope::testing
