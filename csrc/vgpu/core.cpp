// libvgpu.so: the virtual GPU's state (see core.h for the model).
#include "core.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace vgpu {
namespace {

// ---- configuration, read once from the environment

struct Config {
  std::vector<DeviceInfo> devices;
  int event_polls = 1;
};

void config_error(const std::string& what) {
  std::fprintf(stderr, "allocscope vgpu: %s; no virtual GPU\n", what.c_str());
}

bool parse_u64(const char* text, uint64_t* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-') return false;
  *out = v;
  return true;
}

const Preset* find_preset(const std::string& key) {
  for (const Preset& p : kPresets) {
    if (strcasecmp(p.key, key.c_str()) == 0) return &p;
  }
  return nullptr;
}

// "H100-80GB", "2xH100-80GB", "H100-80GB,A100-40GB".
bool parse_devices(const char* spec, std::vector<const Preset*>* out) {
  std::string text(spec);
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    int count = 1;
    size_t x = item.find_first_of("xX");
    if (x != std::string::npos && x > 0 && item.find_first_not_of("0123456789") == x) {
      count = std::atoi(item.substr(0, x).c_str());
      item = item.substr(x + 1);
    }
    const Preset* preset = find_preset(item);
    if (preset == nullptr || count < 1 || count > 16) return false;
    for (int i = 0; i < count; ++i) out->push_back(preset);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return !out->empty() && out->size() <= 16;
}

Config load_config() {
  Config c;
  const char* spec = std::getenv("ALLOCSCOPE_VGPU");
  if (spec == nullptr || *spec == '\0') return c;
  std::vector<const Preset*> presets;
  if (!parse_devices(spec, &presets)) {
    config_error(std::string("ALLOCSCOPE_VGPU=") + spec + " names no known GPU (allocscope run --gpu list)");
    return c;
  }
  uint64_t memory = 0, context = kDefaultContextBytes, polls = 1;
  const char* m = std::getenv("ALLOCSCOPE_VGPU_MEMORY");
  if (m != nullptr && *m != '\0' && (!parse_u64(m, &memory) || memory < kGranularity)) {
    config_error(std::string("ALLOCSCOPE_VGPU_MEMORY=") + m + " is not a size in bytes of at least 2 MiB");
    return c;
  }
  const char* ctx = std::getenv("ALLOCSCOPE_VGPU_CONTEXT");
  if (ctx != nullptr && *ctx != '\0' && !parse_u64(ctx, &context)) {
    config_error(std::string("ALLOCSCOPE_VGPU_CONTEXT=") + ctx + " is not a size in bytes");
    return c;
  }
  const char* p = std::getenv("ALLOCSCOPE_VGPU_EVENT_POLLS");
  if (p != nullptr && *p != '\0' && (!parse_u64(p, &polls) || polls > 1000000)) {
    config_error(std::string("ALLOCSCOPE_VGPU_EVENT_POLLS=") + p + " is not a count");
    return c;
  }
  for (const Preset* preset : presets) {
    uint64_t total = memory != 0 ? memory : preset->total_mib << 20;
    c.devices.push_back(DeviceInfo{preset, total, std::min(context, total)});
  }
  c.event_polls = static_cast<int>(polls);
  return c;
}

const Config& config() {
  static const Config c = load_config();
  return c;
}

size_t round_up(size_t n, size_t unit) {
  return (n + unit - 1) / unit * unit;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- address space

constexpr int kMapFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

// One reserved range of address space that device memory is carved from,
// first fit in address order, so that addresses ascend and freed ones are
// reused, as on a real card.
struct Arena {
  uintptr_t base = 0;
  size_t size = 0;
  std::map<uintptr_t, size_t> free_ranges;  // start -> length, coalesced

  bool ensure() {
    if (base != 0) return true;
    for (size_t tib : {16, 4, 1}) {
      size_t want = tib << 40;
      void* p = mmap(nullptr, want + kGranularity, PROT_NONE, kMapFlags, -1, 0);
      if (p == MAP_FAILED) continue;
      base = round_up(reinterpret_cast<uintptr_t>(p), kGranularity);
      size = want;
      free_ranges[base] = size;
      return true;
    }
    return false;
  }
  bool contains(uintptr_t p) const { return base != 0 && p >= base && p < base + size; }

  uintptr_t take(size_t n, size_t alignment) {
    if (!ensure()) return 0;
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
      uintptr_t start = round_up(it->first, alignment);
      uintptr_t end = it->first + it->second;
      if (start + n > end) continue;
      uintptr_t head = it->first;
      free_ranges.erase(it);
      if (start > head) free_ranges[head] = start - head;
      if (start + n < end) free_ranges[start + n] = end - (start + n);
      return start;
    }
    return 0;
  }

  void give(uintptr_t p, size_t n) {
    auto next = free_ranges.lower_bound(p);
    if (next != free_ranges.end() && p + n == next->first) {
      n += next->second;
      next = free_ranges.erase(next);
    }
    if (next != free_ranges.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == p) {
        prev->second += n;
        return;
      }
    }
    free_ranges[p] = n;
  }
};

