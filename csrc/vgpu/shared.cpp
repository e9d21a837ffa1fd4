// The shared device state (shared.h): a file of fixed layout, mapped
// MAP_SHARED by every process of a run, holding each card's total use and,
// per process, its own use and whether it has a context there. A zero-filled
// file is a valid empty state, so the first process needs no set-up step and
// processes may map it in any order. Only lock-free atomics live in it.
#include "shared.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace vgpu {
namespace shared {
namespace {

constexpr int kDevices = 16;  // as many as ALLOCSCOPE_VGPU may name
constexpr int kSlots = 512;   // processes that ever used a card at the same time
constexpr uint64_t kMagic = 0x616c6c6f63766770ULL;  // "allocvgp"

struct Slot {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> contexts;  // bit d: a context on device d
  std::atomic<uint64_t> used[kDevices];
};

struct File {
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> used[kDevices];
  std::atomic<uint32_t> contexts_created[kDevices];  // by any process, ever
  Slot slots[kSlots];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "the shared state needs lock-free atomics");

struct Mine {
  File* file = nullptr;
  Slot* slot = nullptr;
};

// A process that ended without giving its memory back (killed) no longer
// holds it, as on a card: its slot's use is returned to the cards.
void sweep(File* f) {
  for (Slot& s : f->slots) {
    int32_t pid = s.pid.load();
    if (pid == 0 || pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (!s.pid.compare_exchange_strong(pid, -1)) continue;
    for (int d = 0; d < kDevices; ++d) f->used[d].fetch_sub(s.used[d].exchange(0));
    s.contexts.store(0);
    s.pid.store(0);
  }
}

Mine open_file() {
  Mine m;
  const char* path = std::getenv("ALLOCSCOPE_VGPU_SHARED");
  if (path == nullptr || *path == '\0') return m;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, sizeof(File)) != 0) {
    std::fprintf(stderr, "allocscope vgpu: cannot share the cards through %s; this process has them to itself\n",
                 path);
    if (fd >= 0) close(fd);
    return m;
  }
  void* p = mmap(nullptr, sizeof(File), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return m;
  File* f = static_cast<File*>(p);
  uint64_t zero = 0;
  f->magic.compare_exchange_strong(zero, kMagic);
  if (f->magic.load() != kMagic) {
    std::fprintf(stderr, "allocscope vgpu: %s is not a shared device state; this process has the cards to itself\n",
                 path);
    munmap(p, sizeof(File));
    return m;
  }
  sweep(f);
  int32_t me = getpid();
  for (Slot& s : f->slots) {
    int32_t free_slot = 0;
    if (s.pid.compare_exchange_strong(free_slot, me)) {
      m.file = f;
      m.slot = &s;
      return m;
    }
  }
  std::fprintf(stderr, "allocscope vgpu: more than %d processes share %s; this one has the cards to itself\n",
               kSlots, path);
  munmap(p, sizeof(File));
  return m;
}

Mine* g_mine = nullptr;  // set once the file was looked for

Mine& mine() {
  static Mine m = open_file();
  g_mine = &m;
  return m;
}

// At exit (normal or by a signal that lets destructors run), a process gives
// its memory back, as a real process's context teardown does.
__attribute__((destructor)) void give_back() {
  if (g_mine == nullptr) return;
  Mine& m = *g_mine;
  if (m.slot == nullptr || m.slot->pid.load() != getpid()) return;  // a forked child: its parent's slot
  for (int d = 0; d < kDevices; ++d) m.file->used[d].fetch_sub(m.slot->used[d].exchange(0));
  m.slot->contexts.store(0);
  m.slot->pid.store(0);
}

}  // namespace

bool enabled() { return mine().slot != nullptr; }

bool charge(int device, uint64_t n, uint64_t total, bool force) {
  Mine& m = mine();
  if (m.slot == nullptr || device < 0 || device >= kDevices) return true;
  std::atomic<uint64_t>& used = m.file->used[device];
  uint64_t now = used.load();
  do {
    if (!force && now + n > total) return false;
  } while (!used.compare_exchange_weak(now, now + n));
  m.slot->used[device].fetch_add(n);
  return true;
}

void uncharge(int device, uint64_t n) {
  Mine& m = mine();
  if (m.slot == nullptr || device < 0 || device >= kDevices) return;
  m.file->used[device].fetch_sub(n);
  m.slot->used[device].fetch_sub(n);
}

void note_context(int device) {
  Mine& m = mine();
  if (m.slot == nullptr || device < 0 || device >= kDevices) return;
  m.slot->contexts.fetch_or(1u << device);
  m.file->contexts_created[device].fetch_add(1);
}

int contexts_created(int device) {
  Mine& m = mine();
  return m.slot == nullptr || device < 0 || device >= kDevices ? 0
                                                                : static_cast<int>(m.file->contexts_created[device]);
}

uint64_t used(int device) {
  Mine& m = mine();
  return m.slot == nullptr || device < 0 || device >= kDevices ? 0 : m.file->used[device].load();
}

uint64_t others(int device, int* contexts) {
  *contexts = 0;
  Mine& m = mine();
  if (m.slot == nullptr || device < 0 || device >= kDevices) return 0;
  uint64_t bytes = 0;
  for (Slot& s : m.file->slots) {
    if (&s == m.slot || s.pid.load() <= 0) continue;
    bytes += s.used[device].load();
    if (s.contexts.load() & (1u << device)) ++*contexts;
  }
  return bytes;
}

}  // namespace shared
}  // namespace vgpu
