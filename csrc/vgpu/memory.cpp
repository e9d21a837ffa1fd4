// Device memory: one reserved range of address space carved into device
// allocations, the physical handles of the driver's virtual memory
// management, host registrations, and each device's accounting (core.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core.h"
#include "shared.h"

namespace vgpu {
namespace {

size_t round_up(size_t n, size_t unit) {
  return (n + unit - 1) / unit * unit;
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
    // (smaller ranges for what limits address space: valgrind gives a
    // program tens of GiB; then only a card whose memory fits can be made)
    for (size_t gib : {16384, 4096, 1024, 256, 64, 16}) {
      size_t want = gib << 30;
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
  bool nccl = false;  // NCCL's own buffers (malloc_nccl)
};

struct Physical {
  int device;
  size_t size;
  int maps = 0;
  bool released = false;
};

struct DeviceMemory {
  uint64_t used = 0;  // by this process
  uint64_t nccl = 0;  // of which NCCL's own buffers
  uint64_t nccl_peak = 0;
  bool context = false;
};

struct Memory {
  std::mutex mu;
  Arena arena;
  std::map<uintptr_t, Mapping> mapped;
  std::map<uintptr_t, size_t> reserved;  // va_reserve ranges
  std::unordered_map<uint64_t, Physical> physical;
  uint64_t next_handle = 1;
  std::map<uintptr_t, size_t> host;  // host_alloc (owned) and host_register ranges
  std::unordered_set<uintptr_t> host_owned;
  std::vector<DeviceMemory> devices;

  Memory() : devices(static_cast<size_t>(device_count())) {}

  // What the card has in use: every process's where the cards are shared.
  uint64_t card_used(int device) {
    return shared::enabled() ? shared::used(device) : devices[device].used;
  }

  bool charge(int device, uint64_t n) {
    DeviceMemory& d = devices[device];
    uint64_t total = vgpu::device(device)->total;
    if (shared::enabled() ? !shared::charge(device, n, total, false) : d.used + n > total) return false;
    d.used += n;
    return true;
  }
  void uncharge(int device, uint64_t n) {
    n = std::min(devices[device].used, n);
    devices[device].used -= n;
    shared::uncharge(device, n);
  }

  void context(int device) {
    DeviceMemory& d = devices[device];
    if (d.context) return;
    d.context = true;
    uint64_t n = vgpu::device(device)->context_bytes;
    d.used += n;
    shared::charge(device, n, 0, /*force=*/true);
    shared::note_context(device);
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
};

Memory& state() {
  static Memory* m = new Memory();  // never destroyed: CUDA calls may come during exit
  return *m;
}

using Lock = std::lock_guard<std::mutex>;

Result no_device(int device) {
  return device_count() == 0 ? Result::kNoDevice : Result::kInvalidDevice;
}

}  // namespace

// ---- device memory

Result create_context(int device) {
  if (vgpu::device(device) == nullptr) return no_device(device);
  Memory& s = state();
  Lock lock(s.mu);
  s.context(device);
  return Result::kOk;
}

Result mem_info(int device, uint64_t* free, uint64_t* total) {
  Result r = create_context(device);
  if (r != Result::kOk) return r;
  Memory& s = state();
  Lock lock(s.mu);
  uint64_t t = vgpu::device(device)->total;
  *total = t;
  *free = t - std::min(t, s.card_used(device));
  return Result::kOk;
}

uint64_t used_bytes(int device) {
  if (vgpu::device(device) == nullptr) return 0;
  Memory& s = state();
  Lock lock(s.mu);
  return s.card_used(device);
}

bool has_context(int device) {
  if (vgpu::device(device) == nullptr) return false;
  Memory& s = state();
  Lock lock(s.mu);
  return s.devices[device].context;
}

uint64_t own_bytes(int device) {
  if (vgpu::device(device) == nullptr) return 0;
  Memory& s = state();
  Lock lock(s.mu);
  return s.devices[device].used;
}

uint64_t other_process_bytes(int device, int* contexts) {
  *contexts = 0;
  if (vgpu::device(device) == nullptr) return 0;
  return shared::others(device, contexts);
}

Result malloc_nccl(int device, size_t size, void** out) {
  Result r = malloc_device(device, size, out);
  if (r == Result::kOk && *out != nullptr) {
    Memory& s = state();
    Lock lock(s.mu);
    s.mapped[reinterpret_cast<uintptr_t>(*out)].nccl = true;
    DeviceMemory& d = s.devices[device];
    d.nccl += s.mapped[reinterpret_cast<uintptr_t>(*out)].size;
    d.nccl_peak = std::max(d.nccl_peak, d.nccl);
  }
  return r;
}

uint64_t nccl_bytes(int device, uint64_t* peak) {
  if (vgpu::device(device) == nullptr) return 0;
  Memory& s = state();
  Lock lock(s.mu);
  if (peak != nullptr) *peak = s.devices[device].nccl_peak;
  return s.devices[device].nccl;
}

int contexts_created(int device) {
  if (vgpu::device(device) == nullptr) return 0;
  if (!shared::enabled()) return state().devices[device].context ? 1 : 0;
  return shared::contexts_created(device);
}

Result malloc_device(int device, size_t size, void** out) {
  Result r = create_context(device);
  if (r != Result::kOk) return r;
  *out = nullptr;
  if (size == 0) return Result::kOk;
  size_t n = round_up(size, kGranularity);
  if (n < size) return Result::kOutOfMemory;  // overflow
  Memory& s = state();
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
  Memory& s = state();
  Lock lock(s.mu);
  auto it = s.mapped.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.mapped.end() || it->second.handle != 0) return Result::kInvalidValue;
  decommit(it->first, it->second.size);
  s.arena.give(it->first, it->second.size);
  s.uncharge(it->second.device, it->second.size);
  if (it->second.nccl) s.devices[it->second.device].nccl -= it->second.size;
  s.mapped.erase(it);
  return Result::kOk;
}

// Mapping::handle of memory opened from another process's IPC handle.
constexpr uint64_t kImported = ~uint64_t{0};

Result ipc_import(int device, size_t size, void** out) {
  if (vgpu::device(device) == nullptr) return Result::kInvalidDevice;
  if (size == 0 || size % kGranularity != 0) return Result::kInvalidValue;
  Memory& s = state();
  Lock lock(s.mu);
  uintptr_t p = s.arena.take(size, kGranularity);
  if (p == 0 || !commit(p, size)) {
    if (p != 0) s.arena.give(p, size);
    return Result::kOutOfMemory;
  }
  s.mapped[p] = Mapping{size, device, kImported};
  *out = reinterpret_cast<void*>(p);
  return Result::kOk;
}

Result ipc_close(void* ptr) {
  Memory& s = state();
  Lock lock(s.mu);
  auto it = s.mapped.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.mapped.end() || it->second.handle != kImported) return Result::kInvalidValue;
  decommit(it->first, it->second.size);
  s.arena.give(it->first, it->second.size);
  s.mapped.erase(it);
  return Result::kOk;
}

Result va_reserve(size_t size, size_t alignment, void** out) {
  if (size == 0 || size % kGranularity != 0) return Result::kInvalidValue;
  alignment = std::max(alignment, kGranularity);
  if ((alignment & (alignment - 1)) != 0) return Result::kInvalidValue;
  Memory& s = state();
  Lock lock(s.mu);
  uintptr_t p = s.arena.take(size, alignment);
  if (p == 0) return Result::kOutOfMemory;
  s.reserved[p] = size;
  *out = reinterpret_cast<void*>(p);
  return Result::kOk;
}

Result va_free(void* ptr, size_t size) {
  Memory& s = state();
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
  Memory& s = state();
  Lock lock(s.mu);
  if (!s.charge(device, size)) return Result::kOutOfMemory;
  *handle = s.next_handle++;
  s.physical[*handle] = Physical{device, size};
  return Result::kOk;
}

Result phys_release(uint64_t handle) {
  Memory& s = state();
  Lock lock(s.mu);
  auto it = s.physical.find(handle);
  if (it == s.physical.end() || it->second.released) return Result::kInvalidValue;
  it->second.released = true;
  s.release_physical(handle);
  return Result::kOk;
}

Result phys_size(uint64_t handle, int* device, size_t* size) {
  Memory& s = state();
  Lock lock(s.mu);
  auto it = s.physical.find(handle);
  if (it == s.physical.end()) return Result::kInvalidValue;
  *device = it->second.device;
  *size = it->second.size;
  return Result::kOk;
}

Result phys_map(void* ptr, size_t size, uint64_t handle) {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  Memory& s = state();
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
  Memory& s = state();
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
  Memory& s = state();
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
    Memory& s = state();
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
  Memory& s = state();
  Lock lock(s.mu);
  s.host[reinterpret_cast<uintptr_t>(ptr)] = size;
  return Result::kOk;
}

Result host_unregister(void* ptr) {
  Memory& s = state();
  Lock lock(s.mu);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (s.host_owned.count(p) != 0 || s.host.erase(p) == 0) return Result::kInvalidValue;
  return Result::kOk;
}

PointerInfo pointer_info(const void* ptr) {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  Memory& s = state();
  Lock lock(s.mu);
  auto it = s.mapping_at(p);
  if (it != s.mapped.end()) {
    return PointerInfo{PointerInfo::kDevice, it->second.device, reinterpret_cast<void*>(it->first), it->second.size};
  }
  auto h = s.host.upper_bound(p);
  if (h != s.host.begin()) {
    --h;
    if (p < h->first + h->second) {
      return PointerInfo{PointerInfo::kHost, current_device(), reinterpret_cast<void*>(h->first), h->second};
    }
  }
  return PointerInfo{PointerInfo::kUnregistered, -1, nullptr, 0};
}

bool accessible(const void* ptr, size_t n) {
  Memory& s = state();
  Lock lock(s.mu);
  return s.accessible(reinterpret_cast<uintptr_t>(ptr), n);
}

namespace {

// Device memory never touched since it was mapped reads as zeros and costs
// no host memory. A copy from it would write those zeros into the
// destination and make its pages cost host memory (a model's clone of a
// gradient no kernel computed, say). So where whole destination pages come
// from untouched source pages, they are dropped instead, and read back as
// zeros: the same bytes, no host memory. /proc/self/pagemap tells which
// pages are untouched: neither present nor swapped.
class Pagemap {
 public:
  Pagemap() : fd_(open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC)) {}
  ~Pagemap() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  // untouched[i]: whether page `first_page + i` is untouched; false where unknown.
  void read(uintptr_t first_page, size_t pages, std::vector<char>* untouched) const {
    constexpr uint64_t kPresent = 1ull << 63, kSwapped = 1ull << 62;
    untouched->assign(pages, 0);
    std::vector<uint64_t> entries(std::min<size_t>(pages, 1 << 16));
    for (size_t done = 0; done < pages;) {
      size_t want = std::min(entries.size(), pages - done);
      ssize_t got = pread(fd_, entries.data(), want * 8, static_cast<off_t>((first_page + done) * 8));
      if (got <= 0) return;
      size_t n = static_cast<size_t>(got) / 8;
      for (size_t i = 0; i < n; ++i) (*untouched)[done + i] = (entries[i] & (kPresent | kSwapped)) == 0;
      done += n;
    }
  }