// Read-write and empty: the pages appear on first write.
bool commit(uintptr_t p, size_t n) {
  return mmap(reinterpret_cast<void*>(p), n, PROT_READ | PROT_WRITE, kMapFlags | MAP_FIXED, -1, 0) != MAP_FAILED;
}

// Back to reserved: drops the pages written.
void decommit(uintptr_t p, size_t n) {
  mmap(reinterpret_cast<void*>(p), n, PROT_NONE, kMapFlags | MAP_FIXED, -1, 0);
}

struct Mapping {
  size_t size;
  int device;
  uint64_t handle;  // 0: a malloc_device allocation, which owns its charge
};

struct Physical {
  int device;
  size_t size;
  int maps = 0;
  bool released = false;
};

struct DeviceState {
  uint64_t used = 0;
  bool context = false;
  Stream* default_stream = nullptr;
};

}  // namespace

struct Stream {
  int device;
  unsigned flags;
  int priority;
  bool is_default;
  uint64_t recorded = 0;   // sequence number of the last event recorded
  uint64_t completed = 0;  // events up to this one are complete
  bool busy = false;       // a busy kernel runs: later events wait for a sync
  uint64_t busy_after = 0;
  uint64_t capture_id = 0;  // 0: not capturing
  Graph* capture_graph = nullptr;
  bool capture_origin = false;
};

struct Event {
  unsigned flags;
  Stream* stream = nullptr;
  uint64_t seq = 0;  // 0: not recorded, or recorded in a capture
  int polls_left = 0;
  int64_t host_ns = 0;
  uint64_t capture_id = 0;
  Graph* capture_graph = nullptr;
};

struct Graph {
  size_t nodes = 0;
  std::vector<std::unique_ptr<char>> node_handles;  // made when asked for
};

struct GraphExec {
  size_t nodes;
};

namespace {

struct State {
  std::mutex mu;
  Arena arena;
  std::map<uintptr_t, Mapping> mapped;
  std::map<uintptr_t, size_t> reserved;  // va_reserve ranges
  std::unordered_map<uint64_t, Physical> physical;
  uint64_t next_handle = 1;
  std::map<uintptr_t, size_t> host;  // host_alloc (owned) and host_register ranges
  std::unordered_set<uintptr_t> host_owned;
  std::vector<DeviceState> devices;
  std::unordered_set<Stream*> streams;
  std::unordered_set<Event*> events;
  std::unordered_set<Graph*> graphs;
  uint64_t next_capture_id = 0;
  std::unordered_set<const void*> busy_kernels;

  State() : devices(config().devices.size()) {}

  bool charge(int device, uint64_t n) {
    DeviceState& d = devices[device];
    if (d.used + n > config().devices[device].total) return false;
    d.used += n;
    return true;
  }
  void uncharge(int device, uint64_t n) { devices[device].used -= std::min(devices[device].used, n); }

  void context(int device) {
    DeviceState& d = devices[device];
    if (d.context) return;
    d.context = true;
    d.used += config().devices[device].context_bytes;
  }

  Stream* default_stream(int device) {
    DeviceState& d = devices[device];
    if (d.default_stream == nullptr) {
      d.default_stream = new Stream{device, 0, 0, true};
      streams.insert(d.default_stream);
    }
    return d.default_stream;
  }

