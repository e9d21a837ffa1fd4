// libnccl.so.2: NCCL on the virtual GPU (docs/vgpu.md, "NCCL").
//
// Communicators are created without talking to any peer: a rank needs
// nothing from the others to allocate what it allocates, so one rank of a
// 1,024-rank job runs alone, and the ranks of a multi-process run never
// wait for each other here (torch's store still synchronizes them). Every
// collective, point-to-point operation and signal is work enqueued on its
// stream as a kernel is; no data moves between processes. Values are
// meaningless, as everywhere on the virtual GPU, with one rule that keeps
// metadata exchanges consistent: every other rank is taken to have sent what
// this rank sent, so a gather (all-gather, gather, all-to-all) writes this
// rank's contribution into every rank's slot (DDP's check that all ranks
// hold the same parameters, object collectives' sizes).
//
// NCCL's own device memory is charged to the device outside the caching
// allocator, when the real library allocates it (NCCL >= 2.22 connects
// peers at their first use), with the model below; ncclCommMemStats reports
// it. ncclMemAlloc charges the device as cudaMalloc does.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "core.h"
#include "nccl_exchange.h"

#define API extern "C" __attribute__((visibility("default")))

// ---- the memory model (docs/vgpu.md, "NCCL's own memory")

namespace {

constexpr uint64_t kMiB = 1ull << 20;
// NCCL allocates its device memory with cuMem in 2 MiB granules: an
// allocation of 4 B takes 2 MiB (NCCL_DEBUG_SUBSYS=ALLOC on an H100, NCCL
// 2.28.9: consecutive pointers 0x200000 apart; NVIDIA/nccl#1685).
constexpr uint64_t kGranule = 2 * kMiB;
// A communicator's channels at its initialisation, of any size, one rank
// included: three allocations per channel (src/channel.cc initChannel: the
// shared devPeers, the channel's devPeers, devRingUserRanks) and two for the
// communicator (src/init.cc): (3 x 64 + 2) granules for a communicator of one
// rank on an H100, measured (tests/data/nccl_stages_h100.json). They are
// given back when it is destroyed, not when it is suspended.
constexpr uint64_t kChannelAllocations = 3;
constexpr uint64_t kCommAllocations = 2;
// A communicator of one rank opens NCCL's most channels (MAXCHANNELS).
constexpr int kMaxChannels = 64;
// NCCL's kernels, loaded by the process's first communicator on a device and
// kept until the process ends (its init timings' "kernels"; the same with
// CUDA_MODULE_LOADING=EAGER): 184,549,376 B on an H100 with NCCL 2.28.9.
constexpr uint64_t kKernelBytes = 88 * kGranule;
// One connection's receive buffers with NCCL's default protocol sizes
// (NVIDIA/nccl src/init.cc, NCCL_BUFFSIZE / NCCL_LL_BUFFSIZE /
// NCCL_LL128_BUFFSIZE defaults: Simple 4 MiB + LL 512 KiB + LL128 ~4.69 MiB),
// allocated in 2 MiB units: 10 MiB.
constexpr uint64_t kConnectionBytes = 10 * kMiB;
// A point-to-point peer (send/recv, all-to-all): on every channel, one
// connection's buffers and its send and receive structures, a granule each:
// 8 x H100 all-to-all grew by 3.28 GB = 7 peers x 32 channels x 14 MiB at the
// first all_to_all_single (NVIDIA/nccl#1685, whose ALLOC log shows 10 MiB and
// 2 MiB allocations and 32 channels per pair).
constexpr uint64_t kP2pBytesPerChannel = kConnectionBytes + 2 * kGranule;
// NVLink SHARP buffers on Hopper with more than two local ranks
// (nvlsPerRankSize, 301,989,888 B; NCCL_NVLS_ENABLE=0 turns NVLS off).
constexpr uint64_t kNvlsBytes = 288 * kMiB;

int channel_cap(int n) {
  if (const char* cap = std::getenv("NCCL_MAX_NCHANNELS")) {
    int c = std::atoi(cap);
    if (c > 0 && c < n) n = c;
  }
  return n;
}

// Channels NCCL opens on a card of this kind: its topology search finds the
// ring's channels (12 on an A100 NVSwitch node, 16 with Hopper's NVLink 4) and
// ncclTopoPostset doubles them; the totals users report agree (4xA100:
// 544-688 MB per communicator, nccl#964; 8xH100: 1.06 GB with NVLS,
// nccl#1685). NCCL_MAX_NCHANNELS caps it as it caps the real library.
int channels(int device) {
  const vgpu::DeviceInfo* d = vgpu::device(device);
  int n = 4;  // PCIe cards
  if (d != nullptr && vgpu::has_nvlink(*d->preset)) n = d->preset->major >= 9 ? 32 : d->preset->major == 8 ? 24 : 12;
  return channel_cap(n);
}

// What a communicator allocates at its initialisation.
uint64_t channel_state_bytes(int device, int nranks) {
  int n = nranks == 1 ? channel_cap(kMaxChannels) : channels(device);
  return (kChannelAllocations * n + kCommAllocations) * kGranule;
}

bool nvls_enabled(int device, int nranks) {
  const vgpu::DeviceInfo* d = vgpu::device(device);
  const char* env = std::getenv("NCCL_NVLS_ENABLE");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  // NVLS spans the ranks of one NVLink domain: a node's.
  int local = nranks;
  if (const char* l = std::getenv("LOCAL_WORLD_SIZE")) local = std::min(nranks, std::max(1, std::atoi(l)));
  return d != nullptr && d->preset->major >= 9 && local > 2;
}

thread_local std::string last_error;

ncclResult_t fail(ncclResult_t r, const std::string& why) {
  last_error = why;
  return r;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

}  // namespace

struct ncclComm {
  int nranks;
  int rank;
  int device;
  uint64_t id = 0;          // the same in every rank of the communicator (its unique id's hash)
  uint64_t broadcasts = 0;  // small broadcasts exchanged so far (exchange_broadcast)
  uint64_t splits = 0;
  bool collectives_connected = false;
  std::set<int> p2p_peers;
  std::vector<void*> buffers;  // NCCL's connections: given back when suspended
  uint64_t bytes = 0;
  std::vector<void*> persistent;  // the channels' state: given back when destroyed
  uint64_t persistent_bytes = 0;
  bool suspended = false;
  bool destroyed = false;
};

struct ncclWindow_vidmem {
  void* base;
  size_t size;
};

namespace {

std::mutex mu;
std::unordered_set<ncclComm*> comms;

bool valid(ncclComm* c) {
  std::lock_guard<std::mutex> lock(mu);
  return c != nullptr && comms.count(c) != 0 && !c->destroyed;
}

ncclResult_t take(ncclComm* c, uint64_t bytes, bool persistent = false) {
  void* p = nullptr;
  if (vgpu::malloc_nccl(c->device, bytes, &p) != vgpu::Result::kOk) {
    return fail(ncclUnhandledCudaError, "Cuda failure 'out of memory' (NCCL's buffers on the virtual GPU)");
  }
  (persistent ? c->persistent : c->buffers).push_back(p);
  (persistent ? c->persistent_bytes : c->bytes) += bytes;
  return ncclSuccess;
}

// NCCL's kernels, once per device in the process (never given back).
ncclResult_t load_kernels(int device) {
  static std::set<int> loaded;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!loaded.insert(device).second) return ncclSuccess;
  }
  void* p = nullptr;
  if (vgpu::malloc_nccl(device, kKernelBytes, &p) != vgpu::Result::kOk) {
    std::lock_guard<std::mutex> lock(mu);
    loaded.erase(device);  // not loaded: the next communicator tries again
    return fail(ncclUnhandledCudaError, "Cuda failure 'out of memory' (NCCL's kernels on the virtual GPU)");
  }
  return ncclSuccess;
}