 private:
  int fd_;
};

void copy_device_pages(uintptr_t d, uintptr_t s, size_t n, size_t page) {
  static const Pagemap pagemap;
  uintptr_t first = round_up(d, page), last = (d + n) / page * page;  // the destination's whole pages
  if (!pagemap.ok() || last <= first) {
    std::memmove(reinterpret_cast<void*>(d), reinterpret_cast<const void*>(s), n);
    return;
  }
  const uintptr_t shift = s - d;  // source address = destination address + shift (mod 2^64)
  uintptr_t src_first = (first + shift) / page, src_last = (last - 1 + shift) / page;
  std::vector<char> untouched;
  pagemap.read(src_first, src_last - src_first + 1, &untouched);
  auto zero_source = [&](uintptr_t p) {  // does destination page p come from untouched pages only?
    return untouched[(p + shift) / page - src_first] && untouched[(p + page - 1 + shift) / page - src_first];
  };
  std::memmove(reinterpret_cast<void*>(d), reinterpret_cast<const void*>(s), first - d);
  for (uintptr_t run = first; run < last;) {
    bool zero = zero_source(run);
    uintptr_t end = run + page;
    while (end < last && zero_source(end) == zero) end += page;
    if (zero) {
      madvise(reinterpret_cast<void*>(run), end - run, MADV_DONTNEED);
    } else {
      std::memmove(reinterpret_cast<void*>(run), reinterpret_cast<const void*>(run + shift), end - run);
    }
    run = end;
  }
  std::memmove(reinterpret_cast<void*>(last), reinterpret_cast<const void*>(last + shift), d + n - last);
}

}  // namespace

Result copy(void* dst, const void* src, size_t n) {
  if (n == 0) return Result::kOk;
  uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  bool device_to_device;
  {
    Memory& m = state();
    Lock lock(m.mu);
    if (!m.accessible(d, n) || !m.accessible(s, n)) return Result::kInvalidValue;
    device_to_device = m.arena.contains(d) && m.arena.contains(s);
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bool overlap = d < s + n && s < d + n;
  if (device_to_device && !overlap && n >= 16 * page) {
    copy_device_pages(d, s, n, page);
    return Result::kOk;
  }
  std::memmove(dst, src, n);
  return Result::kOk;
}

Result set(void* dst, int value, size_t n) {
  if (n == 0) return Result::kOk;
  uintptr_t p = reinterpret_cast<uintptr_t>(dst);
  bool device_memory;
  {
    Memory& s = state();
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

}  // namespace vgpu