  // The mapping containing p, or mapped.end().
  std::map<uintptr_t, Mapping>::iterator mapping_at(uintptr_t p) {
    auto it = mapped.upper_bound(p);
    if (it == mapped.begin()) return mapped.end();
    --it;
    return p < it->first + it->second.size ? it : mapped.end();
  }

  // Device ranges must be mapped end to end (a tensor in an expandable
  // segment spans several mappings); anything else is host memory.
  bool accessible(uintptr_t p, size_t n) {
    if (!arena.contains(p)) return true;
    uintptr_t end = p + n;
    while (p < end) {
      auto it = mapping_at(p);
      if (it == mapped.end()) return false;
      p = it->first + it->second.size;
    }
    return true;
  }

  void release_physical(uint64_t handle) {
    auto it = physical.find(handle);
    if (it == physical.end() || !it->second.released || it->second.maps > 0) return;
    uncharge(it->second.device, it->second.size);
    physical.erase(it);
  }

  // Events up to `seq` on `s` are complete (a stream runs in order).
  static void complete(Stream* s, uint64_t seq) { s->completed = std::max(s->completed, seq); }
  static void synchronize(Stream* s) {
    s->completed = s->recorded;
    s->busy = false;
  }
  static bool done(const Event* e) { return e->seq == 0 || e->seq <= e->stream->completed; }
  static bool blocked(const Event* e) { return e->stream->busy && e->seq > e->stream->busy_after; }
};

State& state() {
  static State* s = new State();  // never destroyed: CUDA calls may come during exit
  return *s;
}

using Lock = std::lock_guard<std::mutex>;

thread_local int t_device = 0;
thread_local int t_capture_mode = 0;  // cudaStreamCaptureModeGlobal

bool valid_device(int device) {
  return device >= 0 && device < device_count();
}

}  // namespace

// ---- devices

int device_count() {
  return static_cast<int>(config().devices.size());
}

const DeviceInfo* device(int index) {
  return valid_device(index) ? &config().devices[index] : nullptr;
}

int event_polls() {
  return config().event_polls;
}

int pci_bus(int device) {
  return 0x18 + device;
}

Result device_attribute(int device, int attribute, int* value) {
  if (!valid_device(device)) return device_count() == 0 ? Result::kNoDevice : Result::kInvalidDevice;
  const Preset& p = *config().devices[device].preset;
  int v = 0;
  switch (attribute) {
    case 1: v = 1024; break;                       // max threads per block
    case 2: case 3: v = 1024; break;               // max block dim x, y
    case 4: v = 64; break;                         // max block dim z
    case 5: v = 0x7fffffff; break;                 // max grid dim x
    case 6: case 7: v = 65535; break;              // max grid dim y, z
    case 8: v = 48 * 1024; break;                  // shared memory per block
    case 9: v = 64 * 1024; break;                  // constant memory
    case 10: v = 32; break;                        // warp size
    case 11: v = 0x7fffffff; break;                // max pitch
    case 12: case 82: v = 65536; break;            // registers per block, per multiprocessor
    case 13: v = p.clock_khz; break;
    case 14: v = 512; break;                       // texture alignment
    case 15: case 19: case 31: v = 1; break;       // gpu overlap, can map host memory, concurrent kernels
    case 16: v = p.sms; break;
    case 32: v = std::strstr(p.name, "GeForce") == nullptr ? 1 : 0; break;  // ECC: data-center cards
    case 33: v = pci_bus(device); break;
    case 36: v = p.memory_clock_khz; break;
    case 37: v = p.bus_width_bits; break;
    case 38: v = p.l2_bytes; break;
    case 39: v = p.max_threads_per_sm; break;
    case 40: v = 2; break;                         // async engines
    case 41: case 78: case 79: case 80: case 83: v = 1; break;  // unified addressing, priorities, L1, managed
    case 51: v = 32; break;                        // texture pitch alignment
    case 75: v = p.major; break;
    case 76: v = p.minor; break;
    case 81: v = p.smem_per_sm; break;
    case 86: case 89: case 90: case 91: case 95: v = 1; break;  // atomics, managed, preemption, coop launch
    case 97: v = p.smem_per_block_optin; break;
    case 99: case 102: case 103: case 115: v = 1; break;  // host register, VMM, POSIX fd handles, pools
    case 106: v = p.max_blocks_per_sm; break;
    case 111: v = 1024; break;                     // reserved shared memory per block
    case 120: v = p.major >= 9 ? 1 : 0; break;     // cluster launch
    case 125: v = 1; break;                        // IPC events
    default: v = 0;  // includes 128: no fabric handles
  }
  *value = v;
  return Result::kOk;
}

