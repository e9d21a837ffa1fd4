// Gradient labels of a watched model, without a Python hook per parameter
// (recording/watcher.py).
//
// A parameter's gradient is accumulated by its AccumulateGrad node, which
// the autograd engine runs inside a RecordFunction frame of its own
// (BACKWARD_FUNCTION scope, sequence number -1). Where ops are recorded, the
// op callback (ops.cpp) sees that frame end; the node being evaluated is then
// still the engine's current node, and its `variable` is the parameter. The
// gradient is labelled there, at the moment a post-accumulate-grad hook
// would have run (after any the program registered: a hook that takes the
// gradient away, as an optimizer run in backward does, leaves none to label).
// Where ops are not recorded, the watcher registers `hooked` as each
// parameter's post-accumulate-grad hook: a call into C++, no Python frame.
//
// Parameters are known by their TensorImpl's address, with no reference to
// them, weak or strong: torch.utils.swap_tensors (a load_state_dict or a
// module.to() that swaps, under torch.__future__.
// set_swap_module_params_on_conversion) refuses a tensor with either. A
// model deleted while watched frees its memory as it would unwatched, and
// its watch's table goes with it (the watch ends when its model does). Where
// parameters move or are replaced, the watcher makes the table anew at the
// model's next forward; until then a replaced parameter's address could be
// another tensor's, whose gradient would take the parameter's name (a
// gradient accumulated between a replacement and the next forward).
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace at {
class RecordFunction;
}

namespace allocscope::gradients {

// One watch's parameters. The caller holds the GIL.
class Watch {
 public:
  // params: (parameter, name) pairs; cuda/cpu: the recorded devices
  // (gradients elsewhere get no label).
  Watch(const std::vector<std::pair<PyObject*, std::string>>& params, bool cuda, bool cpu);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
  // Forgets the parameters (idempotent; also on destruction).
  void remove();

 private:
  uint64_t id_;
};

// From the op callback, when a BACKWARD_FUNCTION frame with sequence number
// -1 ends on this thread: labels the gradient of the parameter the current
// AccumulateGrad node accumulated into, if it is watched.
void accumulated();

// From a post-accumulate-grad hook on a watched parameter (where ops are
// not recorded): labels its gradient. The caller holds the GIL.
void hooked(PyObject* param);

// Whether any parameter is watched (a relaxed read for the hot path).
bool any();

}  // namespace allocscope::gradients
