// pybind11 glue for allocscope._C: no logic here. The typed facade is in
// python/allocscope/_C.pyi. The test harness is a separate extension
// (csrc/testing/, built for the tests only).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include "cpu_allocator.h"
#include "fingerprints.h"
#include "format/format.h"
#include "gradients.h"
#include "module_hooks.h"
#include "backward_scopes.h"
#include "ops.h"
#include "pystack.h"
#include "saved.h"
#include "recorder.h"
#ifdef ALLOCSCOPE_WITH_CUDA
#include "value_kernels.h"
#include "cuda_allocator.h"
#endif

namespace py = pybind11;
using namespace allocscope;

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
      [](const std::string& path, const std::string& metadata_json, bool python_stacks, bool ops, bool checkpoints,
         bool sigterm_over_foreign, bool remove_if_unused) {
        Recorder::get().start(StartOptions{path, metadata_json, python_stacks, ops, checkpoints,
                                           sigterm_over_foreign, remove_if_unused});
      },
      py::arg("path"), py::arg("metadata_json"), py::arg("python_stacks"), py::arg("ops") = true,
      py::arg("checkpoints") = false, py::arg("sigterm_over_foreign") = false, py::arg("remove_if_unused") = false);
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
        d["removed"] = s.removed;
        return d;
      },
      py::arg("reason"));
  m.def("is_active", [] { return Recorder::get().active(); });
  m.def("ops_active", &ops::active);
  m.def(
      "module_hooks",
      [](const std::string& name, bool leaf, py::object output_bytes) {
        PyObject* pair = module_hooks::make(Recorder::get().intern(name), leaf, output_bytes.ptr());
        if (pair == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(pair);
      },
      py::arg("name"), py::arg("leaf"), py::arg("output_bytes"));
  m.def(
      "innermost_module",
      [](const std::string& none) {
        uint32_t id = ops::innermost_module(InternTables::kFull);
        InternTables& tables = Recorder::get().tables();
        std::lock_guard<std::mutex> lock(tables.mu);
        return id < tables.strings.size() ? std::string(tables.strings[id]) : none;
      },
      py::arg("none"));
  m.def("enable_backward_scopes", &backward_scopes::enable);
  m.def("disable_backward_scopes", &backward_scopes::disable);
  m.def("backward_nested_begin", &backward_scopes::nested_begin);
  m.def("backward_nested_end", &backward_scopes::nested_end);
  m.def("start_ops", [] { return Recorder::get().start_ops(); });
  m.def("walker", [] { return Recorder::get().walker(); });
#ifdef ALLOCSCOPE_WITH_CUDA  // (the virtual GPU's value kernels: vgpu/values.py)
  m.def("register_value_kernel", &value_kernels::register_cuda_kernel, py::arg("name"), py::arg("overload"));
  m.def("values_held", [](py::handle t) { return value_kernels::held(THPVariable_Unpack(t.ptr())); });
  m.def("values_set_held",
        [](py::handle t, bool held) { value_kernels::set_held(THPVariable_Unpack(t.ptr()), held); });
  m.def("values_fill_later", [](py::handle t, py::handle value) {
    const at::Tensor& tensor = THPVariable_Unpack(t.ptr());
    c10::Scalar scalar = PyBool_Check(value.ptr())    ? c10::Scalar(value.cast<bool>())
                         : PyLong_Check(value.ptr())  ? c10::Scalar(value.cast<int64_t>())
                         : PyComplex_Check(value.ptr()) ? c10::Scalar(c10::complex<double>(
                                                              PyComplex_RealAsDouble(value.ptr()),
                                                              PyComplex_ImagAsDouble(value.ptr())))
                                                        : c10::Scalar(value.cast<double>());
    value_kernels::fill_later(tensor, scalar);
  });
  m.def("values_write_fill", [](py::handle t) { value_kernels::write_fill(THPVariable_Unpack(t.ptr())); });
  m.def("values_storage_span", [](py::handle t) { return value_kernels::storage_span(THPVariable_Unpack(t.ptr())); });
  m.def("values_track_frees", &value_kernels::track_frees);
#endif
  m.def(
      "hide_frames_of",
      [](py::object code) {
        if (!PyCode_Check(code.ptr())) throw py::type_error("hide_frames_of takes a code object");
        return pystack::hide(code.ptr());
      },
      py::arg("code"));
  m.def("next_seq", [] { return Recorder::get().next_seq(); });
  m.def("arm_checkpoint", [](bool at_snapshot) { return Recorder::get().arm_checkpoint(at_snapshot); },
        py::arg("at_snapshot"));
  m.def("checkpoint_baseline", [](std::string json) { Recorder::get().checkpoint_baseline(std::move(json)); },
        py::arg("json"));
  m.def(
      "annotate",
      [](uint8_t kind, const std::string& label, uint64_t addr, uint64_t size, bool with_stack) {
        return Recorder::get().annotate(kind, label, addr, size, with_stack);
      },
      py::arg("kind"), py::arg("label"), py::arg("addr") = 0, py::arg("size") = 0, py::arg("with_stack") = false);
  py::class_<saved::Labeler>(m, "SavedTensorLabeler")
      .def(py::init([](bool cuda, bool cpu, const std::string& fallback, const py::list& plain_types, bool route) {
             std::vector<PyObject*> types;
             for (py::handle t : plain_types) types.push_back(t.ptr());
             return std::make_unique<saved::Labeler>(cuda, cpu, fallback, std::move(types), route);
           }),
           py::arg("cuda"), py::arg("cpu"), py::arg("fallback"), py::arg("plain_types"), py::arg("route") = true)
      .def("set_parameters", &saved::Labeler::set_parameters, py::arg("storages"))
      .def("begin_forward", &saved::Labeler::begin_forward)
      .def("close", &saved::Labeler::close)
      .def_property_readonly("packed_natively", &saved::Labeler::packed_natively)
      .def_property_readonly("packed_in_python", &saved::Labeler::packed_in_python)
      .def(
          "pack",
          [](saved::Labeler& self, py::handle tensor) {
            PyObject* out = self.pack(tensor.ptr());
            if (out == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(out);
          },
          py::arg("tensor"))
      .def_static("unpack", [](py::object tensor) { return tensor; }, py::arg("tensor"))
      .def_property_readonly("pack_hook",
                             [](py::object self) {
                               PyObject* fn = saved::Labeler::pack_hook(self.ptr(), &self.cast<saved::Labeler&>());
                               if (fn == nullptr) throw py::error_already_set();
                               return py::reinterpret_steal<py::object>(fn);
                             })
      .def_property_readonly_static("unpack_hook", [](py::object) {
        PyObject* fn = saved::Labeler::unpack_hook();
        if (fn == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(fn);
      });
  py::class_<gradients::Watch>(m, "GradientWatch")
      .def(py::init([](const py::list& params, bool cuda, bool cpu) {
             std::vector<std::pair<PyObject*, std::string>> pairs;
             for (py::handle item : params) {
               auto pair = item.cast<py::tuple>();
               pairs.emplace_back(pair[0].ptr(), pair[1].cast<std::string>());
             }
             return std::make_unique<gradients::Watch>(pairs, cuda, cpu);
           }),
           py::arg("params"), py::arg("cuda"), py::arg("cpu"))
      .def("remove", &gradients::Watch::remove);
  // (Changes' checks return 1, 0, or -1 with a Python error set)
  auto changed = [](int result) {
    if (result < 0) throw py::error_already_set();
    return result == 1;
  };
  py::class_<fingerprints::Changes>(m, "Changes")
      .def(py::init<>())
      .def(
          "addresses",
          [changed](fingerprints::Changes& self, py::handle refs) { return changed(self.addresses(refs.ptr())); },
          py::arg("refs"))
      .def(
          "values",
          [changed](fingerprints::Changes& self, py::handle state) { return changed(self.values(state.ptr())); },
          py::arg("state"));
  m.def("label_gradient", [](py::handle param) { gradients::hooked(param.ptr()); }, py::arg("param"));
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
        py::arg("with_context"),
        py::call_guard<py::gil_scoped_release>());
#endif

  // The format's tables as Python sees them (capture/format.py mirrors them;
  // tests/unit/test_format_constants.py compares the two).
  m.def("format_constants", [] {
    py::dict d, kinds, chunks, columns;
#define ALLOCSCOPE_ITEM(cpp, name, value) table[#name] = int{format::cpp};
    {
      py::dict& table = kinds;
      ALLOCSCOPE_EVENT_KINDS(ALLOCSCOPE_ITEM)
    }
    {
      py::dict& table = chunks;
      ALLOCSCOPE_CHUNK_TYPES(ALLOCSCOPE_ITEM)
    }
    {
      py::dict& table = columns;
      ALLOCSCOPE_COLUMNS(ALLOCSCOPE_ITEM)
    }
#undef ALLOCSCOPE_ITEM
    d["magic"] = py::bytes(format::kMagic, sizeof(format::kMagic));
    d["version"] = format::kFormatVersion;
    d["header_size"] = format::kHeaderSize;
    d["chunk_header_size"] = format::kChunkHeaderSize;
    d["via_allocator"] = format::kViaAllocator;
    d["kind_mask"] = format::kKindMask;
    d["first_annotation"] = int{format::kFirstAnnotation};
    d["last_annotation"] = int{format::kLastAnnotation};
    d["module_backward"] = format::kModuleBackward;
    d["module_leaf"] = format::kModuleLeaf;
    d["module_restored"] = format::kModuleRestored;
    d["encodings"] = py::dict(py::arg("RAW") = int{format::kEncRaw}, py::arg("CONST") = int{format::kEncConst},
                              py::arg("DENSE") = int{format::kEncDense}, py::arg("SPARSE") = int{format::kEncSparse});
    d["kinds"] = kinds;
    d["chunks"] = chunks;
    d["columns"] = columns;
    return d;
  });
#ifdef ALLOCSCOPE_WITH_CUDA
  // The test seam of the CUDA wrapper (cuda_allocator.h): a capsule holding
  // the Environment* to use, from the test-only extension; None: the real one.
  m.def("set_cuda_environment", [](py::object capsule) {
    cuda::set_environment(capsule.is_none() ? nullptr
                                            : py::reinterpret_borrow<py::capsule>(capsule).get_pointer<cuda::Environment>());
  });
#endif
}
