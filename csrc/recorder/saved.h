// The saved-tensor pack hook of a watched model's forward (recording/watcher.py).
//
// Autograd calls the pack hook for every tensor it saves for backward; the
// hook labels each storage once per forward as an ACTIVATION of the innermost
// module open on this thread (the forward module scopes the watcher writes,
// ops.h keeps them per thread) and returns what to save: the tensor itself
// where it has no grad_fn, else its data without autograd's metadata (the
// saved tensor must not hold its own grad_fn: a reference cycle). Written in C++
// because it runs for every saved tensor: in Python it cost a frame, several
// attribute lookups, a storage object and a detach through the Python API for
// each. Here it costs what torch's hook mechanism costs with hooks that do
// nothing (benchmarks/bench_saved_hook.py); that mechanism (a Python call with
// the GIL per pack and per unpack) is most of what remains. So a Labeler that
// routes (the default) also has autograd ask allocscope's engine for the hooks
// (saved_engine.h): where this labeler's pack function is on top of the
// saved-tensor hooks' stack, the same packing runs in C++ (pack_native), with
// no Python at all.
#pragma once

#include <Python.h>
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "address_set.h"

namespace allocscope::saved {

class Labeler {
 public:
  // cuda/cpu: the recorded devices (tensors elsewhere get no label);
  // fallback: the label when no module is open (the watch's name);
  // plain_types: the Python types whose data is taken without a Python
  // call (torch.Tensor, torch.nn.Parameter); other types (subclasses with
  // __torch_function__) are detached through their own detach().
  // route: hold allocscope's engine (saved_engine.h) until close().
  Labeler(bool cuda, bool cpu, const std::string& fallback, std::vector<PyObject*> plain_types, bool route);
  ~Labeler();
  Labeler(const Labeler&) = delete;
  Labeler& operator=(const Labeler&) = delete;

  // The storages labelled already (the model's parameters): they stay what
  // they are. Given when they change, not at every forward (a list through
  // pybind11 cost ~100 thousand instructions a step).
  void set_parameters(const std::vector<uint64_t>& storages);
  // A forward of the model begins: each storage is labelled once in it.
  void begin_forward();
  // The hook: a new reference to the tensor to save, or nullptr with a Python
  // error set. The caller holds the GIL.
  PyObject* pack(PyObject* tensor);
  // The same for the engine route, in C++: labels the tensor and returns what
  // to keep of it. Runs without the GIL (it takes it only to detach a tensor
  // of a Python subclass through its own detach()).
  at::Tensor pack_native(const at::Tensor& tensor);
  // Annotates the tensor's storage as an activation of the innermost open
  // module, once per forward (what both packs do first). Any thread.
  void label(const at::Tensor& t);
  // The Labeler whose pack hook `fn` is, or nullptr. Reads the function
  // object's fields only: safe without the GIL while the hook is on the stack.
  static Labeler* of_pack_hook(PyObject* fn);
  // Releases the engine route (idempotent; the destructor calls it).
  void close();
  // Tensors packed by each way (for tests: which one autograd took).
  uint64_t packed_natively() const { return packed_natively_.load(std::memory_order_relaxed); }
  uint64_t packed_in_python() const { return packed_in_python_.load(std::memory_order_relaxed); }

  // The hooks as Python callables that are plain C functions (METH_O): torch
  // calls them for every saved tensor, and a pybind11 method's argument
  // dispatch cost about as much as the labelling. `owner` is the Python
  // object that holds this Labeler: the pack hook keeps it alive.
  static PyObject* pack_hook(PyObject* owner, Labeler* labeler);
  // Returns its argument: what is saved is the tensor pack returned.
  static PyObject* unpack_hook();

 private:
  // What both packs do: label the tensor, and return what to keep of it.
  at::Tensor keep(const at::Tensor& t);
  bool plain(PyObject* type) const;

  bool cuda_, cpu_;
  uint32_t fallback_;
  std::vector<PyObject*> plain_types_;  // strong references
  std::mutex mutex_;  // the sets: the engine route packs without the GIL
  std::unordered_set<uint64_t> parameters_;
  AddressSet labelled_;
  bool routed_;
  std::atomic<uint64_t> packed_natively_{0}, packed_in_python_{0};
};

}  // namespace allocscope::saved
