// pybind11 glue for allocscope._analysis, the analysis' hot loops in C++
// (no torch): the replay's inputs as bound structs with named fields
// (Config, DeviceSetup, LoadedSegment, LoadedBlock), numpy columns borrowed,
// results converted back. No logic here: the facades are
// python/allocscope/allocator/native.py and attribution/scopes.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <unordered_set>

#include "decode.h"
#include "pairs.h"
#include "replay.h"
#include "scopes.h"

namespace py = pybind11;

namespace allocscope::replay {

namespace {

template <typename T>
using Column = py::array_t<T, py::array::c_style>;

template <typename T>
const T* data_of(const Column<T>& a, size_t n, const char* name) {
  if (static_cast<size_t>(a.size()) != n) throw std::invalid_argument(std::string("replay: column ") + name + " has the wrong length");
  return a.data();
}

}  // namespace

// A vector handed to numpy without a copy: the array owns it.
py::array_t<int64_t> to_numpy(std::vector<int64_t>&& v) {
  auto* owned = new std::vector<int64_t>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<int64_t>*>(p); });
  return py::array_t<int64_t>({owned->size()}, {sizeof(int64_t)}, owned->data(), free_when_done);
}

namespace {

py::list segments_to_python(const std::vector<SegmentOut>& segs) {
  py::list out;
  for (const SegmentOut& s : segs) {
    py::list blocks;
    for (const BlockOut& b : s.blocks) blocks.append(py::make_tuple(b.addr, b.size, b.requested, b.state, b.event));
    out.append(py::make_tuple(s.device, s.addr, s.size, s.stream, s.large, blocks));
  }
  return out;
}

py::dict device_to_python(const DeviceResult& d) {
  py::dict o;
  o["device"] = d.device;
  o["num_alloc_retries"] = d.num_alloc_retries;
  o["num_ooms"] = d.num_ooms;
  o["num_device_alloc"] = d.num_device_alloc;
  o["num_device_free"] = d.num_device_free;
  o["num_gc_runs"] = d.num_gc_runs;
  o["reserved"] = d.reserved;
  o["allocated"] = d.allocated;
  o["active"] = d.active;
  o["peak_reserved"] = d.peak_reserved;
  o["peak_allocated"] = d.peak_allocated;
  o["emitted"] = d.emitted;
  o["matched"] = d.matched;
  if (d.mismatch) {
    py::object rec = py::none();
    if (d.mismatch_has_recorded)
      rec = py::make_tuple(d.recorded_event, d.recorded.kind, d.recorded.addr, d.recorded.size);
    o["mismatch"] = py::make_tuple(d.mismatch_position, rec,
                                   py::make_tuple(d.simulated.request, d.simulated.kind, d.simulated.addr,
                                                  d.simulated.size));
  } else {
    o["mismatch"] = py::none();
  }
  return o;
}

}  // namespace

py::dict run_replay(const Config& cfg, bool faithful, uint64_t synthetic_start,
                    const std::vector<DeviceSetup>& setups, const Column<uint8_t>& kind, const Column<uint64_t>& addr,
                    const Column<uint64_t>& size, const Column<uint64_t>& block, const Column<uint64_t>& arg,
                    const Column<uint16_t>& stream, const Column<uint8_t>& deferred, std::vector<int64_t> stream_device,
                    std::vector<int64_t> stream_handle, std::vector<int64_t> states_at, int64_t stop_after) {
  Events ev;
  ev.n = static_cast<size_t>(kind.size());
  ev.kind = kind.data();
  ev.addr = data_of(addr, ev.n, "addr");
  ev.size = data_of(size, ev.n, "size");
  ev.block = data_of(block, ev.n, "block");
  ev.arg = data_of(arg, ev.n, "arg");
  ev.stream = data_of(stream, ev.n, "stream");
  ev.deferred = data_of(deferred, ev.n, "deferred");
  Result r;
  {
    py::gil_scoped_release nogil;
    r = run(cfg, faithful, synthetic_start, setups, ev, stream_device, stream_handle, states_at, stop_after);
  }
  py::dict out;
  out["reserved"] = to_numpy(std::move(r.reserved));
  out["allocated"] = to_numpy(std::move(r.allocated));
  out["active"] = to_numpy(std::move(r.active));
  out["largest_free"] = to_numpy(std::move(r.largest_free));
  out["block_sizes"] = to_numpy(std::move(r.block_sizes));
  py::list ooms;
  for (const Oom& o : r.ooms)
    ooms.append(py::make_tuple(o.event, o.device, o.size, o.rounded, o.stream, o.recorded, o.reserved, o.allocated,
                               o.active, o.capacity, o.allowed, segments_to_python(o.segments)));
  out["ooms"] = ooms;
  out["avoided_ooms"] = r.avoided_ooms;
  py::list states;
  for (const auto& [at, segs] : r.states) states.append(py::make_tuple(at, segments_to_python(segs)));
  out["states"] = states;
  py::list devs;
  for (const DeviceResult& d : r.devices) devs.append(device_to_python(d));
  out["devices"] = devs;
  out["final_state"] = segments_to_python(r.final_state);
  out["allocations"] = r.allocations;
  out["address_mismatches"] = r.address_mismatches;
  out["unknown_frees"] = r.unknown_frees;
  return out;
}

}  // namespace allocscope::replay

