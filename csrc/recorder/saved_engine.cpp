#include "saved_engine.h"

#include <ATen/SavedTensorHooks.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "saved.h"

namespace allocscope::saved {

namespace {

namespace ag = torch::autograd;

// How the engine holds a node: std::shared_ptr up to torch 2.11,
// c10::intrusive_ptr by 2.14; read from the engine's own task type.
using NodeRef = std::decay_t<decltype(std::declval<ag::NodeTask&>().fn_)>;

// The hooks of one saved tensor: what Labeler::pack_native kept of it.
class NativeHooks final : public ag::SavedVariableHooks {
 public:
  NativeHooks(Labeler& labeler, c10::impl::PyInterpreter* interpreter)
      : labeler_(&labeler), interpreter_(interpreter) {}

  // (called once, right after the engine made these hooks: the labeler is alive)
  void call_pack_hook(const at::Tensor& tensor) override {
    data_ = labeler_->pack_native(tensor);
    labeler_ = nullptr;
  }

  at::Tensor call_unpack_hook() override { return data_; }

  // Compiled autograd unpacks saved tensors in Python: the pair it calls,
  // unpack(data), as the Python hooks would have given it.
  std::optional<std::pair<c10::SafePyObject, c10::SafePyObject>> retrieve_unpack_hook_data() const override {
    pybind11::gil_scoped_acquire gil;
    THPObjectPtr unpack(Labeler::unpack_hook());
    if (!unpack) throw python_error();
    THPObjectPtr data(THPVariable_Wrap(data_));
    if (!data) throw python_error();
    return std::make_pair(c10::SafePyObject(unpack.release(), interpreter_),
                          c10::SafePyObject(data.release(), interpreter_));
  }

 private:
  Labeler* labeler_;
  c10::impl::PyInterpreter* interpreter_;
  at::Tensor data_;
};

// The hooks of one saved tensor where a program's own pair lies below the
// watcher's on the stack (saved_tensors_hooks around the step, as
// torch.autograd.graph.save_on_cpu): that pair packs, as it would without the
// watch, and what it keeps, if a tensor, is what gets the activation label.
// torch's Python hooks, with the label added (torch does not export its own).
class ProgramHooks final : public ag::SavedVariableHooks {
 public:
  // (the GIL held; pack and unpack: the pair's borrowed references)
  ProgramHooks(Labeler& labeler, PyObject* pack, PyObject* unpack, c10::impl::PyInterpreter* interpreter)
      : labeler_(&labeler), pack_(pack), unpack_(unpack), interpreter_(interpreter) {
    Py_INCREF(pack_);
    Py_INCREF(unpack_);
  }

  ~ProgramHooks() override {
    if (!Py_IsInitialized()) return;  // (Python is gone: leak, as torch's hooks do)
    pybind11::gil_scoped_acquire gil;
    Py_XDECREF(pack_);
    Py_XDECREF(unpack_);
    Py_XDECREF(data_);
  }

  void call_pack_hook(const at::Tensor& tensor) override {
    pybind11::gil_scoped_acquire gil;
    THPObjectPtr obj(THPVariable_Wrap(tensor));
    if (!obj) throw python_error();
    PyObject* packed = PyObject_CallFunctionObjArgs(pack_, obj.get(), nullptr);
    if (packed == nullptr) throw python_error();
    data_ = packed;
    if (THPVariable_Check(packed)) labeler_->label(THPVariable_Unpack(packed));
    labeler_ = nullptr;
  }

  at::Tensor call_unpack_hook() override {
    pybind11::gil_scoped_acquire gil;
    THPObjectPtr res(PyObject_CallFunctionObjArgs(unpack_, data_, nullptr));
    if (!res) throw python_error();
    TORCH_CHECK_TYPE(THPVariable_Check(res.get()),
                     "Output of saved tensor unpack_hook expected to be a Tensor but got result of type ",
                     Py_TYPE(res.get())->tp_name);
    return THPVariable_Unpack(res.get());
  }

  std::optional<std::pair<c10::SafePyObject, c10::SafePyObject>> retrieve_unpack_hook_data() const override {
    pybind11::gil_scoped_acquire gil;
    Py_INCREF(unpack_);
    Py_INCREF(data_);
    return std::make_pair(c10::SafePyObject(unpack_, interpreter_), c10::SafePyObject(data_, interpreter_));
  }

