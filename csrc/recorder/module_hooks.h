// The forward hooks of a watched model's modules, the root's aside
// (recording/watcher.py), as C functions.
//
// Every call of a watched module runs a forward pre-hook and a forward hook;
// Python's module call takes its slow path for them (Module._call_impl), and
// the hooks' own Python cost almost as much again (callgrind,
// benchmarks/bench_module_call_instructions.py: 13.7k instructions a call
// for the two, against 16.8k for the slow path with empty hooks). Here
// each hook is a Python function of two lines (it must stay Python:
// torch.compile traces module hooks, and a C function in a compiled region
// would break the graph at every module) that calls one of these, which
// write the MODULE_ENTER/EXIT event with the label interned at watch time.
// The exit of a leaf module also measures its new output bytes (what the
// textbook estimate adds up) where the output and the one input are plain
// tensors; otherwise it leaves that to the Python hook.
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

}  // namespace allocscope::module_hooks