int current_device() {
  return t_device;
}

Result set_current_device(int device) {
  if (!valid_device(device)) return device_count() == 0 ? Result::kNoDevice : Result::kInvalidDevice;
  t_device = device;
  return Result::kOk;
}

// ---- device memory

Result create_context(int device) {
  if (!valid_device(device)) return device_count() == 0 ? Result::kNoDevice : Result::kInvalidDevice;
  State& s = state();
  Lock lock(s.mu);
  s.context(device);
  return Result::kOk;
}

Result mem_info(int device, uint64_t* free, uint64_t* total) {
  Result r = create_context(device);
  if (r != Result::kOk) return r;
  State& s = state();
  Lock lock(s.mu);
  uint64_t t = config().devices[device].total;
  *total = t;
  *free = t - std::min(t, s.devices[device].used);
  return Result::kOk;
}

uint64_t used_bytes(int device) {
  if (!valid_device(device)) return 0;
  State& s = state();
  Lock lock(s.mu);
  return s.devices[device].used;
}

Result malloc_device(int device, size_t size, void** out) {
  Result r = create_context(device);
  if (r != Result::kOk) return r;
  *out = nullptr;
  if (size == 0) return Result::kOk;
  size_t n = round_up(size, kGranularity);
  if (n < size) return Result::kOutOfMemory;  // overflow
  State& s = state();
  Lock lock(s.mu);
  if (!s.charge(device, n)) return Result::kOutOfMemory;
  uintptr_t p = s.arena.take(n, kGranularity);
  if (p == 0 || !commit(p, n)) {
    if (p != 0) s.arena.give(p, n);
    s.uncharge(device, n);
    return Result::kOutOfMemory;
  }
  s.mapped[p] = Mapping{n, device, 0};
  *out = reinterpret_cast<void*>(p);
  return Result::kOk;
}

Result free_device(void* ptr) {
  if (ptr == nullptr) return Result::kOk;
  State& s = state();
  Lock lock(s.mu);
  auto it = s.mapped.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.mapped.end() || it->second.handle != 0) return Result::kInvalidValue;
  decommit(it->first, it->second.size);
  s.arena.give(it->first, it->second.size);
  s.uncharge(it->second.device, it->second.size);
  s.mapped.erase(it);
  return Result::kOk;
}

Result va_reserve(size_t size, size_t alignment, void** out) {
  if (size == 0 || size % kGranularity != 0) return Result::kInvalidValue;
  alignment = std::max(alignment, kGranularity);
  if ((alignment & (alignment - 1)) != 0) return Result::kInvalidValue;
  State& s = state();
  Lock lock(s.mu);
  uintptr_t p = s.arena.take(size, alignment);
  if (p == 0) return Result::kOutOfMemory;
  s.reserved[p] = size;
  *out = reinterpret_cast<void*>(p);
  return Result::kOk;
}

Result va_free(void* ptr, size_t size) {
  State& s = state();
  Lock lock(s.mu);
  auto it = s.reserved.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.reserved.end() || it->second != size) return Result::kInvalidValue;
  s.arena.give(it->first, it->second);
  s.reserved.erase(it);
  return Result::kOk;
}

Result phys_create(int device, size_t size, uint64_t* handle) {
  Result r = create_context(device);
  if (r != Result::kOk) return r;
  if (size == 0 || size % kGranularity != 0) return Result::kInvalidValue;
  State& s = state();
  Lock lock(s.mu);
  if (!s.charge(device, size)) return Result::kOutOfMemory;
  *handle = s.next_handle++;
  s.physical[*handle] = Physical{device, size};
  return Result::kOk;
}

Result phys_release(uint64_t handle) {
  State& s = state();
  Lock lock(s.mu);
  auto it = s.physical.find(handle);
  if (it == s.physical.end() || it->second.released) return Result::kInvalidValue;
  it->second.released = true;
  s.release_physical(handle);
  return Result::kOk;
}

