#include "gradients.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "format/format.h"
#include "recorder.h"

namespace allocscope::gradients {
namespace {

struct Label {
  uint32_t label;  // string id of the parameter's name, in the recording it was watched in
  uint64_t generation;
  bool cuda, cpu;  // the recorded devices
};

struct Entry {
  Label what;
  uint64_t watch;  // Watch::id_
};

std::mutex g_mu;
std::unordered_map<const c10::TensorImpl*, Entry> g_params;  // guarded by g_mu
std::atomic<size_t> g_count{0};
std::atomic<uint64_t> g_next_watch{1};

}  // namespace

Watch::Watch(const std::vector<std::pair<PyObject*, std::string>>& params, bool cuda, bool cpu)
    : id_(g_next_watch.fetch_add(1)) {
  Recorder& rec = Recorder::get();
  uint64_t generation = rec.generation();
  std::vector<std::pair<const c10::TensorImpl*, Entry>> entries;
  for (const auto& [obj, name] : params) {
    if (!THPVariable_Check(obj)) throw std::invalid_argument("allocscope: a watched parameter is not a tensor");
    const at::Tensor& t = THPVariable_Unpack(obj);
    entries.emplace_back(t.unsafeGetTensorImpl(), Entry{Label{rec.intern(name), generation, cuda, cpu}, id_});
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& [key, entry] : entries) g_params.insert_or_assign(key, std::move(entry));
  g_count.store(g_params.size(), std::memory_order_relaxed);
}

Watch::~Watch() {
  remove();
}

void Watch::remove() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_params.begin(); it != g_params.end();) {
    it = it->second.watch == id_ ? g_params.erase(it) : std::next(it);
  }
  g_count.store(g_params.size(), std::memory_order_relaxed);
}

bool any() {
  return g_count.load(std::memory_order_relaxed) != 0;
}

namespace {

void label(const at::Tensor& param) {
  Label watched;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_params.find(param.unsafeGetTensorImpl());
    if (it == g_params.end()) return;
    watched = it->second.what;
  }
  if (watched.generation != Recorder::get().generation()) return;  // (a label id of another recording)
  const at::Tensor& grad = param.grad();
  if (!grad.defined() || !grad.has_storage()) return;
  c10::DeviceType device = grad.device().type();
  if (!((watched.cuda && device == c10::DeviceType::CUDA) || (watched.cpu && device == c10::DeviceType::CPU))) return;
  uint64_t ptr = 0, bytes = 0;
  try {
    const c10::Storage& storage = grad.storage();
    ptr = reinterpret_cast<uint64_t>(storage.data());
    bytes = storage.nbytes();
  } catch (const c10::Error&) {  // a storage that cannot be read: nothing to label
    return;
  }
  if (ptr != 0 && bytes > 0) Recorder::get().annotate_interned(format::kGradient, watched.label, ptr, bytes);
}

}  // namespace

void accumulated() {
  auto node = torch::autograd::get_current_node();  // (a shared_ptr before torch 2.14, an intrusive_ptr since)
  auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node.get());
  if (acc != nullptr && acc->variable.defined()) label(acc->variable);
}

void hooked(PyObject* param) {
  if (THPVariable_Check(param)) label(THPVariable_Unpack(param));
}

}  // namespace allocscope::gradients
