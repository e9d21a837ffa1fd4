// The CUDA-key half of the virtual GPU's value kernels (python/allocscope/vgpu/values.py).
//
// values.py computes chosen ops on the host with Python kernels. A Python
// kernel cannot take every argument a CUDA kernel can: torch hands a "wrapped
// number" (a Python number turned into a 0-dim tensor) to a Python kernel as a
// Python number, and asserts that it is on the CPU (toPyObject), but some of
// ATen's own kernels make them on the device: pow(2, t) calls pow.Tensor_Tensor
// with wrapped_scalar_tensor(2, t.device()), where(c, t, 0.0) calls where.self
// with wrapped_scalar_tensor(0.0, t.device()). So each chosen op's CUDA kernel
// is this boxed one: it moves such arguments to the CPU (still wrapped numbers,
// which every CUDA kernel takes as scalars, with the same type promotion),
// reading them in place (registered on the virtual GPU only, whose device
// memory is host memory), and redispatches to the Python kernel, registered at
// kValueKey.
#include "value_kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace allocscope::value_kernels {
namespace {

std::mutex g_mu;
std::vector<std::unique_ptr<torch::Library>> g_libraries;  // registrations live as long as the process

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.unsafeGetTensorImpl()->is_wrapped_number() && !t.is_cpu()) {
      // Read in place (the virtual card's memory is host memory), not through copy_, whose own kernel
      // this is too.
      at::Tensor host = at::from_blob(t.data_ptr(), t.sizes(), t.strides(), at::TensorOptions().dtype(t.dtype()))
                            .clone();
      host.unsafeGetTensorImpl()->set_wrapped_number(true);
      v = std::move(host);
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(kValueKey), stack);
}

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::TraceEntry;

struct PendingFill {
  at::ScalarType dtype;
  int64_t numel;
  c10::Scalar value;
};

std::mutex g_held_mu;  // never held while allocating: the tracker takes it under the allocator's lock
std::unordered_set<uintptr_t> g_held;
std::unordered_map<uintptr_t, PendingFill> g_fills;
bool g_tracking = false;

uintptr_t key(const at::Tensor& t) {
  return t.has_storage() ? reinterpret_cast<uintptr_t>(t.storage().data()) : 0;
}

// Runs under the allocator's lock: no Python, no allocation.
void on_trace(const TraceEntry& te) {
  if (te.action_ != TraceEntry::FREE_REQUESTED && te.action_ != TraceEntry::FREE_COMPLETED) return;
  std::lock_guard<std::mutex> lock(g_held_mu);
  g_held.erase(te.addr_);
  g_fills.erase(te.addr_);
}

}  // namespace

bool held(const at::Tensor& t) {
  uintptr_t k = key(t);
  if (k == 0) return t.has_storage() && t.storage().nbytes() == 0;  // an empty storage holds all it has
  std::lock_guard<std::mutex> lock(g_held_mu);
  return g_held.count(k) != 0;
}

void set_held(const at::Tensor& t, bool is_held) {
  uintptr_t k = key(t);
  if (k == 0) return;
  std::lock_guard<std::mutex> lock(g_held_mu);
  g_fills.erase(k);
  if (is_held) {
    g_held.insert(k);
  } else {
    g_held.erase(k);
  }
}

void fill_later(const at::Tensor& t, const c10::Scalar& value) {
  uintptr_t k = key(t);
  if (k == 0) return;
  const int64_t numel = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
  std::lock_guard<std::mutex> lock(g_held_mu);
  g_held.insert(k);
  g_fills[k] = PendingFill{t.scalar_type(), numel, value};
}

void write_fill(const at::Tensor& t) {
  uintptr_t k = key(t);
  if (k == 0) return;
  PendingFill fill;
  {
    std::lock_guard<std::mutex> lock(g_held_mu);
    auto it = g_fills.find(k);
    if (it == g_fills.end()) return;
    fill = it->second;
    g_fills.erase(it);
  }
  // The virtual card's memory is host memory: filled in place, on the CPU.
  at::from_blob(reinterpret_cast<void*>(k), {fill.numel}, at::TensorOptions().dtype(fill.dtype)).fill_(fill.value);
}

std::pair<uintptr_t, size_t> storage_span(const at::Tensor& t) {
  return {key(t), t.has_storage() ? t.storage().nbytes() : 0};
}

bool track_frees() {
  if (g_tracking) return true;
  cca::CUDAAllocator* allocator = cca::allocator.load();
  if (allocator == nullptr || !allocator->initialized()) return false;
  try {
    allocator->attachAllocatorTraceTracker(&on_trace);
  } catch (const c10::Error&) {
    return false;
  }
  g_tracking = true;
  return true;
}

void register_cuda_kernel(const std::string& name, const std::string& overload) {
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", std::make_optional(c10::DispatchKey::CUDA),
                                                  __FILE__, __LINE__);
  const std::string qualified = overload.empty() ? name : name + "." + overload;
  library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
  std::lock_guard<std::mutex> lock(g_mu);
  g_libraries.push_back(std::move(library));
}

}  // namespace allocscope::value_kernels
