#include "saved.h"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>

#include "format/format.h"
#include "ops.h"
#include "recorder.h"

namespace allocscope::saved {

Labeler::Labeler(bool cuda, bool cpu, const std::string& fallback, std::vector<PyObject*> plain_types)
    : cuda_(cuda), cpu_(cpu), fallback_(Recorder::get().intern(fallback)), plain_types_(std::move(plain_types)) {
  for (PyObject* t : plain_types_) Py_INCREF(t);
}

Labeler::~Labeler() {
  // (destroyed by Python's garbage collection, with the GIL)
  for (PyObject* t : plain_types_) Py_DECREF(t);
}

void Labeler::begin_forward(const std::vector<uint64_t>& labelled) {
  labelled_.clear();
  labelled_.insert(labelled.begin(), labelled.end());
}

PyObject* Labeler::pack(PyObject* obj) {
  if (!THPVariable_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "allocscope's saved-tensor hook got something that is not a tensor");
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  c10::DeviceType device = t.device().type();
  if ((cuda_ && device == c10::DeviceType::CUDA) || (cpu_ && device == c10::DeviceType::CPU)) {
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
    if (ptr != 0 && labelled_.insert(ptr).second) {
      Recorder::get().annotate_interned(format::kActivation, ops::innermost_module(fallback_), ptr, bytes);
    }
  }
  // What is packed must not hold the tensor's own grad_fn: for an output
  // that node is the one saving it, which would then own itself (a cycle
  // of C++ references, never freed). A tensor without a grad_fn (a leaf, or
  // one made without autograd) is packed as it is, as torch saves it
  // without hooks.
  if (!t.grad_fn()) {
    Py_INCREF(obj);
    return obj;
  }
  if (std::find(plain_types_.begin(), plain_types_.end(), reinterpret_cast<PyObject*>(Py_TYPE(obj))) ==
      plain_types_.end()) {
    return PyObject_CallMethod(obj, "detach", nullptr);  // (a subclass keeps its own detach)
  }
  try {
    // The same storage and version counter without autograd's metadata: what
    // torch saves of an output without hooks (tensor_data()), a shallow copy
    // where detach() would dispatch a view op (~2 thousand instructions).
    return THPVariable_Wrap(t.tensor_data());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
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