Result phys_size(uint64_t handle, int* device, size_t* size) {
  State& s = state();
  Lock lock(s.mu);
  auto it = s.physical.find(handle);
  if (it == s.physical.end()) return Result::kInvalidValue;
  *device = it->second.device;
  *size = it->second.size;
  return Result::kOk;
}

Result phys_map(void* ptr, size_t size, uint64_t handle) {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  State& s = state();
  Lock lock(s.mu);
  auto ph = s.physical.find(handle);
  if (ph == s.physical.end() || ph->second.released || size != ph->second.size) return Result::kInvalidValue;
  auto r = s.reserved.upper_bound(p);
  if (r == s.reserved.begin()) return Result::kInvalidValue;
  --r;
  if (p + size > r->first + r->second || s.mapping_at(p) != s.mapped.end()) return Result::kInvalidValue;
  if (!commit(p, size)) return Result::kOutOfMemory;
  s.mapped[p] = Mapping{size, ph->second.device, handle};
  ++ph->second.maps;
  return Result::kOk;
}

Result phys_unmap(void* ptr, size_t size) {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  State& s = state();
  Lock lock(s.mu);
  auto it = s.mapped.lower_bound(p);
  if (it == s.mapped.end() || it->first != p) return Result::kInvalidValue;
  while (it != s.mapped.end() && it->first < p + size) {
    if (it->second.handle == 0) return Result::kInvalidValue;
    decommit(it->first, it->second.size);
    uint64_t handle = it->second.handle;
    it = s.mapped.erase(it);
    auto ph = s.physical.find(handle);
    if (ph != s.physical.end()) {
      --ph->second.maps;
      s.release_physical(handle);
    }
  }
  return Result::kOk;
}

// ---- host memory