void release(ncclComm* c) {
  for (void* p : c->buffers) vgpu::free_device(p);
  c->buffers.clear();
  c->bytes = 0;
  c->collectives_connected = false;
  c->p2p_peers.clear();
}

// The first collective connects every channel to its ring neighbours (one
// connection each way), and NVLS where it is on.
ncclResult_t connect_collectives(ncclComm* c) {
  if (c->collectives_connected || c->nranks < 2) return ncclSuccess;
  c->collectives_connected = true;
  ncclResult_t r = take(c, 2 * channels(c->device) * kConnectionBytes);
  if (r == ncclSuccess && nvls_enabled(c->device, c->nranks)) r = take(c, kNvlsBytes);
  return r;
}

ncclResult_t connect_peer(ncclComm* c, int peer) {
  if (peer == c->rank || c->nranks < 2 || !c->p2p_peers.insert(peer).second) return ncclSuccess;
  return take(c, channels(c->device) * kP2pBytesPerChannel);
}

ncclResult_t enqueue(ncclComm* c, cudaStream_t stream) {
  vgpu::Stream* s = vgpu::resolve_stream(stream);
  if (s == nullptr) return fail(ncclInvalidArgument, "invalid stream");
  vgpu::submit(s, vgpu::Work::kKernel);
  return ncclSuccess;
}

