// pybind11 glue for allocscope._C: no logic here. The typed facade is in
// python/allocscope/_C.pyi; the test harness is bound in testing/bindings.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cpu_allocator.h"
#include "format.h"
#include "ops.h"
#include "recorder.h"
#ifdef ALLOCSCOPE_WITH_CUDA
#include "cuda_allocator.h"
#endif

namespace py = pybind11;
using namespace allocscope;

namespace allocscope::testing {
void register_bindings(py::module_& m);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "allocscope native core: allocator wrappers and the capture recorder";

  m.def("built_with_cuda", [] {
#ifdef ALLOCSCOPE_WITH_CUDA
    return true;
#else
    return false;
#endif
  });

  m.def(
      "start",
      [](const std::string& path, const std::string& metadata_json, bool python_stacks, bool ops) {
        Recorder::get().start(StartOptions{path, metadata_json, python_stacks, ops});
      },
      py::arg("path"), py::arg("metadata_json"), py::arg("python_stacks"), py::arg("ops") = true);
  m.def(
      "stop",
      [](const std::string& reason) {
        StopSummary s = Recorder::get().stop(reason);
        py::dict d;
        d["events"] = s.events;
        d["dropped"] = s.dropped;
        d["bytes"] = s.bytes;
        d["stacks"] = s.stacks;
        d["stack_misses"] = s.stack_misses;
        d["stack_overflows"] = s.stack_overflows;
        d["error"] = s.error;
        return d;
      },
      py::arg("reason"));
  m.def("is_active", [] { return Recorder::get().active(); });
  m.def("ops_active", &ops::active);
  m.def("walker", [] { return Recorder::get().walker(); });
  m.def("next_seq", [] { return Recorder::get().next_seq(); });
  m.def(
      "annotate",
      [](uint8_t kind, const std::string& label, uint64_t addr, uint64_t size, bool with_stack) {
        return Recorder::get().annotate(kind, label, addr, size, with_stack);
      },
      py::arg("kind"), py::arg("label"), py::arg("addr") = 0, py::arg("size") = 0, py::arg("with_stack") = false);
  m.def(
      "add_baseline",
      [](std::string json) { Recorder::get().add_json_chunk(format::kChunkBaseline, std::move(json)); },
      py::arg("json"));

  m.def("install_cpu", &cpu::install);
  m.def("uninstall_cpu", &cpu::uninstall);
  m.def("cpu_installed", &cpu::installed);

#ifdef ALLOCSCOPE_WITH_CUDA
  m.def("install_cuda", &cuda::install, py::call_guard<py::gil_scoped_release>());
  m.def("uninstall_cuda", &cuda::uninstall);
  m.def("cuda_installed", &cuda::installed);
  m.def("cuda_tracker_attached", &cuda::tracker_attached);
  m.def("cuda_wrapped_name", &cuda::wrapped_name);
  m.def("cuda_baseline_json", &cuda::baseline_json, py::arg("label"), py::arg("devices"),
        py::call_guard<py::gil_scoped_release>());
#endif

  m.def("format_constants", [] {
    py::dict d;
    d["magic"] = py::bytes(format::kMagic, sizeof(format::kMagic));
    d["version"] = format::kFormatVersion;
    d["chunk_header_size"] = format::kChunkHeaderSize;
    d["via_allocator"] = format::kViaAllocator;
    py::dict kinds;
    kinds["ALLOC"] = int{format::kAlloc};
    kinds["FREE"] = int{format::kFree};
    kinds["FREE_COMPLETED"] = int{format::kFreeCompleted};
    kinds["SEGMENT_ALLOC"] = int{format::kSegmentAlloc};
    kinds["SEGMENT_FREE"] = int{format::kSegmentFree};
    kinds["SEGMENT_MAP"] = int{format::kSegmentMap};
    kinds["SEGMENT_UNMAP"] = int{format::kSegmentUnmap};
    kinds["OOM"] = int{format::kOom};
    kinds["EMPTY_CACHE"] = int{format::kEmptyCache};
    kinds["SET_FRACTION"] = int{format::kSetFraction};
    kinds["SNAPSHOT"] = int{format::kSnapshot};
    kinds["POOL_BEGIN"] = int{format::kPoolBegin};
    kinds["POOL_END"] = int{format::kPoolEnd};
    kinds["POOL_RELEASE"] = int{format::kPoolRelease};
    kinds["POOL_ALLOC"] = int{format::kPoolAlloc};
    kinds["MARK"] = int{format::kMark};
    kinds["MODULE_ENTER"] = int{format::kModuleEnter};
    kinds["MODULE_EXIT"] = int{format::kModuleExit};
    kinds["PHASE"] = int{format::kPhase};
    kinds["WATCH"] = int{format::kWatch};
    kinds["PARAMETER"] = int{format::kParameter};
    kinds["BUFFER"] = int{format::kBuffer};
    kinds["GRADIENT"] = int{format::kGradient};
    kinds["OPTIMIZER_STATE"] = int{format::kOptimizerState};
    kinds["ACTIVATION"] = int{format::kActivation};
    kinds["INPUT"] = int{format::kInput};
    d["kinds"] = kinds;
    py::dict chunks;
    chunks["METADATA"] = int{format::kChunkMetadata};
    chunks["STRINGS"] = int{format::kChunkStrings};
    chunks["FRAMES"] = int{format::kChunkFrames};
    chunks["STACKS"] = int{format::kChunkStacks};
    chunks["THREADS"] = int{format::kChunkThreads};
    chunks["STREAMS"] = int{format::kChunkStreams};
    chunks["EVENTS"] = int{format::kChunkEvents};
    chunks["BASELINE"] = int{format::kChunkBaseline};
    chunks["FOOTER"] = int{format::kChunkFooter};
    d["chunks"] = chunks;
    return d;
  });

  py::module_ testing = m.def_submodule("_testing", "test-only harness; not part of the API");
  allocscope::testing::register_bindings(testing);
}
