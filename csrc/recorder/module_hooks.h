// What a watched model's modules (the root's aside) run at each call, as C
// functions: recording/module_scopes.py wraps each module's forward in a
// Python function that calls enter() before it and exit() after (a module
// with forward hooks would take Module._call_impl's slow path, 16.9
// thousand instructions a call: benchmarks/bench_module_call_instructions.py).
// The wrapper stays Python because torch.compile traces a module's forward
// and a C function there would break the graph; inside a compiled region it
// only calls the forward. The functions write the MODULE_ENTER/EXIT event
// with the label interned at watch time. The exit of a leaf module also
// measures its new output bytes (what the textbook estimate adds up) where
// the output and the one input are plain tensors; otherwise it leaves that
// to Python. Modules whose forward cannot be wrapped call them from forward
// hooks with the same arguments.
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