ncclResult_t collective(ncclComm* c, cudaStream_t stream) {
  if (!valid(c)) return fail(ncclInvalidArgument, "invalid communicator");
  if (c->suspended) return fail(ncclInvalidUsage, "communicator is suspended");
  ncclResult_t r = connect_collectives(c);
  return r != ncclSuccess ? r : enqueue(c, stream);
}

// Every rank's slot of a gather receives this rank's contribution.
void fill_slots(void* recv, const void* send, size_t bytes, int slots) {
  if (bytes == 0 || recv == nullptr || send == nullptr) return;
  char* out = static_cast<char*>(recv);
  for (int i = 0; i < slots; ++i) {
    if (out + i * bytes != send) vgpu::copy(out + i * bytes, send, bytes);
  }
}

void exchange_broadcast(ncclComm* c, const void* send, void* recv, size_t bytes, int root) {
  if (c->nranks > 1) vgpu::nccl::exchange_broadcast(c->id, c->broadcasts++, c->rank, root, send, recv, bytes);
}

ncclResult_t new_comm(ncclComm_t* out, int nranks, int rank, int device, uint64_t id = 0) {
  if (out == nullptr) return fail(ncclInvalidArgument, "comm is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "invalid rank or size");
  if (vgpu::create_context(device) != vgpu::Result::kOk) return fail(ncclUnhandledCudaError, "no such device");
  auto* c = new ncclComm{nranks, rank, device, id};
  ncclResult_t r = load_kernels(device);
  if (r == ncclSuccess) r = take(c, channel_state_bytes(device, nranks), true);
  if (r != ncclSuccess) {  // out of memory at initialisation: no communicator
    for (void* p : c->persistent) vgpu::free_device(p);
    delete c;
    return r;
  }
  std::lock_guard<std::mutex> lock(mu);
  comms.insert(c);
  *out = c;
  return ncclSuccess;
}

}  // namespace

// ---- versions, ids, errors

API ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < sizeof(id->internal); i += 8) {
    uint64_t v = rng();
    std::memcpy(id->internal + i, &v, std::min<size_t>(8, sizeof(id->internal) - i));
  }
  return ncclSuccess;
}

API const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

API const char* ncclGetLastError(ncclComm_t) {
  return last_error.c_str();
}

// ---- communicators

API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return new_comm(comm, nranks, rank, vgpu::current_device(), vgpu::nccl::fnv1a(&id, sizeof(id)));
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t*) {
  return new_comm(comm, nranks, rank, vgpu::current_device(), vgpu::nccl::fnv1a(&id, sizeof(id)));
}

API ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nids, ncclUniqueId* ids,
                                          ncclConfig_t*) {
  uint64_t id = nids > 0 && ids != nullptr ? vgpu::nccl::fnv1a(ids, sizeof(*ids)) : 0;
  return new_comm(comm, nranks, rank, vgpu::current_device(), id);
}

API ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  if (comm == nullptr || ndev < 1) return ncclInvalidArgument;
  for (int i = 0; i < ndev; ++i) {
    ncclResult_t r = new_comm(&comm[i], ndev, i, devlist != nullptr ? devlist[i] : i);
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}

// A split communicator's size is known only to the ranks that share its
// color: it is modelled with its parent's (an upper bound).
API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int, ncclComm_t* newcomm, ncclConfig_t*) {
  if (!valid(comm)) return ncclInvalidArgument;
  // Every rank of the parent splits in the same order (those left out too):
  // the parent's id, the split's number and the color name the child in
  // all of its ranks.
  uint64_t name[3] = {comm->id, comm->splits++, static_cast<uint64_t>(static_cast<int64_t>(color))};
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  return new_comm(newcomm, comm->nranks, std::min(comm->rank, comm->nranks - 1), comm->device,
                  vgpu::nccl::fnv1a(name, sizeof(name)));
}

