#include "module_hooks.h"

#include <torch/csrc/autograd/python_variable.h>

#include <iterator>
#include <memory>

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

PyObject* enter(PyObject* self, PyObject* const*, Py_ssize_t) {
  Scope s;
  if (!scope_of(self, &s)) return nullptr;
  Recorder::get().module_scope(true, s.label, flags(s), 0);
  Py_RETURN_NONE;
}

// The bytes of a plain tensor output that is not a view of the module's one
// plain tensor input (ReLU(inplace=True), Flatten), as module_scopes.py's
// new_output_bytes counts them; -1 where the arguments are not those.
int64_t new_output_bytes(PyObject* args, PyObject* output) {
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

PyObject* exit(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Scope s;
  if (!scope_of(self, &s)) return nullptr;
  int64_t produced = 0;
  if (s.leaf) {
    if (nargs != 3) {
      PyErr_SetString(PyExc_TypeError, "a module's forward hook takes (module, args, output)");
      return nullptr;
    }
    produced = new_output_bytes(args[1], args[2]);
    if (produced < 0) Py_RETURN_FALSE;
  }
  Recorder::get().module_scope(false, s.label, flags(s), static_cast<uint64_t>(produced));
  Py_RETURN_TRUE;
}

PyMethodDef g_enter_def = {"enter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&enter)),
                           METH_FASTCALL, "allocscope: a watched module's forward begins"};
PyMethodDef g_exit_def = {"exit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&exit)),
                          METH_FASTCALL, "allocscope: a watched module's forward ends"};

// ---- the wrapped forward

// A subclass of functools.partial(cls_forward, module) whose call writes the
// scopes around the forward. A partial because torch.compile reads one as
// what it is (a call of cls_forward with the module first) and traces the
// forward alone, without a graph break, where a C function of any other
// type would break the graph; inspect.signature reads a partial's signature
// as a bound method's. Its call is C: the Python wrapper it replaces cost
// about 3.7 thousand instructions a call in frames, argument packing and
// torch.compiler.is_compiling() (benchmarks/bench_module_call_instructions.py).

// What CPython's functools.partial object starts with (Modules/_functoolsmodule.c,
// the same from 3.8 to 3.13); checked on a probe before the type is used.
struct PartialHead {
  PyObject_HEAD
  PyObject* fn;
  PyObject* args;
  PyObject* kw;
};

// Ours, after the partial's own fields (at the partial type's basicsize).
struct WrapperState {
  Scope scope;
  bool live;  // cleared by stop(): a wrapper someone else wrapped since only calls the forward
};

PyTypeObject* g_wrapper_type = nullptr;
Py_ssize_t g_state_offset = 0;
PyObject* g_output_bytes = nullptr;  // module_scopes.new_output_bytes: a leaf's output that is not one plain tensor

WrapperState* state_of(PyObject* self) {
  return reinterpret_cast<WrapperState*>(reinterpret_cast<char*>(self) + g_state_offset);
}

void write_exit(const WrapperState& s, PyObject* args, PyObject* output) {
  int64_t produced = 0;
  if (s.scope.leaf && output != nullptr) {
    produced = new_output_bytes(args, output);
    if (produced < 0) {
      PyObject* n = PyObject_CallFunctionObjArgs(g_output_bytes, args, output, nullptr);
      produced = n == nullptr ? -1 : PyLong_AsLongLong(n);
      Py_XDECREF(n);
      if (produced < 0) {
        // (allocscope's own failure: reported, and the forward's result returned as without it)
        if (PyErr_Occurred()) PyErr_WriteUnraisable(g_output_bytes);
        produced = 0;
      }
    }
  }
  Recorder::get().module_scope(false, s.scope.label, flags(s.scope), static_cast<uint64_t>(produced));
}

// The module, or nullptr with a TypeError for a wrapper not made by
// wrap_forward (the type is reachable from Python, as type(module.forward)).
PyObject* module_of(PyObject* self) {
  PyObject* bound = reinterpret_cast<PartialHead*>(self)->args;
  if (PyTuple_Check(bound) && PyTuple_GET_SIZE(bound) == 1) return PyTuple_GET_ITEM(bound, 0);
  PyErr_SetString(PyExc_TypeError, "a watched forward binds its module alone");
  return nullptr;
}

PyObject* wrapper_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* head = reinterpret_cast<PartialHead*>(self);
  const WrapperState& s = *state_of(self);
  PyObject* module = module_of(self);
  if (module == nullptr) return nullptr;
  // cls_forward(module, *args, **kwargs)
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  PyObject* small[9];
  std::unique_ptr<PyObject*[]> large;
  PyObject** stack = small;
  if (n + 2 > static_cast<Py_ssize_t>(std::size(small))) {
    large.reset(new PyObject*[n + 2]);
    stack = large.get();
  }
  stack[1] = module;
  for (Py_ssize_t i = 0; i < n; ++i) stack[i + 2] = PyTuple_GET_ITEM(args, i);
  size_t nargsf = static_cast<size_t>(n + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET;
  if (!s.live) return PyObject_VectorcallDict(head->fn, stack + 1, nargsf, kwargs);
  Recorder::get().module_scope(true, s.scope.label, flags(s.scope), 0);
  PyObject* output = PyObject_VectorcallDict(head->fn, stack + 1, nargsf, kwargs);
  if (output == nullptr) {
    // As a forward hook with always_call=True: for an Exception, not a BaseException
    if (PyErr_ExceptionMatches(PyExc_Exception)) write_exit(s, args, nullptr);
    return nullptr;
  }
  write_exit(s, args, output);
  return output;
}

PyObject* wrapper_stop(PyObject* self, PyObject*) {
  state_of(self)->live = false;
  Py_RETURN_NONE;
}

// Pickled (and deep-copied), the wrapper is getattr(module, "forward"), as a
// bound method is: nothing of allocscope in the file, and a copy gets the
// class's forward.
PyObject* wrapper_reduce(PyObject* self, PyObject*) {
  PyObject* getattr_fn = PyDict_GetItemString(PyEval_GetBuiltins(), "getattr");  // borrowed
  if (getattr_fn == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "builtins.getattr is missing");
    return nullptr;
  }
  PyObject* module = module_of(self);
  if (module == nullptr) return nullptr;
  return Py_BuildValue("O(Os)", getattr_fn, module, "forward");
}

