#include "module_hooks.h"

#include <torch/csrc/autograd/python_variable.h>

#include "format/format.h"
#include "recorder.h"

namespace allocscope::module_hooks {
namespace {

// The function's `self`: a Python int, label << 1 | leaf.
struct Scope {
  uint32_t label;
  bool leaf;
};

bool scope_of(PyObject* self, Scope* out) {
  unsigned long long v = PyLong_AsUnsignedLongLong(self);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return false;
  out->label = static_cast<uint32_t>(v >> 1);
  out->leaf = (v & 1) != 0;
  return true;
}

uint64_t flags(const Scope& s) {
  return s.leaf ? format::kModuleLeaf : 0;
}

// module_scopes.new_output_bytes: a leaf's output that is not one plain
// tensor (one function for the process, given by the first make()).
PyObject* g_output_bytes = nullptr;

PyObject* enter(PyObject* self, PyObject* const*, Py_ssize_t) {
  Scope s;
  if (!scope_of(self, &s)) return nullptr;
  Recorder::get().module_scope(true, s.label, flags(s), 0);
  Py_RETURN_NONE;
}

// The bytes of a plain tensor output that is not a view of the module's one
// plain tensor input (ReLU(inplace=True), Flatten), as module_scopes.py's
// new_output_bytes counts them; -1 where the arguments are not those.
int64_t plain_output_bytes(PyObject* args, PyObject* output) {
  if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 1) return -1;
  PyObject* input = PyTuple_GET_ITEM(args, 0);
  if (!THPVariable_CheckExact(output) || !THPVariable_CheckExact(input)) return -1;
  const at::Tensor& out = THPVariable_Unpack(output);
  const at::Tensor& in = THPVariable_Unpack(input);
  // (a tensor without a storage has no bytes to count: Python's
  // untyped_storage() raises for it, and the Python hook counts 0)
  if (!out.has_storage() || !in.has_storage()) return 0;
  try {
    if (out.storage().data() == in.storage().data()) return 0;
    return static_cast<int64_t>(out.numel() * out.element_size());
  } catch (const c10::Error&) {
    return 0;
  }
}

// A leaf's new output bytes: in C for one plain tensor in and out, else
// from Python's new_output_bytes. 0 where that fails (allocscope's own
// failure: reported, never the forward's).
uint64_t output_bytes(PyObject* args, PyObject* output) {
  int64_t produced = plain_output_bytes(args, output);
  if (produced >= 0) return static_cast<uint64_t>(produced);
  PyObject* n = PyObject_CallFunctionObjArgs(g_output_bytes, args, output, nullptr);
  produced = n == nullptr ? -1 : PyLong_AsLongLong(n);
  Py_XDECREF(n);
  if (produced < 0) {
    if (PyErr_Occurred()) PyErr_WriteUnraisable(g_output_bytes);
    produced = 0;
  }
  return static_cast<uint64_t>(produced);
}

PyObject* exit(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Scope s;
  if (!scope_of(self, &s)) return nullptr;
  uint64_t produced = 0;
  if (s.leaf) {
    if (nargs != 3) {
      PyErr_SetString(PyExc_TypeError, "a module's forward hook takes (module, args, output)");
      return nullptr;
    }
    produced = output_bytes(args[1], args[2]);
  }
  Recorder::get().module_scope(false, s.label, flags(s), produced);
  Py_RETURN_NONE;
}

PyMethodDef g_enter_def = {"enter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&enter)),
                           METH_FASTCALL, "allocscope: a watched module's forward begins"};
PyMethodDef g_exit_def = {"exit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&exit)),
                          METH_FASTCALL, "allocscope: a watched module's forward ends"};

}  // namespace

PyObject* make(uint32_t label, bool leaf, PyObject* output_bytes) {
  if (g_output_bytes == nullptr) {
    Py_INCREF(output_bytes);
    g_output_bytes = output_bytes;
  }
  PyObject* self = PyLong_FromUnsignedLongLong((static_cast<unsigned long long>(label) << 1) | (leaf ? 1 : 0));
  if (self == nullptr) return nullptr;
  PyObject* e = PyCFunction_New(&g_enter_def, self);
  PyObject* x = PyCFunction_New(&g_exit_def, self);
  Py_DECREF(self);
  if (e == nullptr || x == nullptr) {
    Py_XDECREF(e);
    Py_XDECREF(x);
    return nullptr;
  }
  PyObject* pair = PyTuple_Pack(2, e, x);
  Py_DECREF(e);
  Py_DECREF(x);
  return pair;
}

}  // namespace allocscope::module_hooks
