// pybind11 glue for allocscope_testing, the test-only extension (built for the
// tests, never installed with allocscope; tests/native/build.py): no logic.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <thread>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/flat_hash_map.h>

#include "format/columns.h"
#include "recorder/address_set.h"
#include "recorder/pystack.h"
#ifdef ALLOCSCOPE_WITH_CUDA
#include "fake_cuda.h"
#endif

namespace py = pybind11;

namespace allocscope::testing {

#ifdef ALLOCSCOPE_WITH_CUDA
struct FakeBuffer {
  c10::DataPtr ptr;
  uint64_t size;
};
#endif

namespace {

void register_bindings(py::module_& m) {
  m.def("pystack_self_check", [] {
    std::string why;
    bool ok = pystack::self_check(&why);
    return py::make_tuple(ok, why);
  });
  m.def("encode_column", [](const std::vector<uint64_t>& values) {
    std::vector<uint8_t> out;
    format::encode_column(values, &out);
    return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
  });
  // Allocations from threads with no Python state at all (like the autograd
  // engine's device threads): each thread allocates and frees `count` buffers.
  m.def(
      "cpu_alloc_from_native_threads",
      [](int threads, int count, uint64_t size) {
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([count, size] {
            for (int i = 0; i < count; ++i) c10::DataPtr d = c10::GetCPUAllocator()->allocate(size);
          });
        }
        for (auto& th : pool) th.join();
      },
      py::call_guard<py::gil_scoped_release>());

  // c10's hash map of memory pools (graph_pools_freeable's type), for the
  // model's copy of its iteration order (allocator/hashmap.py). ops: (0, a, b)
  // inserts pool (a, b), (1, a, b) erases it, (2, m, r) walks the map as
  // release_cached_blocks does, erasing each pool whose hash % m == r. Returns
  // the keys each walk visited, then the final order.
  m.def("flat_hash_map_walks", [](const std::vector<std::tuple<int, uint64_t, uint64_t>>& ops) {
    ska::flat_hash_map<c10::MempoolId_t, int, c10::MempoolIdHash> map;
    std::vector<std::vector<c10::MempoolId_t>> walks;
    for (const auto& [op, a, b] : ops) {
      if (op == 0) {
        map.insert({{a, b}, 0});
      } else if (op == 1) {
        map.erase(c10::MempoolId_t{a, b});
      } else {
        walks.emplace_back();
        for (auto it = map.begin(); it != map.end();) {
          walks.back().push_back(it->first);
          if (c10::MempoolIdHash{}(it->first) % a == b) {
            it = map.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    walks.emplace_back();
    for (const auto& kv : map) walks.back().push_back(kv.first);
    return walks;
  });

  // The saved-tensor labeler's set (recorder/address_set.h). ops: an address
  // (non-zero) to insert, or 0 to clear. Returns what each insert returned.
  m.def("address_set_inserts", [](const std::vector<uint64_t>& ops) {
    allocscope::AddressSet set;
    std::vector<bool> added;
    for (uint64_t op : ops) {
      if (op == 0) {
        set.clear();
      } else {
        added.push_back(set.insert(op));
      }
    }
    return added;
  });

#ifdef ALLOCSCOPE_WITH_CUDA
  py::class_<FakeBuffer>(m, "FakeBuffer")
      .def_property_readonly("ptr", [](const FakeBuffer& b) { return reinterpret_cast<uintptr_t>(b.ptr.get()); })
      .def_readonly("size", &FakeBuffer::size)
      .def("free", [](FakeBuffer& b) { b.ptr.clear(); })
      .def("record_stream", [](FakeBuffer& b, uint64_t stream) { record_stream(b.ptr, stream); });
  m.def("install_fake_cuda", [] { return py::capsule(install_fake(), "allocscope.cuda.Environment"); });
  m.def("fake_counters", &counters);
  m.def("fake_reset_counters", &reset_counters);
  m.def("fake_set_limit", &set_limit);
  m.def("fake_set_stream", &set_stream);
  m.def("fake_process_events", &process_events);
  m.def("fake_live_bytes", &live_bytes);
  m.def(
      "fake_allocate",
      [](uint64_t n, bool bypass, bool release_gil) {
        if (release_gil) {
          py::gil_scoped_release nogil;
          return FakeBuffer{allocate(n, bypass), n};
        }
        return FakeBuffer{allocate(n, bypass), n};
      },
      py::arg("n"), py::arg("bypass") = false, py::arg("release_gil") = false);
  m.def("fake_raw_alloc", &raw_alloc, py::arg("n"), py::arg("with_stream") = false);
  m.def("fake_raw_delete", &raw_delete);
  m.def("fake_empty_cache", &empty_cache);
  m.def("fake_check_forwarding", &check_forwarding);
#endif
}

}  // namespace

}  // namespace allocscope::testing

PYBIND11_MODULE(allocscope_testing, m) {
  m.doc() = "allocscope's test-only harness: a fake CUDA allocator, the stack walker's self-check, encoders";
  allocscope::testing::register_bindings(m);
}