 private:
  Labeler* labeler_;
  PyObject* pack_;
  PyObject* unpack_;
  c10::impl::PyInterpreter* interpreter_;
  PyObject* data_ = nullptr;
};

// The entries of a std::stack, bottom first (its container is a protected
// member: reachable through a class derived from the stack's type).
template <class Stack>
const typename Stack::container_type& entries(const Stack& stack) {
  struct Access : Stack {
    static const typename Stack::container_type& of(const Stack& s) { return s.*(&Access::c); }
  };
  return Access::of(stack);
}

class RoutingEngine final : public ag::Engine {
 public:
  void set_base(ag::Engine& base) { base_.store(&base, std::memory_order_release); }

  ag::variable_list execute(const ag::edge_list& roots, const ag::variable_list& inputs, bool keep_graph,
                            bool create_graph, bool accumulate_grad, const ag::edge_list& outputs) override {
    return base()->execute(roots, inputs, keep_graph, create_graph, accumulate_grad, outputs);
  }

  c10::intrusive_ptr<at::ivalue::Future> execute_with_graph_task(const std::shared_ptr<ag::GraphTask>& graph_task,
                                                                 NodeRef graph_root,
                                                                 ag::InputBuffer&& input_buffer) override {
    return base()->execute_with_graph_task(graph_task, std::move(graph_root), std::move(input_buffer));
  }

  std::unique_ptr<ag::AnomalyMetadata> make_anomaly_metadata() override { return base()->make_anomaly_metadata(); }

#if __has_include(<torch/csrc/autograd/node_creation_hook.h>)
  std::vector<std::unique_ptr<ag::NodeCreationHook>> get_node_creation_hooks() override {
    return base()->get_node_creation_hooks();
  }
#endif

  std::unique_ptr<ag::SavedVariableHooks> get_default_saved_variable_hooks() override {
    // What at::SavedTensorDefaultHooks::get_hooks() looks at (which copies
    // the pair, a GIL acquisition per reference count change): the top of
    // this thread's stack, unless hooks are deferred while tracing.
    const at::impl::SavedTensorDefaultHooksTLS& tls = at::SavedTensorDefaultHooks::get_tls_state();
    if (!tls.stack.empty() && !tls.is_tracing) {
      const c10::SafePyObject& pack = tls.stack.top().first;
      c10::impl::PyInterpreter* interpreter = &pack.pyinterpreter();
      if (Labeler* labeler = Labeler::of_pack_hook(pack.ptr(interpreter))) {
        // A program's pair below the watcher's (the watcher's forward began
        // inside it) packs, as without the watch; other watchers' pairs
        // (an outer watched model) are skipped over.
        const auto& stack = entries(tls.stack);
        for (auto it = stack.rbegin() + 1; it != stack.rend(); ++it) {
          PyObject* below = it->first.ptr(interpreter);
          if (Labeler::of_pack_hook(below) != nullptr) continue;
          pybind11::gil_scoped_acquire gil;
          return std::make_unique<ProgramHooks>(*labeler, below, it->second.ptr(interpreter), interpreter);
        }
        return std::make_unique<NativeHooks>(*labeler, interpreter);
      }
    }
    return base()->get_default_saved_variable_hooks();
  }

 private:
  ag::Engine* base() const { return base_.load(std::memory_order_acquire); }

  // (set again only when the engine is held anew after someone replaced it:
  // a thread may be inside one of these calls then)
  std::atomic<ag::Engine*> base_{nullptr};
};

std::mutex g_mutex;
int g_holders = 0;
ag::Engine* g_base = nullptr;
// Never deleted: code that looked up the default engine while it was this
// one (torch's distributed autograd keeps the reference) may still use it.
RoutingEngine* g_engine = nullptr;

ag::Engine& base_engine() {
  return *g_base;
}

ag::Engine& routing_engine() {
  return *g_engine;
}

}  // namespace

void hold_engine() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_holders++ > 0) return;
  if (g_engine == nullptr) g_engine = new RoutingEngine();
  ag::Engine& current = ag::Engine::get_default_engine();
  if (&current != g_engine) {
    g_base = &current;
    g_engine->set_base(current);
  }
  ag::set_default_engine_stub(&routing_engine);
}

void release_engine() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_holders == 0 || --g_holders > 0) return;
  if (&ag::Engine::get_default_engine() == g_engine) ag::set_default_engine_stub(&base_engine);
}

}  // namespace allocscope::saved