namespace allocscope::scopes {

py::tuple walk_scopes(const py::array_t<int64_t, py::array::c_style>& events,
                      const py::array_t<int64_t, py::array::c_style>& threads,
                      const py::array_t<int64_t, py::array::c_style>& symbols,
                      const std::vector<std::tuple<bool, int64_t, bool, bool>>& table, const std::vector<std::string>& names) {
  size_t n = static_cast<size_t>(events.size());
  if (static_cast<size_t>(threads.size()) != n || static_cast<size_t>(symbols.size()) != n)
    throw std::invalid_argument("walk_scopes: columns of different lengths");
  std::vector<Symbol> syms;
  for (const auto& [enter, name, backward, restored] : table) {
    if (name < 0 || static_cast<size_t>(name) >= names.size()) throw std::invalid_argument("walk_scopes: bad name");
    syms.push_back(Symbol{enter, name, backward, restored});
  }
  for (size_t j = 0; j < n; ++j)
    if (symbols.data()[j] >= static_cast<int64_t>(syms.size())) throw std::invalid_argument("walk_scopes: bad symbol");
  std::vector<Change> changes;
  {
    py::gil_scoped_release nogil;
    changes = walk(n, events.data(), threads.data(), symbols.data(), syms, names);
  }
  std::vector<int64_t> at, on, now;
  for (const Change& c : changes) {
    at.push_back(c.event);
    on.push_back(c.thread);
    now.push_back(c.innermost);
  }
  return py::make_tuple(replay::to_numpy(std::move(at)), replay::to_numpy(std::move(on)),
                        replay::to_numpy(std::move(now)));
}

}  // namespace allocscope::scopes

namespace allocscope::pairs {

py::tuple py_lifetimes(const py::array_t<uint8_t, py::array::c_style>& kind,
                       const py::array_t<uint64_t, py::array::c_style>& addr) {
  if (kind.size() != addr.size()) throw std::invalid_argument("lifetimes: columns of different lengths");
  Lifetimes lt;
  {
    py::gil_scoped_release nogil;
    lt = lifetimes(static_cast<size_t>(kind.size()), kind.data(), addr.data());
  }
  return py::make_tuple(replay::to_numpy(std::move(lt.alloc)), replay::to_numpy(std::move(lt.free)),
                        replay::to_numpy(std::move(lt.unmatched)), replay::to_numpy(std::move(lt.doubles)));
}

py::array_t<int64_t> py_label_allocs(const py::array_t<uint8_t, py::array::c_style>& kind,
                                     const py::array_t<uint64_t, py::array::c_style>& addr,
                                     const py::array_t<int64_t, py::array::c_style>& label_idx) {
  if (kind.size() != addr.size()) throw std::invalid_argument("label_allocs: columns of different lengths");
  const int64_t* idx = label_idx.data();
  for (py::ssize_t j = 0; j < label_idx.size(); ++j) {
    if (idx[j] < 0 || idx[j] >= kind.size() || (j > 0 && idx[j] <= idx[j - 1])) {
      throw std::invalid_argument("label_allocs: label indices must be increasing event indices");
    }
  }
  std::vector<int64_t> out;
  {
    py::gil_scoped_release nogil;
    out = label_allocs(static_cast<size_t>(kind.size()), kind.data(), addr.data(),
                       static_cast<size_t>(label_idx.size()), idx);
  }
  return replay::to_numpy(std::move(out));
}

py::tuple py_label_winners(const py::array_t<int64_t, py::array::c_style>& row,
                           const py::array_t<int64_t, py::array::c_style>& priority) {
  if (row.size() != priority.size()) throw std::invalid_argument("label_winners: columns of different lengths");
  const int64_t* r = row.data();
  for (py::ssize_t j = 0; j < row.size(); ++j) {
    if (r[j] < 0) throw std::invalid_argument("label_winners: rows must be >= 0");
  }
  Winners w;
  {
    py::gil_scoped_release nogil;
    w = label_winners(static_cast<size_t>(row.size()), r, priority.data());
  }
  py::array_t<uint8_t> last(static_cast<py::ssize_t>(w.last.size()), w.last.data());
  return py::make_tuple(replay::to_numpy(std::move(w.winners)), last);
}

py::array_t<uint8_t> py_deferred_frees(const py::array_t<uint8_t, py::array::c_style>& kind,
                                       const py::array_t<uint64_t, py::array::c_style>& addr,
                                       const std::vector<uint64_t>& pending_at_end) {
  if (kind.size() != addr.size()) throw std::invalid_argument("deferred_frees: columns of different lengths");
  std::unordered_set<uint64_t> pending(pending_at_end.begin(), pending_at_end.end());
  std::vector<uint8_t> out;
  {
    py::gil_scoped_release nogil;
    out = deferred_frees(static_cast<size_t>(kind.size()), kind.data(), addr.data(), pending);
  }
  return py::array_t<uint8_t>(static_cast<py::ssize_t>(out.size()), out.data());
}

}  // namespace allocscope::pairs

