// NCCL on the virtual GPU: the bytes of small broadcasts, which move between
// the processes of a run.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vgpu {
namespace nccl {

// Scripts check that ranks agree by broadcasting a value from rank 0 into
// a buffer the others filled with a sentinel (DeepSpeed ZeRO-3's module
// order), and broadcast pickled objects (broadcast_object_list): neither
// survives meaningless bytes. Where the processes of a run share their
// cards (ALLOCSCOPE_VGPU_EXCHANGE names a folder, set with the shared
// device state), a broadcast of at most 1 MiB is real: the
// root writes its bytes to a file named by the communicator and the
// broadcast's number, the others wait for it (every rank makes the same
// broadcasts in the same order, as NCCL requires). A rank alone, or a
// root that never comes within 60 s, leaves the buffer as it was. Where
// only some ranks of the job run (`--ranks`), the store beside the ranks
// (python/allocscope/vgpu/distributed.py) writes, for each communicator
// whose id passes through it, the file COMM.running listing the ranks of
// the communicator that run: a broadcast whose root is not among them
// leaves the buffer as it was, without waiting.
void exchange_broadcast(uint64_t comm, uint64_t number, int rank, int root, const void* send, void* recv,
                        size_t bytes);

// A 64-bit FNV-1a hash: a communicator's name from its unique id.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull);

}  // namespace nccl
}  // namespace vgpu