// A bound method's __self__ and __func__ (torch.compile's get_traced_fn reads
// __func__ where there is a __self__): attributes of the type, not of the
// instance's __dict__, which functools.update_wrapper would copy to another
// wrapper around this one (accelerate's), passing the forward by.
PyObject* wrapper_self(PyObject* self, void*) {
  PyObject* module = module_of(self);
  Py_XINCREF(module);
  return module;
}

PyObject* wrapper_func(PyObject* self, void*) {
  PyObject* fn = reinterpret_cast<PartialHead*>(self)->fn;
  Py_INCREF(fn);
  return fn;
}

// The bound method's signature: with __code__ and the rest forwarded,
// inspect would otherwise read the wrapper as a function (self included).
PyObject* bound_signature(PyObject* self) {
  PyObject* module = module_of(self);
  if (module == nullptr) return nullptr;
  PyObject* bound = PyMethod_New(reinterpret_cast<PartialHead*>(self)->fn, module);
  if (bound == nullptr) return nullptr;
  PyObject* inspect = PyImport_ImportModule("inspect");
  PyObject* signature = inspect == nullptr ? nullptr : PyObject_CallMethod(inspect, "signature", "O", bound);
  Py_XDECREF(inspect);
  Py_DECREF(bound);
  return signature;
}

// Any other attribute, as a bound method gives it: the function's
// (__code__, __name__, __qualname__, ...: vLLM hashes forward.__code__ to
// key its compile cache).
PyObject* wrapper_getattro(PyObject* self, PyObject* name) {
  PyObject* found = PyObject_GenericGetAttr(self, name);
  if (found != nullptr || !PyErr_ExceptionMatches(PyExc_AttributeError)) return found;
  PyObject* fn = reinterpret_cast<PartialHead*>(self)->fn;
  if (fn == nullptr) return nullptr;
  if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__signature__") == 0) {
    PyErr_Clear();
    return bound_signature(self);
  }
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  found = PyObject_GetAttr(fn, name);
  if (found != nullptr) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return found;
  }
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);  // the wrapper's own AttributeError
  return nullptr;
}