namespace allocscope::decode {

namespace {

// Row `at` of the writable column `name` of length `rows`; the dict keeps
// the array alive.
template <typename T>
T* row_of(const py::dict& columns, const char* name, size_t at, size_t rows) {
  auto a = py::cast<py::array_t<T, py::array::c_style>>(columns[name]);
  if (!a.writeable() || static_cast<size_t>(a.size()) != rows || at > rows)
    throw std::invalid_argument(std::string("decode_events: column ") + name + " is read-only or of another length");
  return a.mutable_data() + at;
}

}  // namespace

// Decodes one EVENTS payload into rows at.. of the loaded capture's columns.
py::tuple py_decode_events(const py::buffer& payload, int version, const py::dict& columns, size_t at) {
  py::buffer_info in = payload.request();
  if (in.ndim != 1 || in.itemsize != 1 || in.strides[0] != 1)
    throw std::invalid_argument("decode_events: the payload must be contiguous bytes");
  size_t rows = static_cast<size_t>(py::len(columns["kind"]));
  Out out;
  out.capacity = rows - std::min(at, rows);
  out.kind = row_of<uint8_t>(columns, "kind", at, rows);
  out.time = row_of<int64_t>(columns, "time", at, rows);
  out.thread = row_of<uint16_t>(columns, "thread", at, rows);
  out.stream = row_of<uint16_t>(columns, "stream", at, rows);
  out.addr = row_of<uint64_t>(columns, "addr", at, rows);
  out.size = row_of<uint64_t>(columns, "size", at, rows);
  out.block = row_of<uint64_t>(columns, "block", at, rows);
  out.stack = row_of<uint32_t>(columns, "stack", at, rows);
  out.arg = row_of<uint64_t>(columns, "arg", at, rows);
  out.op = row_of<uint32_t>(columns, "op", at, rows);
  Decoded d;
  {
    py::gil_scoped_release nogil;
    d = events(static_cast<const uint8_t*>(in.ptr), static_cast<size_t>(in.size), version, out);
  }
  return py::make_tuple(d.count, d.first_seq);
}

}  // namespace allocscope::decode

