#include "fingerprints.h"

#include <torch/csrc/autograd/python_variable.h>

namespace allocscope::fingerprints {

int Changes::compare(std::vector<uintptr_t>& now) {
  bool changed = !seen_ || now != last_;
  seen_ = true;
  if (changed) last_.swap(now);
  return changed ? 1 : 0;
}

int Changes::addresses(PyObject* refs) {
  if (!PyList_Check(refs)) {
    PyErr_SetString(PyExc_TypeError, "addresses() takes a list of weak references");
    return -1;
  }
  std::vector<uintptr_t> now;
  now.reserve(static_cast<size_t>(PyList_GET_SIZE(refs)));
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(refs); ++i) {
    PyObject* ref = PyList_GET_ITEM(refs, i);
    if (!PyWeakref_Check(ref)) {
      PyErr_SetString(PyExc_TypeError, "addresses() takes a list of weak references");
      return -1;
    }
    PyObject* obj = PyWeakref_GetObject(ref);  // borrowed; None once the tensor is gone
    uintptr_t ptr = 0;
    if (obj != Py_None && THPVariable_Check(obj)) {
      const at::Tensor& t = THPVariable_Unpack(obj);
      try {
        if (t.has_storage()) ptr = reinterpret_cast<uintptr_t>(t.data_ptr());
      } catch (const c10::Error&) {  // (a storage that cannot be read: as gone)
        ptr = 0;
      }
    }
    now.push_back(ptr);
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
