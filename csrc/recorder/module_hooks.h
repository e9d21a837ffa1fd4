// What a watched module (the root's aside) runs at each call, in C: the
// MODULE_ENTER and MODULE_EXIT events. recording/global_hooks.py calls them
// from the process's global forward hooks, which look the module up; a
// Python function there per module would cost a frame and the arguments
// packed again. The label is interned at watch time. The exit of a leaf
// module also measures its new output bytes (what the textbook estimate
// adds up): here where the output and the one input are plain tensors,
// otherwise through Python's new_output_bytes.
#pragma once

#include <Python.h>

#include <cstdint>

namespace allocscope::module_hooks {

// (enter, exit) for one module: enter(module, args) writes its ENTER;
// exit(module, args, output) its EXIT (a leaf's with its new output bytes,
// output None after an exception: 0). `label`: the module's name, interned
// in the running recording; `output_bytes(args, output)`:
// module_scopes.new_output_bytes, kept for the process. New reference;
// nullptr with a Python error set.
PyObject* make(uint32_t label, bool leaf, PyObject* output_bytes);

}  // namespace allocscope::module_hooks
