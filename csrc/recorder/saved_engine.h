// Autograd's saved-tensor hooks for a watched forward, without Python.
//
// Autograd asks the process's default engine for the hooks of every tensor it
// saves (SavedVariable's constructor, Engine::get_default_saved_variable_hooks).
// torch's Python engine answers with the pair on top of the saved_tensors_hooks
// stack, wrapped so that each pack and each unpack is a Python call: a hook
// object, a Python tensor and three GIL acquisitions per saved tensor, about
// 7 thousand instructions where allocscope's own labelling costs a few hundred
// (docs/attribution.md, "What watching costs").
//
// While a routing Labeler (saved.h) lives, allocscope's engine is the default
// one (torch::autograd::set_default_engine_stub, the indirection torch keeps
// for its own Python engine). It answers exactly as the engine it replaced,
// to which it hands everything (backward itself runs there: Python's backward
// calls torch's engine directly), except in one case: where the pair on top
// of this thread's stack is a Labeler's own pack function, it returns C++
// hooks that do what that function does (Labeler::pack_native) and keep the
// result for unpack. The watcher still pushes its pair with
// saved_tensors_hooks, so nesting, a program's own hooks inside the forward
// (they are on top: they pack, unlabelled, as before), the stack's
// propagation to autograd's threads and the switches that disable hooks
// behave as before; only the calls into Python are gone.
//
// One case changes on purpose: a program's own pair below the watcher's (its
// saved_tensors_hooks around the whole step, as torch.autograd.graph.
// save_on_cpu) was hidden by the watcher's during a watched forward, so its
// activations stayed where they would not have been. Now that pair packs, as
// without the watch, and what it keeps, if a tensor, gets the label.
#pragma once

namespace allocscope::saved {

// Makes allocscope's engine the default one; counted, each call needs its
// release_engine(). When the count returns to zero, the engine it replaced is
// the default again (unless someone replaced allocscope's in between).
void hold_engine();
void release_engine();

}  // namespace allocscope::saved