Result host_alloc(size_t size, void** out) {
  size_t n = round_up(std::max<size_t>(size, 1), static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Result::kOutOfMemory;
  State& s = state();
  Lock lock(s.mu);
  s.host[reinterpret_cast<uintptr_t>(p)] = n;
  s.host_owned.insert(reinterpret_cast<uintptr_t>(p));
  *out = p;
  return Result::kOk;
}

Result host_free(void* ptr) {
  if (ptr == nullptr) return Result::kOk;
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  size_t n = 0;
  {
    State& s = state();
    Lock lock(s.mu);
    auto it = s.host.find(p);
    if (it == s.host.end() || s.host_owned.count(p) == 0) return Result::kInvalidValue;
    n = it->second;
    s.host.erase(it);
    s.host_owned.erase(p);
  }
  munmap(ptr, n);
  return Result::kOk;
}

Result host_register(void* ptr, size_t size) {
  if (ptr == nullptr || size == 0) return Result::kInvalidValue;
  State& s = state();
  Lock lock(s.mu);
  s.host[reinterpret_cast<uintptr_t>(ptr)] = size;
  return Result::kOk;
}

Result host_unregister(void* ptr) {
  State& s = state();
  Lock lock(s.mu);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (s.host_owned.count(p) != 0 || s.host.erase(p) == 0) return Result::kInvalidValue;
  return Result::kOk;
}

PointerInfo pointer_info(const void* ptr) {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  State& s = state();
  Lock lock(s.mu);
  auto it = s.mapping_at(p);
  if (it != s.mapped.end()) {
    return PointerInfo{PointerInfo::kDevice, it->second.device, reinterpret_cast<void*>(it->first), it->second.size};
  }
  auto h = s.host.upper_bound(p);
  if (h != s.host.begin()) {
    --h;
    if (p < h->first + h->second) {
      return PointerInfo{PointerInfo::kHost, t_device, reinterpret_cast<void*>(h->first), h->second};
    }
  }
  return PointerInfo{PointerInfo::kUnregistered, -1, nullptr, 0};
}

bool accessible(const void* ptr, size_t n) {
  State& s = state();
  Lock lock(s.mu);
  return s.accessible(reinterpret_cast<uintptr_t>(ptr), n);
}

Result copy(void* dst, const void* src, size_t n) {
  if (n == 0) return Result::kOk;
  {
    State& s = state();
    Lock lock(s.mu);
    if (!s.accessible(reinterpret_cast<uintptr_t>(dst), n) || !s.accessible(reinterpret_cast<uintptr_t>(src), n)) {
      return Result::kInvalidValue;
    }
  }
  std::memmove(dst, src, n);
  return Result::kOk;
}

Result set(void* dst, int value, size_t n) {
  if (n == 0) return Result::kOk;
  uintptr_t p = reinterpret_cast<uintptr_t>(dst);
  bool device_memory;
  {
    State& s = state();
    Lock lock(s.mu);
    if (!s.accessible(p, n)) return Result::kInvalidValue;
    device_memory = s.arena.contains(p);
  }
  // Zeroing whole pages of device memory drops them instead of writing them:
  // they read back as zeros and cost no host memory (optimizer states and
  // zero-initialized buffers stay free).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uintptr_t first = round_up(p, page), last = (p + n) / page * page;
  if (device_memory && (value & 0xff) == 0 && last > first && last - first >= 16 * page) {
    std::memset(dst, 0, first - p);
    madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    std::memset(reinterpret_cast<void*>(last), 0, p + n - last);
    return Result::kOk;
  }
  std::memset(dst, value, n);
  return Result::kOk;
}

// ---- streams and events

Stream* resolve_stream(const void* handle) {
  uintptr_t h = reinterpret_cast<uintptr_t>(handle);
  State& s = state();
  Lock lock(s.mu);
  if (h <= 2) return valid_device(t_device) ? s.default_stream(t_device) : nullptr;
  Stream* stream = static_cast<Stream*>(const_cast<void*>(handle));
  return s.streams.count(stream) != 0 ? stream : nullptr;
}

Result stream_create(int device, unsigned flags, int priority, Stream** out) {
  Result r = create_context(device);
  if (r != Result::kOk) return r;
  State& s = state();
  Lock lock(s.mu);
  Stream* stream = new Stream{device, flags, priority, false};
  s.streams.insert(stream);
  *out = stream;
  return Result::kOk;
}

Result stream_destroy(Stream* stream) {
  State& s = state();
  Lock lock(s.mu);
  if (stream->is_default || s.streams.erase(stream) == 0) return Result::kInvalidHandle;
  // Events recorded on it keep their answer: complete.
  for (Event* e : s.events) {
    if (e->stream == stream) {
      e->stream = nullptr;
      e->seq = 0;
    }
  }
  delete stream;
  return Result::kOk;
}

int stream_device(const Stream* stream) {
  return stream->device;
}

int stream_priority(const Stream* stream) {
  return stream->priority;
}

unsigned stream_flags(const Stream* stream) {
  return stream->flags;
}

Result stream_query(Stream* stream) {
  State& s = state();
  Lock lock(s.mu);
  if (stream->busy) return Result::kNotReady;
  State::complete(stream, stream->recorded);
  return Result::kOk;
}

Result stream_synchronize(Stream* stream) {
  State& s = state();
  Lock lock(s.mu);
  State::synchronize(stream);
  return Result::kOk;
}

Result device_synchronize(int device) {
  State& s = state();
  Lock lock(s.mu);
  for (Stream* stream : s.streams) {
    if (stream->device == device) State::synchronize(stream);
  }
  return Result::kOk;
}

Result stream_wait_event(Stream* stream, Event* event) {
  State& s = state();
  Lock lock(s.mu);
  // Waiting on an event of a capture joins the capture (a fork in its graph).
  if (event->capture_id != 0 && stream->capture_id == 0 && event->capture_graph != nullptr) {
    for (Stream* other : s.streams) {
      if (other->capture_id == event->capture_id && other->capture_origin) {
        stream->capture_id = event->capture_id;
        stream->capture_graph = event->capture_graph;
        stream->capture_origin = false;
        break;
      }
    }
  }
  return Result::kOk;
}

Event* resolve_event(const void* handle) {
  State& s = state();
  Lock lock(s.mu);
  Event* e = static_cast<Event*>(const_cast<void*>(handle));
  return s.events.count(e) != 0 ? e : nullptr;
}

Result event_create(unsigned flags, Event** out) {
  State& s = state();
  Lock lock(s.mu);
  Event* e = new Event{flags};
  s.events.insert(e);
  *out = e;
  return Result::kOk;
}

Result event_destroy(Event* event) {
  State& s = state();
  Lock lock(s.mu);
  if (s.events.erase(event) == 0) return Result::kInvalidHandle;
  delete event;
  return Result::kOk;
}

Result event_record(Event* event, Stream* stream) {
  State& s = state();
  Lock lock(s.mu);
  event->stream = stream;
  event->host_ns = now_ns();
  if (stream->capture_id != 0) {  // a node of the graph; it never pends
    event->seq = 0;
    event->capture_id = stream->capture_id;
    event->capture_graph = stream->capture_graph;
    ++stream->capture_graph->nodes;
    return Result::kOk;
  }
  event->capture_id = 0;
  event->capture_graph = nullptr;
  event->seq = ++stream->recorded;
  event->polls_left = config().event_polls;
  if (event->polls_left == 0 && !State::blocked(event)) State::complete(stream, event->seq);
  return Result::kOk;
}

Result event_query(Event* event) {
  State& s = state();
  Lock lock(s.mu);
  if (event->stream == nullptr || State::done(event)) return Result::kOk;
  if (State::blocked(event)) return Result::kNotReady;
  if (event->polls_left > 0) {
    --event->polls_left;
    return Result::kNotReady;
  }
  State::complete(event->stream, event->seq);
  return Result::kOk;
}

Result event_synchronize(Event* event) {
  State& s = state();
  Lock lock(s.mu);
  if (event->stream == nullptr || State::done(event)) return Result::kOk;
  if (State::blocked(event)) event->stream->busy = false;  // the busy kernel before it has finished
  State::complete(event->stream, event->seq);
  return Result::kOk;
}

Result event_elapsed_ms(Event* start, Event* end, float* ms) {
  State& s = state();
  Lock lock(s.mu);
  if (((start->flags | end->flags) & kEventDisableTiming) != 0) return Result::kInvalidHandle;
  if (start->stream == nullptr || end->stream == nullptr) return Result::kInvalidHandle;
  if (!State::done(start) || !State::done(end)) return Result::kNotReady;
  *ms = static_cast<float>(static_cast<double>(end->host_ns - start->host_ns) / 1e6);
  return Result::kOk;
}

bool submit(Stream* stream, Work work) {
  State& s = state();
  Lock lock(s.mu);
  if (stream->capture_id != 0) {
    ++stream->capture_graph->nodes;
    return false;
  }
  if (work == Work::kBusyKernel && !stream->busy) {
    stream->busy = true;
    stream->busy_after = stream->recorded;
  }
  return true;
}

// ---- capture and graphs

Result capture_begin(Stream* stream, int mode, Graph* into) {
  State& s = state();
  Lock lock(s.mu);
  if (stream->is_default) return Result::kCaptureUnsupported;
  if (stream->capture_id != 0) return Result::kIllegalState;
  Graph* g = into;
  if (g == nullptr) {
    g = new Graph();
    s.graphs.insert(g);
  }
  stream->capture_id = ++s.next_capture_id;
  stream->capture_graph = g;
  stream->capture_origin = true;
  (void)mode;
  return Result::kOk;
}

Result capture_end(Stream* stream, Graph** out) {
  State& s = state();
  Lock lock(s.mu);
  if (stream->capture_id == 0 || !stream->capture_origin) return Result::kIllegalState;
  uint64_t id = stream->capture_id;
  *out = stream->capture_graph;
  for (Stream* other : s.streams) {
    if (other->capture_id == id) {
      other->capture_id = 0;
      other->capture_graph = nullptr;
      other->capture_origin = false;
    }
  }
  return Result::kOk;
}

void capture_info(const Stream* stream, CaptureStatus* status, uint64_t* id, Graph** graph) {
  State& s = state();
  Lock lock(s.mu);
  if (status != nullptr) *status = stream->capture_id != 0 ? CaptureStatus::kActive : CaptureStatus::kNone;
  if (id != nullptr) *id = stream->capture_id;
  if (graph != nullptr) *graph = stream->capture_graph;
}

int exchange_capture_mode(int mode) {
  int previous = t_capture_mode;
  t_capture_mode = mode;
  return previous;
}

Graph* resolve_graph(const void* handle) {
  State& s = state();
  Lock lock(s.mu);
  Graph* g = static_cast<Graph*>(const_cast<void*>(handle));
  return s.graphs.count(g) != 0 ? g : nullptr;
}

Result graph_create(Graph** out) {
  State& s = state();
  Lock lock(s.mu);
  *out = new Graph();
  s.graphs.insert(*out);
  return Result::kOk;
}

Result graph_destroy(Graph* graph) {
  State& s = state();
  Lock lock(s.mu);
  if (s.graphs.count(graph) == 0) return Result::kInvalidHandle;
  for (Stream* stream : s.streams) {
    if (stream->capture_graph == graph) return Result::kIllegalState;
  }
  s.graphs.erase(graph);
  delete graph;
  return Result::kOk;
}

Result graph_nodes(Graph* graph, void** nodes, size_t* count) {
  State& s = state();
  Lock lock(s.mu);
  if (nodes == nullptr) {
    *count = graph->nodes;
    return Result::kOk;
  }
  while (graph->node_handles.size() < graph->nodes) graph->node_handles.emplace_back(new char);
  size_t n = std::min(*count, graph->nodes);
  for (size_t i = 0; i < n; ++i) nodes[i] = graph->node_handles[i].get();
  *count = n;
  return Result::kOk;
}

Result graph_instantiate(Graph* graph, GraphExec** out) {
  *out = new GraphExec{graph->nodes};
  return Result::kOk;
}

Result graph_exec_destroy(GraphExec* exec) {
  delete exec;
  return Result::kOk;
}

Result graph_launch(GraphExec* exec, Stream* stream) {
  (void)exec;
  submit(stream, Work::kGraph);
  return Result::kOk;
}

// ---- kernels

void register_kernel(const void* host_function, const char* device_name) {
  // torch.cuda._sleep's kernel (at::cuda::spin_kernel): tests use it to keep a
  // stream busy, so that its events stay pending until a synchronization.
  if (device_name == nullptr || std::strstr(device_name, "spin_kernel") == nullptr) return;
  State& s = state();
  Lock lock(s.mu);
  s.busy_kernels.insert(host_function);
}

bool is_busy_kernel(const void* host_function) {
  State& s = state();
  Lock lock(s.mu);
  return !s.busy_kernels.empty() && s.busy_kernels.count(host_function) != 0;
}

}  // namespace vgpu

