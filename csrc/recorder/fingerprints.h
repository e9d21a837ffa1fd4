// What the watcher checks once a forward or an optimizer step
// (recording/watcher.py), without a Python generator over every tensor:
// whether a model's parameters moved (model.to(), a new storage) and whether
// an optimizer's state holds other tensor objects than at its last step
// (lazily made state, load_state_dict). In Python the two checks cost about
// 40 and 60 microseconds a step on a 100-parameter model with AdamW; here
// they are a loop over pointers.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

namespace allocscope::fingerprints {

// Each call compares what it reads with what the last call read, then keeps
// what it read. The first call reports a change.
class Changes {
 public:
  // places: a list of (weak reference to a module, parameter name); what
  // is compared is the data pointer of each module's parameter of that
  // name (0 for a module gone, a parameter gone or without storage). No
  // reference to the parameters themselves: torch.utils.swap_tensors (a
  // load_state_dict that swaps) refuses a tensor that has a weak reference.
  // Returns -1 with a Python error set when places is not such a list.
  int addresses(PyObject* places);
  // state: an optimizer's state, a dict of dicts; what is compared is the
  // identity of every value of every inner dict, in order (of an inner
  // value that is not a dict, its own).
  int values(PyObject* state);

 private:
  int compare(std::vector<uintptr_t>& now);
  std::vector<uintptr_t> last_;
  bool seen_ = false;
};

}  // namespace allocscope::fingerprints