API ncclResult_t ncclCommShrink(ncclComm_t comm, int*, int exclude_count, ncclComm_t* newcomm, ncclConfig_t*, int) {
  if (!valid(comm)) return ncclInvalidArgument;
  int n = std::max(1, comm->nranks - std::max(0, exclude_count));
  uint64_t name[3] = {comm->id, comm->splits++, ~0ull};
  return new_comm(newcomm, n, std::min(comm->rank, n - 1), comm->device, vgpu::nccl::fnv1a(name, sizeof(name)));
}

API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return valid(comm) ? ncclSuccess : ncclInvalidArgument;
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (!valid(comm)) return ncclInvalidArgument;
  release(comm);
  for (void* p : comm->persistent) vgpu::free_device(p);
  comm->persistent.clear();
  comm->persistent_bytes = 0;
  std::lock_guard<std::mutex> lock(mu);
  comm->destroyed = true;  // the handle stays invalid, never reused
  comms.erase(comm);
  return ncclSuccess;
}

API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return ncclCommDestroy(comm);
}

API ncclResult_t ncclCommRevoke(ncclComm_t comm, int) {
  return valid(comm) ? ncclSuccess : ncclInvalidArgument;
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (error == nullptr) return ncclInvalidArgument;
  *error = ncclSuccess;
  return ncclSuccess;
}

API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!valid(comm) || count == nullptr) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!valid(comm) || device == nullptr) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!valid(comm) || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

// ---- memory: registration costs no device memory; ncclMemAlloc is cudaMalloc

API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return ncclInvalidArgument;
  vgpu::Result r = vgpu::malloc_device(vgpu::current_device(), size, ptr);
  return r == vgpu::Result::kOk ? ncclSuccess : fail(ncclUnhandledCudaError, "Cuda failure 'out of memory'");
}

API ncclResult_t ncclMemFree(void* ptr) {
  return vgpu::free_device(ptr) == vgpu::Result::kOk ? ncclSuccess : ncclInvalidArgument;
}

API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (!valid(comm) || handle == nullptr) return ncclInvalidArgument;
  *handle = buff;
  return ncclSuccess;
}

API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void*) {
  return valid(comm) ? ncclSuccess : ncclInvalidArgument;
}

API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int) {
  if (!valid(comm) || win == nullptr) return ncclInvalidArgument;
  *win = new ncclWindow_vidmem{buff, size};
  return ncclSuccess;
}

API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  delete win;
  return ncclSuccess;
}

// ---- reduction operators

API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void*, ncclDataType_t, ncclScalarResidence_t,
                                          ncclComm_t comm) {
  if (op == nullptr || !valid(comm)) return ncclInvalidArgument;
  *op = ncclNumOps;  // the first dynamic operator
  return ncclSuccess;
}

API ncclResult_t ncclRedOpDestroy(ncclRedOp_t, ncclComm_t comm) {
  return valid(comm) ? ncclSuccess : ncclInvalidArgument;
}

// ---- collectives

API ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t comm,
                               cudaStream_t stream) {
  return collective(comm, stream);
}

API ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t comm,
                            cudaStream_t stream) {
  return collective(comm, stream);
}

API ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t comm,
                                   cudaStream_t stream) {
  return collective(comm, stream);
}

API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, int root,
                               ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = collective(comm, stream);
  if (r == ncclSuccess && comm->rank == root && sendbuff != recvbuff && count > 0) {
    vgpu::copy(recvbuff, sendbuff, count * type_size(type));
  }
  if (r == ncclSuccess) exchange_broadcast(comm, sendbuff, recvbuff, count * type_size(type), root);
  return r;
}

API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, type, root, comm, stream);
}

API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                               ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = collective(comm, stream);
  if (r == ncclSuccess) fill_slots(recvbuff, sendbuff, count * type_size(type), comm->nranks);
  return r;
}

API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, int root,
                            ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = collective(comm, stream);
  if (r == ncclSuccess && comm->rank == root) fill_slots(recvbuff, sendbuff, count * type_size(type), comm->nranks);
  return r;
}

API ncclResult_t ncclScatter(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, stream);
}