// ---- for allocscope's Python side

namespace {

std::string json_string(const char* text) {
  std::string out = "\"";
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c == '"' || *c == '\\') out += '\\';
    out += *c;
  }
  return out + "\"";
}

}  // namespace

const char* allocscope_vgpu_presets_json() {
  static const std::string json = [] {
    std::string out = "[";
    for (int i = 0; i < vgpu::kPresetCount; ++i) {
      const vgpu::Preset& p = vgpu::kPresets[i];
      char buf[512];
      std::snprintf(buf, sizeof(buf),
                    "%s{\"key\": %s, \"name\": %s, \"total_memory\": %llu, \"major\": %d, \"minor\": %d, "
                    "\"multi_processor_count\": %d, \"l2_cache_size\": %d}",
                    i == 0 ? "" : ", ", json_string(p.key).c_str(), json_string(p.name).c_str(),
                    static_cast<unsigned long long>(p.total_mib << 20), p.major, p.minor, p.sms, p.l2_bytes);
      out += buf;
    }
    return out + "]";
  }();
  return json.c_str();
}

const char* allocscope_vgpu_state_json() {
  thread_local std::string json;
  json = "{\"event_polls\": " + std::to_string(vgpu::event_polls()) + ", \"devices\": [";
  for (int i = 0; i < vgpu::device_count(); ++i) {
    const vgpu::DeviceInfo* d = vgpu::device(i);
    json += (i == 0 ? "{" : ", {") + std::string("\"key\": ") + json_string(d->preset->key) +
            ", \"total\": " + std::to_string(d->total) + ", \"context_bytes\": " + std::to_string(d->context_bytes) +
            ", \"used\": " + std::to_string(vgpu::used_bytes(i)) + "}";
  }
  json += "]}";
  return json.c_str();
}
