// What a watched model's modules (the root's aside) run at each call, in C.
// recording/module_scopes.py puts in each module's instance attribute
// `forward` a functools.partial(cls_forward, module) of wrap_forward's type,
// whose call writes the MODULE_ENTER/EXIT events around the forward (a
// module with forward hooks would take Module._call_impl's slow path, and a
// Python wrapper costs a frame: benchmarks/bench_module_call_instructions.py).
// A partial because torch.compile reads one as the call it stands for and
// traces the class's forward alone, where a C callable of another type would
// break the graph at every module. The label is interned at watch time. The
// exit of a leaf module also measures its new output bytes (what the
// textbook estimate adds up) where the output and the one input are plain
// tensors; otherwise Python's new_output_bytes does. make() gives the same
// writes as two functions, enter() and exit(), for modules whose forward
// cannot be wrapped (called from forward hooks) and for the Python wrapper
// where this Python's partial is laid out otherwise.
#pragma once

#include <Python.h>

#include <cstdint>

namespace allocscope::module_hooks {

// (enter, exit) for one module: enter(module, args) writes its ENTER;
// exit(module, args, output) its EXIT and returns True, or returns False
// without writing anything for a leaf whose output bytes it cannot read
// (the caller then writes the EXIT with them). `label`: the module's name,
// interned in the running recording. New references; nullptr with a
// Python error set.
PyObject* make(uint32_t label, bool leaf);

// The module's wrapped forward: a functools.partial(cls_forward, module)
// whose call writes the ENTER and EXIT around it, as enter() and exit() do
// (`output_bytes(args, output)`: a leaf's new output bytes where exit()
// could not read them); its _allocscope_stop() leaves only the call. None
// where this Python's partial is not laid out as the type needs (the caller
// wraps in Python then). New reference; nullptr with a Python error set.
PyObject* wrap_forward(PyObject* cls_forward, PyObject* module, uint32_t label, bool leaf, PyObject* output_bytes);

}  // namespace allocscope::module_hooks
