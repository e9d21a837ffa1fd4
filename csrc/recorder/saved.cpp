#include "saved.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>

#include "format/format.h"
#include "ops.h"
#include "recorder.h"
#include "saved_engine.h"

namespace allocscope::saved {

Labeler::Labeler(bool cuda, bool cpu, const std::string& fallback, std::vector<PyObject*> plain_types, bool route)
    : cuda_(cuda),
      cpu_(cpu),
      fallback_(Recorder::get().intern(fallback)),
      plain_types_(std::move(plain_types)),
      routed_(route) {
  for (PyObject* t : plain_types_) Py_INCREF(t);
  if (routed_) hold_engine();
}

Labeler::~Labeler() {
  // (destroyed by Python's garbage collection, with the GIL)
  close();
  for (PyObject* t : plain_types_) Py_DECREF(t);
}

void Labeler::close() {
  if (routed_) release_engine();
  routed_ = false;
}

void Labeler::set_parameters(const std::vector<uint64_t>& storages) {
  std::lock_guard<std::mutex> lock(mutex_);
  parameters_.clear();
  parameters_.insert(storages.begin(), storages.end());
}

void Labeler::begin_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  labelled_.clear();
}

void Labeler::label(const at::Tensor& t) {
  c10::DeviceType device = t.device().type();
  if (!((cuda_ && device == c10::DeviceType::CUDA) || (cpu_ && device == c10::DeviceType::CPU))) return;
  uint64_t ptr = 0, bytes = 0;
  try {
    if (t.has_storage()) {
      const c10::Storage& storage = t.storage();
      ptr = reinterpret_cast<uint64_t>(storage.data());
      bytes = storage.nbytes();
    }
  } catch (const c10::Error&) {  // a storage that cannot be read: nothing to label
    ptr = 0;
  }
  if (ptr == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (parameters_.count(ptr) != 0 || !labelled_.insert(ptr)) return;
  }
  Recorder::get().annotate_interned(format::kActivation, ops::innermost_module(fallback_), ptr, bytes);
}

bool Labeler::plain(PyObject* type) const {
  return std::find(plain_types_.begin(), plain_types_.end(), type) != plain_types_.end();
}

PyObject* Labeler::pack(PyObject* obj) {
  if (!THPVariable_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "allocscope's saved-tensor hook got something that is not a tensor");
    return nullptr;
  }
  packed_in_python_.fetch_add(1, std::memory_order_relaxed);
  try {
    // (a tensor kept as it is wraps back to obj itself; a subclass's detach()
    // result to the object it returned: torch keeps it with its TensorImpl)
    return THPVariable_Wrap(keep(THPVariable_Unpack(obj)));
  } catch (python_error& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

at::Tensor Labeler::pack_native(const at::Tensor& t) {
  packed_natively_.fetch_add(1, std::memory_order_relaxed);
  return keep(t);
}

at::Tensor Labeler::keep(const at::Tensor& t) {
  label(t);
  // What is kept must not hold the tensor's own grad_fn: for an output that
  // node is the one saving it, which would then own itself (a cycle of C++
  // references, never freed). A tensor without a grad_fn (a leaf, or one
  // made without autograd) is kept as it is, as torch saves it without hooks.
  if (!t.grad_fn()) return t;
  // A tensor whose Python object is of a subclass is detached by the
  // subclass's own detach(). The object, if any, lives as long as the
  // TensorImpl that points to it (torch keeps a tensor's Python object while
  // C++ holds the tensor), and its type does not change.
  PyObject* existing = t.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
  if (existing != nullptr && !plain(reinterpret_cast<PyObject*>(Py_TYPE(existing)))) {
    pybind11::gil_scoped_acquire gil;
    THPObjectPtr obj(THPVariable_Wrap(t));
    if (!obj) throw python_error();
    THPObjectPtr detached(PyObject_CallMethod(obj.get(), "detach", nullptr));
    if (!detached) throw python_error();
    TORCH_CHECK_TYPE(THPVariable_Check(detached.get()), "a saved tensor's detach() returned something else");
    return THPVariable_Unpack(detached.get());
  }
  // The same storage and version counter without autograd's metadata: what
  // torch saves of an output without hooks, a shallow copy where detach()
  // would dispatch a view op (~2 thousand instructions).
  return t.tensor_data();
}

namespace {

constexpr char kCapsule[] = "allocscope.saved.Labeler";

PyObject* call_pack(PyObject* capsule, PyObject* tensor) {
  auto* labeler = static_cast<Labeler*>(PyCapsule_GetPointer(capsule, kCapsule));
  return labeler == nullptr ? nullptr : labeler->pack(tensor);
}

PyObject* call_unpack(PyObject*, PyObject* tensor) {
  Py_INCREF(tensor);
  return tensor;
}

PyMethodDef g_pack_def = {"pack", &call_pack, METH_O, "allocscope's saved-tensor pack hook"};
PyMethodDef g_unpack_def = {"unpack", &call_unpack, METH_O, "allocscope's saved-tensor unpack hook"};

void release_owner(PyObject* capsule) {
  Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(capsule)));
}

}  // namespace

Labeler* Labeler::of_pack_hook(PyObject* fn) {
  if (fn == nullptr || !PyCFunction_Check(fn) || PyCFunction_GET_FUNCTION(fn) != &call_pack) return nullptr;
  // (our own capsule: the name matches, so no Python error can be set here)
  return static_cast<Labeler*>(PyCapsule_GetPointer(PyCFunction_GET_SELF(fn), kCapsule));
}

PyObject* Labeler::pack_hook(PyObject* owner, Labeler* labeler) {
  PyObject* capsule = PyCapsule_New(labeler, kCapsule, &release_owner);
  if (capsule == nullptr) return nullptr;
  Py_INCREF(owner);
  if (PyCapsule_SetContext(capsule, owner) != 0) {
    Py_DECREF(owner);
    Py_DECREF(capsule);
    return nullptr;
  }
  PyObject* fn = PyCFunction_New(&g_pack_def, capsule);
  Py_DECREF(capsule);
  return fn;
}

PyObject* Labeler::unpack_hook() {
  return PyCFunction_New(&g_unpack_def, nullptr);
}

}  // namespace allocscope::saved
