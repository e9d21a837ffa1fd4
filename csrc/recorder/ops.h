// The ATen op, and in backward the autograd node, behind each allocation.
//
// While recording, a global RecordFunction callback (torch's own profiler
// hook, removed when recording stops) keeps each thread's stack of running
// ops and autograd nodes. An allocation names the stack as it stands: a chain
// of op frames interned into the stack tree (tables.h), outermost first
// (`aten::linear` > `aten::addmm`, or `AddmmBackward0` > `aten::mm`).
//
// Autograd nodes run on the engine's threads, which have no Python frames on
// CUDA. Torch numbers each node with the sequence number of the forward op
// that made it (as its profiler pairs them), so the forward op's Python stack
// is kept under (forward thread, sequence number) when it starts, and an
// allocation inside the node takes that stack: the layer's line, not
// `<no stack>`.
//
// Watched models (recording/watcher.py) write module scopes from Python hooks in the
// forward; the module running when a forward op makes a node is kept with
// its stack, and the node's run in backward is written as that module's
// backward scope (MODULE_ENTER/EXIT with the backward flag), from here: no
// Python hook per node.
//
// The callback is cheap but runs for every op (views and in-place ops too):
// the names of a thread's running ops are kept as pointers and interned only
// when something allocates under them (then found in a per-thread cache of
// chain nodes by parent and name pointer); forward stacks are walked once per
// sequence number, only with grad mode on.
#pragma once

#include <cstdint>

namespace allocscope {
class Recorder;

namespace ops {

// Installs the callback: when a recording starts, or in a running one
// (Recorder::start_ops, at the first watch() of record(ops=None)).
// `forward_stacks`: keep the Python stack of each forward op that makes an
// autograd node. The caller holds the GIL.
void start(bool forward_stacks);
// Removes it. Ops already running finish with their frames popped.
void stop();

// Hot path, the allocating thread, no allocator lock held (interns new op
// frames under the tables' mutex).
struct Current {
  uint32_t op = 0;             // stack-tree node of the op chain; 0: no op runs
  uint32_t forward_stack = 0;  // Python stack of the running node's forward op; 0: none
};
Current current();

// Whether the callback is installed (a recording with ops runs).
bool active();

// The forward module scopes of the calling thread, as recording/watcher.py writes
// them (Recorder::annotate): `label` the module's name (string id).
void module_entered(uint32_t label, bool leaf);
void module_exited(uint32_t label);
// The innermost of them (its label), or `none` when none is open.
uint32_t innermost_module(uint32_t none);
// The same as label + 1 with bit 31 set for a leaf module; 0 when none is open.
uint32_t innermost_packed();

}  // namespace ops
}  // namespace allocscope
