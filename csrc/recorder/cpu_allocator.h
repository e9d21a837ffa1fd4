// The recorder in front of PyTorch's CPU allocator (c10::GetCPUAllocator()).
#pragma once

namespace allocscope::cpu {

// Installs the recording wrapper in front of the current CPU allocator; throws
// std::runtime_error if the CPU allocator was replaced since the first install.
void install();
// Restores the wrapped allocator. Tensors made while installed keep the
// wrapper's deleter and are still recorded when freed during a recording.
void uninstall();
bool installed();

}  // namespace allocscope::cpu