PyGetSetDef g_wrapper_getset[] = {{"__self__", &wrapper_self, nullptr, "the module", nullptr},
                                  {"__func__", &wrapper_func, nullptr, "the class's forward", nullptr},
                                  {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMethodDef g_wrapper_methods[] = {
    {"_allocscope_stop", &wrapper_stop, METH_NOARGS, "the watch ended: only call the forward from now on"},
    {"__reduce__", &wrapper_reduce, METH_NOARGS, "getattr(module, 'forward')"},
    {nullptr, nullptr, 0, nullptr}};

// The type, made once (the first watch), or nullptr (no Python error) where
// this Python's partial is not laid out as PartialHead says.
PyTypeObject* wrapper_type() {
  if (g_wrapper_type != nullptr) return g_wrapper_type;
  PyObject* functools = PyImport_ImportModule("functools");
  if (functools == nullptr) return nullptr;
  PyObject* partial = PyObject_GetAttrString(functools, "partial");
  Py_DECREF(functools);
  if (partial == nullptr) return nullptr;
  auto* base = reinterpret_cast<PyTypeObject*>(partial);
  static PyType_Slot slots[] = {{Py_tp_call, reinterpret_cast<void*>(&wrapper_call)},
                                {Py_tp_getattro, reinterpret_cast<void*>(&wrapper_getattro)},
                                {Py_tp_methods, g_wrapper_methods},
                                {Py_tp_getset, g_wrapper_getset},
                                {Py_tp_doc, const_cast<char*>("allocscope: a watched module's forward")},
                                {0, nullptr}};
  Py_ssize_t offset = (base->tp_basicsize + 7) / 8 * 8;
  PyType_Spec spec = {"allocscope._C.WatchedForward", static_cast<int>(offset + sizeof(WrapperState)), 0,
                      Py_TPFLAGS_DEFAULT, slots};
  PyObject* bases = PyTuple_Pack(1, partial);
  Py_DECREF(partial);
  if (bases == nullptr) return nullptr;
  PyObject* type = PyType_FromSpecWithBases(&spec, bases);
  Py_DECREF(bases);
  if (type == nullptr) return nullptr;
  auto* t = reinterpret_cast<PyTypeObject*>(type);
  // Calls go to wrapper_call: never to the partial's vectorcall, which a
  // subtype could inherit with the flag.
  t->tp_flags &= ~Py_TPFLAGS_HAVE_VECTORCALL;
  // The probe: fn and args where PartialHead says.
  PyObject* probe = PyObject_CallFunctionObjArgs(type, base, Py_None, nullptr);
  bool laid_out = probe != nullptr && reinterpret_cast<PartialHead*>(probe)->fn == partial &&
                  PyTuple_Check(reinterpret_cast<PartialHead*>(probe)->args) &&
                  PyTuple_GET_SIZE(reinterpret_cast<PartialHead*>(probe)->args) == 1 &&
                  PyTuple_GET_ITEM(reinterpret_cast<PartialHead*>(probe)->args, 0) == Py_None &&
                  t->tp_basicsize >= offset + static_cast<Py_ssize_t>(sizeof(WrapperState)) &&
                  t->tp_call == reinterpret_cast<ternaryfunc>(&wrapper_call);
  Py_XDECREF(probe);
  PyErr_Clear();
  if (!laid_out) {
    Py_DECREF(type);
    return nullptr;
  }
  g_state_offset = offset;
  g_wrapper_type = t;  // (kept for the process: instances hold it too)
  return t;
}

}  // namespace

PyObject* wrap_forward(PyObject* cls_forward, PyObject* module, uint32_t label, bool leaf, PyObject* output_bytes) {
  PyTypeObject* type = wrapper_type();
  if (type == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  if (g_output_bytes == nullptr) {
    Py_INCREF(output_bytes);
    g_output_bytes = output_bytes;  // (one function for the process: module_scopes.new_output_bytes)
  }
  PyObject* wrapper = PyObject_CallFunctionObjArgs(reinterpret_cast<PyObject*>(type), cls_forward, module, nullptr);
  if (wrapper == nullptr) return nullptr;
  *state_of(wrapper) = WrapperState{Scope{label, leaf}, true};
  return wrapper;
}

PyObject* make(uint32_t label, bool leaf) {
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