// Every peer sends this rank the block this rank sends to itself.
API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                              ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm)) return ncclInvalidArgument;
  for (int peer = 0; peer < comm->nranks && peer < 4096; ++peer) {
    ncclResult_t r = connect_peer(comm, peer);
    if (r != ncclSuccess) return r;
  }
  ncclResult_t r = enqueue(comm, stream);
  size_t bytes = count * type_size(type);
  if (r == ncclSuccess && sendbuff != recvbuff) {
    fill_slots(recvbuff, static_cast<const char*>(sendbuff) + comm->rank * bytes, bytes, comm->nranks);
  }
  return r;
}

API ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm)) return ncclInvalidArgument;
  ncclResult_t r = connect_peer(comm, peer);
  return r != ncclSuccess ? r : enqueue(comm, stream);
}

API ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm)) return ncclInvalidArgument;
  ncclResult_t r = connect_peer(comm, peer);
  return r != ncclSuccess ? r : enqueue(comm, stream);
}

// Groups: every operation is enqueued when it is called.
API ncclResult_t ncclGroupStart() {
  return ncclSuccess;
}

API ncclResult_t ncclGroupEnd() {
  return ncclSuccess;
}

API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* info) {
  if (info != nullptr) info->estimatedTime = 0.0f;
  return ncclSuccess;
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)

API ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* id) {
  return valid(comm) ? ncclGetUniqueId(id) : ncclInvalidArgument;
}

API ncclResult_t ncclCommGrow(ncclComm_t comm, int nranks, const ncclUniqueId*, int rank, ncclComm_t* newcomm,
                              ncclConfig_t*) {
  int device = comm != nullptr && valid(comm) ? comm->device : vgpu::current_device();
  return new_comm(newcomm, nranks, rank, device);
}

// Suspending releases NCCL's buffers, as the real library does; the next
// operation after resuming connects again.
API ncclResult_t ncclCommSuspend(ncclComm_t comm, int) {
  if (!valid(comm)) return ncclInvalidArgument;
  release(comm);
  comm->suspended = true;
  return ncclSuccess;
}

API ncclResult_t ncclCommResume(ncclComm_t comm) {
  if (!valid(comm)) return ncclInvalidArgument;
  comm->suspended = false;
  return ncclSuccess;
}

API ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  if (!valid(comm) || value == nullptr) return ncclInvalidArgument;
  switch (stat) {
    case ncclStatGpuMemSuspend: *value = comm->bytes; break;  // connection buffers can be suspended
    case ncclStatGpuMemSuspended: *value = comm->suspended ? 1 : 0; break;
    case ncclStatGpuMemPersist: *value = comm->persistent_bytes; break;
    case ncclStatGpuMemTotal: *value = comm->bytes + comm->persistent_bytes; break;
    default: return ncclInvalidArgument;
  }
  return ncclSuccess;
}

API ncclResult_t ncclWinGetUserPtr(ncclComm_t, ncclWindow_t win, void** out) {
  if (win == nullptr || out == nullptr) return ncclInvalidArgument;
  *out = win->base;
  return ncclSuccess;
}

API ncclResult_t ncclPutSignal(const void*, size_t, ncclDataType_t, int peer, ncclWindow_t, size_t, int, int,
                               unsigned int, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm)) return ncclInvalidArgument;
  ncclResult_t r = connect_peer(comm, peer);
  return r != ncclSuccess ? r : enqueue(comm, stream);
}

API ncclResult_t ncclSignal(int peer, int, int, unsigned int, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm)) return ncclInvalidArgument;
  return enqueue(comm, stream);
}

API ncclResult_t ncclWaitSignal(int, ncclWaitSignalDesc_t*, ncclComm_t comm, cudaStream_t stream) {
  if (!valid(comm)) return ncclInvalidArgument;
  return enqueue(comm, stream);
}

#endif

// ---- the device API (symmetric kernels): not modelled. torch asks for it
// only for its NCCL symmetric-memory backend, and fails with this message.

API ncclResult_t ncclDevCommCreate(ncclComm_t, const void*, void*) {
  return fail(ncclInvalidUsage, "NCCL's device API is not modelled on the virtual GPU");
}

API ncclResult_t ncclDevCommDestroy(ncclComm_t, const void*) {
  return ncclSuccess;
}

API ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t, size_t, void**) {
  return fail(ncclInvalidUsage, "NCCL's device API is not modelled on the virtual GPU");
}

API ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t, size_t, int, void**) {
  return fail(ncclInvalidUsage, "NCCL's device API is not modelled on the virtual GPU");
}
