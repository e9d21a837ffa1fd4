// Small broadcasts move real bytes between the processes of a run
// (nccl_exchange.h).
#include "nccl_exchange.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core.h"

namespace vgpu {
namespace nccl {
namespace {

constexpr size_t kExchangeMax = 1 << 20;
constexpr auto kExchangeWait = std::chrono::seconds(60);

const char* exchange_dir() {
  static const char* dir = [] {
    const char* d = std::getenv("ALLOCSCOPE_VGPU_EXCHANGE");
    return d != nullptr && *d != '\0' ? d : nullptr;
  }();
  return dir;
}

// Whether the communicator's ranks that run are listed (COMM.running: comma
// separated) and `root` is not among them.
bool root_does_not_run(const char* dir, uint64_t comm, int root) {
  char path[4096];
  std::snprintf(path, sizeof(path), "%s/%016llx.running", dir, static_cast<unsigned long long>(comm));
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return false;  // not listed: every rank runs, or nothing is known
  bool listed = false;
  for (int r; std::fscanf(f, "%d", &r) == 1;) {
    listed = listed || r == root;
    if (std::fgetc(f) != ',') break;
  }
  std::fclose(f);
  return !listed;
}

}  // namespace

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void exchange_broadcast(uint64_t comm, uint64_t number, int rank, int root, const void* send, void* recv,
                        size_t bytes) {
  if (exchange_dir() == nullptr || bytes == 0 || bytes > kExchangeMax) return;
  char path[4096];
  std::snprintf(path, sizeof(path), "%s/%016llx-%llu", exchange_dir(), static_cast<unsigned long long>(comm),
                static_cast<unsigned long long>(number));
  if (rank == root) {
    std::string tmp = std::string(path) + ".tmp" + std::to_string(getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) return;
    bool ok = std::fwrite(send, 1, bytes, f) == bytes;
    ok = std::fclose(f) == 0 && ok;
    if (ok) std::rename(tmp.c_str(), path);  // whole or not at all, for the readers
    else std::remove(tmp.c_str());
    return;
  }
  if (root_does_not_run(exchange_dir(), comm, root)) return;
  auto deadline = std::chrono::steady_clock::now() + kExchangeWait;
  for (auto pause = std::chrono::microseconds(50);; pause = std::min(pause * 2, std::chrono::microseconds(20000))) {
    FILE* f = std::fopen(path, "rb");
    if (f != nullptr) {
      std::vector<char> data(bytes);
      size_t got = std::fread(data.data(), 1, bytes, f);
      std::fclose(f);
      if (got == bytes) vgpu::copy(recv, data.data(), bytes);
      return;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "allocscope vgpu: rank %d waited %llds for rank %d's broadcast; its buffer is left as "
                   "it was\n", rank, static_cast<long long>(kExchangeWait.count()), root);
      return;
    }
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace nccl
}  // namespace vgpu
