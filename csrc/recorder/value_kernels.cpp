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
#include <torch/library.h>

#include <memory>
#include <mutex>
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

}  // namespace

void register_cuda_kernel(const std::string& name, const std::string& overload) {
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", std::make_optional(c10::DispatchKey::CUDA),
                                                  __FILE__, __LINE__);
  const std::string qualified = overload.empty() ? name : name + "." + overload;
  library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
  std::lock_guard<std::mutex> lock(g_mu);
  g_libraries.push_back(std::move(library));
}

}  // namespace allocscope::value_kernels
