// The CUDA-key half of the virtual GPU's value kernels (value_kernels.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/Scalar.h>

#include <cstdint>
#include <string>
#include <utility>

namespace allocscope::value_kernels {

// The key the Python kernels are registered at: one no tensor of a program
// carries, reached only by this redispatch.
constexpr c10::DispatchKey kValueKey = c10::DispatchKey::PrivateUse3;

// Makes aten::name.overload's CUDA kernel the boxed one of value_kernels.cpp,
// which redispatches to the kernel registered at kValueKey. Requires that
// torch's own CUDA kernel was taken first (torch.library.get_kernel).
void register_cuda_kernel(const std::string& name, const std::string& overload);

// Which storages hold values (vgpu/values.py), by their data pointer: the
// caching allocator's frees forget them (a trace tracker), so a block reused
// for another tensor starts without values. Kept here rather than in Python:
// a storage's Python object, once made, holds a reference to the storage for
// its whole life, which makes autograd accumulate gradients out of place
// (is_tensor_stealable) and so changes what a program allocates.
bool held(const at::Tensor& t);
void set_held(const at::Tensor& t, bool held);
// t covers its storage and holds `value` everywhere, written by write_fills
// when a computed op first reads it.
void fill_later(const at::Tensor& t, const c10::Scalar& value);
void write_fill(const at::Tensor& t);
// (data pointer, bytes) of t's storage.
std::pair<uintptr_t, size_t> storage_span(const at::Tensor& t);
// Attaches the trace tracker (once CUDA's allocator is initialized); false
// where the allocator takes none (cudaMallocAsync): storages are then
// forgotten only when set_held(false) says so.
bool track_frees();

}  // namespace allocscope::value_kernels
