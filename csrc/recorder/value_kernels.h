// The CUDA-key half of the virtual GPU's value kernels (value_kernels.cpp).
#pragma once

#include <c10/core/DispatchKey.h>

#include <string>

namespace allocscope::value_kernels {

// The key the Python kernels are registered at: one no tensor of a program
// carries, reached only by this redispatch.
constexpr c10::DispatchKey kValueKey = c10::DispatchKey::PrivateUse3;

// Makes aten::name.overload's CUDA kernel the boxed one of value_kernels.cpp,
// which redispatches to the kernel registered at kValueKey. Requires that
// torch's own CUDA kernel was taken first (torch.library.get_kernel).
void register_cuda_kernel(const std::string& name, const std::string& overload);

}  // namespace allocscope::value_kernels
