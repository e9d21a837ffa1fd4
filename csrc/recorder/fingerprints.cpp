#include "fingerprints.h"

#include <torch/csrc/autograd/python_variable.h>

namespace allocscope::fingerprints {

int Changes::compare(std::vector<uintptr_t>& now) {
  bool changed = !seen_ || now != last_;
  seen_ = true;
  if (changed) last_.swap(now);
  return changed ? 1 : 0;
}

namespace {

// The data pointer of the parameter `name` of the module `ref` refers to (0: none).
uintptr_t parameter_address(PyObject* ref, PyObject* name) {
  PyObject* module = PyWeakref_GetObject(ref);  // borrowed; None once the module is gone
  if (module == Py_None) return 0;
  PyObject* params = PyObject_GetAttrString(module, "_parameters");
  if (params == nullptr) {
    PyErr_Clear();
    return 0;
  }
  PyObject* p = PyDict_Check(params) ? PyDict_GetItemWithError(params, name) : nullptr;  // borrowed
  uintptr_t ptr = 0;
  if (p != nullptr && THPVariable_Check(p)) {
    const at::Tensor& t = THPVariable_Unpack(p);
    try {
      if (t.has_storage()) ptr = reinterpret_cast<uintptr_t>(t.data_ptr());
    } catch (const c10::Error&) {  // (a storage that cannot be read: as gone)
      ptr = 0;
    }
  }
  PyErr_Clear();
  Py_DECREF(params);
  return ptr;
}

}  // namespace

int Changes::addresses(PyObject* places) {
  static const char* kWhat = "addresses() takes a list of (weak reference to a module, parameter name)";
  if (!PyList_Check(places)) {
    PyErr_SetString(PyExc_TypeError, kWhat);
    return -1;
  }
  std::vector<uintptr_t> now;
  now.reserve(static_cast<size_t>(PyList_GET_SIZE(places)));
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(places); ++i) {
    PyObject* place = PyList_GET_ITEM(places, i);
    if (!PyTuple_Check(place) || PyTuple_GET_SIZE(place) != 2 || !PyWeakref_Check(PyTuple_GET_ITEM(place, 0)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(place, 1))) {
      PyErr_SetString(PyExc_TypeError, kWhat);
      return -1;
    }
    now.push_back(parameter_address(PyTuple_GET_ITEM(place, 0), PyTuple_GET_ITEM(place, 1)));
  }
  return compare(now);
}

int Changes::values(PyObject* state) {
  if (!PyDict_Check(state)) {
    PyErr_SetString(PyExc_TypeError, "values() takes a dict of dicts");
    return -1;
  }
  std::vector<uintptr_t> now;
  Py_ssize_t pos = 0;
  PyObject *key, *inner;
  while (PyDict_Next(state, &pos, &key, &inner)) {
    if (!PyDict_Check(inner)) {  // (not a dict: the object itself)
      now.push_back(reinterpret_cast<uintptr_t>(inner));
      continue;
    }
    Py_ssize_t inner_pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(inner, &inner_pos, &k, &v)) now.push_back(reinterpret_cast<uintptr_t>(v));
  }
  return compare(now);
}

}  // namespace allocscope::fingerprints
