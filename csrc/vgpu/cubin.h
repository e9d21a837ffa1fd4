// What a kernel asks of the card, read from the cubin that holds it (the
// ELF image ptxas writes and cuModuleLoadData receives), so that the driver's
// answers (cuFuncGetAttribute, occupancy, launch checks) are the card's: Triton
// and Inductor choose block sizes, prune autotuning configs that spill and
// raise OutOfResources from these answers.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vgpu {

struct KernelResources {
  std::string name;
  int registers = 0;         // per thread (EIATTR_REGCOUNT)
  int local_bytes = 0;       // per thread: the stack frame spills live in (EIATTR_FRAME_SIZE)
  int static_shared = 0;     // bytes per block (the .nv.shared.<name> section)
  int required_threads = 0;  // block size fixed by .reqntid (EIATTR_REQNTID), 0: none
  int max_threads = 0;       // block size bound by .maxntid (EIATTR_MAX_THREADS), 0: none
};

// The kernels of `image` if it is a cubin (ELF, machine EM_CUDA). False for
// anything else (PTX text, a fatbin): the driver then answers its defaults.
// Bounds come from the ELF header itself (cuModuleLoadData gets no size).
bool read_cubin(const void* image, std::vector<KernelResources>* kernels);

// The most threads per block a kernel of `registers` registers per thread
// can run with (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK): registers are
// given to warps in units of 256 from a block's 64K, capped at 1024 threads
// and at the kernel's own .maxntid / .reqntid.
int max_threads_per_block(const KernelResources& k);

}  // namespace vgpu
