// Test-only module: exposes the stack walker to pytest on any CPython, without
// torch. Built by tests/unit/test_pystack.py with the interpreter under test.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "recorder/pystack.h"

using namespace allocscope::pystack;

namespace {

PyObject* frames_to_list(const RawFrame* frames, int n, Walker walker) {
  PyObject* list = PyList_New(n);
  for (int i = 0; i < n; ++i) {
    Symbol s = symbolize(frames[i], walker);
    PyList_SET_ITEM(list, i, Py_BuildValue("(ssi)", s.filename.c_str(), s.function.c_str(), s.line));
  }
  return list;
}

PyObject* self_check_py(PyObject*, PyObject*) {
  std::string why;
  bool ok = self_check(&why);
  return Py_BuildValue("(Os)", ok ? Py_True : Py_False, why.c_str());
}

// Walks with the given walker, with the GIL released first when asked: the
// situation of an allocation made inside an op that released the GIL.
PyObject* walk_py(PyObject*, PyObject* args) {
  int internal = 0, release = 0;
  if (!PyArg_ParseTuple(args, "pp", &internal, &release)) return nullptr;
  Walker walker = internal ? Walker::kInternal : Walker::kGil;
  RawFrame frames[256];
  int n = 0;
  if (release) {
    Py_BEGIN_ALLOW_THREADS
    n = walk(walker, frames, 256);
    Py_END_ALLOW_THREADS
  } else {
    n = walk(walker, frames, 256);
  }
  return frames_to_list(frames, n, walker);
}

PyObject* compiled_py(PyObject*, PyObject*) {
  return PyBool_FromLong(internal_walker_compiled());
}

PyMethodDef methods[] = {
    {"self_check", self_check_py, METH_NOARGS, nullptr},
    {"walk", walk_py, METH_VARARGS, nullptr},
    {"internal_walker_compiled", compiled_py, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pystack_harness", nullptr, -1, methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__pystack_harness() {
  return PyModule_Create(&module);
}