namespace {

// The replay's inputs, constructed by keyword only: a field given under
// another's name raises instead of landing in the wrong place.
void bind_replay_inputs(py::module_& m) {
  using namespace allocscope::replay;
  py::class_<Config>(m, "Config")
      .def(py::init([](uint64_t max_split_size, uint64_t max_non_split_rounding_size, uint64_t large_segment_size,
                       double garbage_collection_threshold, std::vector<int64_t> roundup_power2_divisions,
                       bool segment_order) {
             return Config{max_split_size, max_non_split_rounding_size, large_segment_size,
                           garbage_collection_threshold, std::move(roundup_power2_divisions), segment_order};
           }),
           py::kw_only(), py::arg("max_split_size"), py::arg("max_non_split_rounding_size"),
           py::arg("large_segment_size"), py::arg("garbage_collection_threshold"),
           py::arg("roundup_power2_divisions"), py::arg("segment_order"))
      .def_readonly("max_split_size", &Config::max_split_size)
      .def_readonly("max_non_split_rounding_size", &Config::max_non_split_rounding_size)
      .def_readonly("large_segment_size", &Config::large_segment_size)
      .def_readonly("garbage_collection_threshold", &Config::garbage_collection_threshold)
      .def_readonly("roundup_power2_divisions", &Config::roundup_power2_divisions)
      .def_readonly("segment_order", &Config::segment_order);
  py::class_<LoadedBlock>(m, "LoadedBlock")
      .def(py::init([](uint64_t addr, uint64_t size, uint64_t requested, bool active, bool allocated) {
             return LoadedBlock{addr, size, requested, active, allocated};
           }),
           py::kw_only(), py::arg("addr"), py::arg("size"), py::arg("requested"), py::arg("active"),
           py::arg("allocated"))
      .def_readonly("addr", &LoadedBlock::addr)
      .def_readonly("size", &LoadedBlock::size)
      .def_readonly("requested", &LoadedBlock::requested)
      .def_readonly("active", &LoadedBlock::active)
      .def_readonly("allocated", &LoadedBlock::allocated);
  py::class_<LoadedSegment>(m, "LoadedSegment")
      .def(py::init([](uint64_t addr, uint64_t size, int64_t stream, bool large, std::vector<LoadedBlock> blocks) {
             return LoadedSegment{addr, size, stream, large, std::move(blocks)};
           }),
           py::kw_only(), py::arg("addr"), py::arg("size"), py::arg("stream"), py::arg("large"), py::arg("blocks"))
      .def_readonly("addr", &LoadedSegment::addr)
      .def_readonly("size", &LoadedSegment::size)
      .def_readonly("stream", &LoadedSegment::stream)
      .def_readonly("large", &LoadedSegment::large)
      .def_readonly("blocks", &LoadedSegment::blocks);
  py::class_<DeviceSetup>(m, "DeviceSetup")
      .def(py::init([](int64_t device, int64_t total, int64_t capacity, int64_t allowed,
                       std::vector<LoadedSegment> start) {
             return DeviceSetup{device, total, capacity, allowed, std::move(start)};
           }),
           py::kw_only(), py::arg("device"), py::arg("total"), py::arg("capacity"), py::arg("allowed"),
           py::arg("start"))
      .def_readonly("device", &DeviceSetup::device)
      .def_readonly("total", &DeviceSetup::total)
      .def_readonly("capacity", &DeviceSetup::capacity)
      .def_readonly("allowed", &DeviceSetup::allowed)
      .def_readonly("start", &DeviceSetup::start);
}

}  // namespace

PYBIND11_MODULE(_analysis, m) {
  using allocscope::replay::run_replay;
  using allocscope::scopes::walk_scopes;
  m.doc() = "allocscope's analysis hot loops in C++: the allocator replay (replay.h), the module-scope walk "
            "(scopes.h), pairing frees with allocations (pairs.h), decoding events chunks (decode.h)";
  py::register_exception<allocscope::decode::FormatError>(m, "FormatError", PyExc_ValueError);
  bind_replay_inputs(m);
  m.def("decode_events", &allocscope::decode::py_decode_events, py::arg("payload"), py::arg("version"),
        py::arg("columns"), py::arg("at"));
  m.def("lifetimes", &allocscope::pairs::py_lifetimes, py::arg("kind"), py::arg("addr"));
  m.def("label_allocs", &allocscope::pairs::py_label_allocs, py::arg("kind"), py::arg("addr"), py::arg("label_idx"));
  m.def("label_winners", &allocscope::pairs::py_label_winners, py::arg("row"), py::arg("priority"));
  m.def("deferred_frees", &allocscope::pairs::py_deferred_frees, py::arg("kind"), py::arg("addr"),
        py::arg("pending_at_end"));
  m.def("walk_scopes", &walk_scopes, py::arg("events"), py::arg("threads"), py::arg("symbols"), py::arg("table"),
        py::arg("names"));
  m.def("replay", &run_replay, py::arg("config"), py::arg("faithful"), py::arg("synthetic_start"),
        py::arg("devices"), py::arg("kind"), py::arg("addr"), py::arg("size"), py::arg("block"), py::arg("arg"),
        py::arg("stream"), py::arg("deferred"), py::arg("stream_device"), py::arg("stream_handle"),
        py::arg("states_at"), py::arg("stop_after"));
}
