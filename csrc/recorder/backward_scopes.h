// Backward module scopes of watched models where ops are not recorded:
// from the autograd node each allocation is made in, with no callback per op
// or per node and no Python hook per module call.
//
// Where ops are recorded, the op callback writes a module's backward scope
// while an autograd node its forward made runs (ops.h). Without the op
// callback (record(ops=False)), the same scopes come from two cheap reads:
//  - in the forward, each module scope change (the watcher's hooks, through
//    Recorder::annotate) is kept with the thread's autograd sequence number
//    at that moment: the innermost module open when a node numbered s was
//    made is the one the last change at or before s left open;
//  - at each event a thread writes (an allocation, an annotation), the
//    engine's current node (torch::autograd::get_current_node, which is set
//    while the engine evaluates a node, the gradients it sums for the next
//    nodes included) says which node runs; when it changed since the
//    thread's last event, the old node's scope is closed and the new one's
//    opened, before the event.
// Every allocation so sits in the scope the op callback would have put it
// in (the scopes open and close later, at the thread's next event, which no
// analysis can tell apart). A backward called from inside a node (a
// reentrant checkpoint's) nests: the Python wrapper that marks the backward
// phase says when it begins and ends (recording/phases.py).
#pragma once

#include <cstdint>

namespace allocscope {
class EmitScope;

namespace backward_scopes {

// Counted: a watch of a recording without ops turns them on, its removal off.
void enable();
void disable();
// Whether any watch wants them (a relaxed read for the hot path).
bool active();

// The calling thread's innermost forward module scope changed (a watched
// module's forward began or ended): `innermost` is its label + 1 (bit 31:
// leaf), 0 for none.
void forward_changed(uint32_t innermost);
// A PHASE annotation: the analysis closes every open backward scope there.
void phase_changed();
// Before the calling thread writes an event: opens and closes backward
// scopes for the node it runs in.
void sync(EmitScope& scope);
// A backward begins inside a node on this thread (reentrant): the node's
// scope stays open under the nested nodes' until nested_end(). Returns
// whether the calling thread runs a node (only then is nested_end() due).
bool nested_begin();
void nested_end();

}  // namespace backward_scopes
}  // namespace allocscope
