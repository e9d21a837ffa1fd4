// Streams, events, stream capture and graphs: the completion model of core.h.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "core.h"

namespace vgpu {

struct Stream {
  int device;
  unsigned flags;
  int priority;
  bool is_default;
  uint64_t recorded = 0;   // sequence number of the last event recorded
  uint64_t completed = 0;  // events up to this one are complete
  bool busy = false;       // a busy kernel runs: later events wait for a sync
  uint64_t busy_after = 0;
  uint64_t capture_id = 0;  // 0: not capturing
  Graph* capture_graph = nullptr;
  bool capture_origin = false;
  std::vector<void*> terminals;  // the capture's nodes the stream's next work depends on
};

struct Event {
  unsigned flags;
  Stream* stream = nullptr;
  uint64_t seq = 0;  // 0: not recorded, or recorded in a capture
  int polls_left = 0;
  int64_t host_ns = 0;
  uint64_t capture_id = 0;
  Graph* capture_graph = nullptr;
  std::vector<void*> terminals;  // the recording stream's, when recorded in a capture
};

struct Node {
  std::vector<void*> deps;
};

struct Graph {
  std::vector<std::unique_ptr<Node>> nodes;

  void* add(std::vector<void*> deps) {
    nodes.emplace_back(new Node{std::move(deps)});
    return nodes.back().get();
  }
};

struct GraphExec {
  size_t nodes;
};

namespace {

struct Streams {
  std::mutex mu;
  std::vector<Stream*> defaults;  // per device, made when first used
  std::unordered_set<Stream*> streams;
  std::unordered_set<Event*> events;
  std::unordered_set<Graph*> graphs;
  uint64_t next_capture_id = 0;
  std::unordered_set<const void*> busy_kernels;

  Streams() : defaults(static_cast<size_t>(device_count()), nullptr) {}

  Stream* default_stream(int device) {
    Stream*& d = defaults[device];
    if (d == nullptr) {
      d = new Stream{device, 0, 0, true};
      streams.insert(d);
    }
    return d;
  }

  // Events up to `seq` on `s` are complete (a stream runs in order).
  static void complete(Stream* s, uint64_t seq) { s->completed = std::max(s->completed, seq); }
  static void synchronize(Stream* s) {
    s->completed = s->recorded;
    s->busy = false;
  }
  static bool done(const Event* e) { return e->seq == 0 || e->seq <= e->stream->completed; }
  static bool blocked(const Event* e) { return e->stream->busy && e->seq > e->stream->busy_after; }
};

Streams& state() {
  static Streams* s = new Streams();  // never destroyed: CUDA calls may come during exit
  return *s;
}

using Lock = std::lock_guard<std::mutex>;

thread_local int t_capture_mode = 0;  // cudaStreamCaptureModeGlobal

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---- streams and events

Stream* resolve_stream(const void* handle) {
  uintptr_t h = reinterpret_cast<uintptr_t>(handle);
  Streams& s = state();
  Lock lock(s.mu);
  if (h <= 2) return device(current_device()) != nullptr ? s.default_stream(current_device()) : nullptr;
  Stream* stream = static_cast<Stream*>(const_cast<void*>(handle));
  return s.streams.count(stream) != 0 ? stream : nullptr;
}

Result stream_create(int device, unsigned flags, int priority, Stream** out) {
  Result r = create_context(device);
  if (r != Result::kOk) return r;
  Streams& s = state();
  Lock lock(s.mu);
  Stream* stream = new Stream{device, flags, priority, false};
  s.streams.insert(stream);
  *out = stream;
  return Result::kOk;
}

Result stream_destroy(Stream* stream) {
  Streams& s = state();
  Lock lock(s.mu);
  if (stream->is_default || s.streams.erase(stream) == 0) return Result::kInvalidHandle;
  // Events recorded on it keep their answer: complete.
  for (Event* e : s.events) {
    if (e->stream == stream) {
      e->stream = nullptr;
      e->seq = 0;
    }
  }
  delete stream;
  return Result::kOk;
}

int stream_device(const Stream* stream) {
  return stream->device;
}

int stream_priority(const Stream* stream) {
  return stream->priority;
}

unsigned stream_flags(const Stream* stream) {
  return stream->flags;
}

Result stream_query(Stream* stream) {
  Streams& s = state();
  Lock lock(s.mu);
  if (stream->busy) return Result::kNotReady;
  Streams::complete(stream, stream->recorded);
  return Result::kOk;
}

Result stream_synchronize(Stream* stream) {
  Streams& s = state();
  Lock lock(s.mu);
  Streams::synchronize(stream);
  return Result::kOk;
}

Result device_synchronize(int device) {
  Streams& s = state();
  Lock lock(s.mu);
  for (Stream* stream : s.streams) {
    if (stream->device == device) Streams::synchronize(stream);
  }
  return Result::kOk;
}

Result stream_wait_event(Stream* stream, Event* event) {
  Streams& s = state();
  Lock lock(s.mu);
  // Waiting on an event of a capture joins the capture (a fork in its graph).
  if (event->capture_id != 0 && stream->capture_id == 0 && event->capture_graph != nullptr) {
    for (Stream* other : s.streams) {
      if (other->capture_id == event->capture_id && other->capture_origin) {
        stream->capture_id = event->capture_id;
        stream->capture_graph = event->capture_graph;
        stream->capture_origin = false;
        stream->terminals.clear();
        break;
      }
    }
  }
  // Within a capture the stream's next work also depends on what the event saw.
  if (stream->capture_id != 0 && event->capture_id == stream->capture_id) {
    for (void* n : event->terminals)
      if (std::find(stream->terminals.begin(), stream->terminals.end(), n) == stream->terminals.end())
        stream->terminals.push_back(n);
  }
  return Result::kOk;
}

Event* resolve_event(const void* handle) {
  Streams& s = state();
  Lock lock(s.mu);
  Event* e = static_cast<Event*>(const_cast<void*>(handle));
  return s.events.count(e) != 0 ? e : nullptr;
}

Result event_create(unsigned flags, Event** out) {
  Streams& s = state();
  Lock lock(s.mu);
  Event* e = new Event{flags};
  s.events.insert(e);
  *out = e;
  return Result::kOk;
}

Result event_destroy(Event* event) {
  Streams& s = state();
  Lock lock(s.mu);
  if (s.events.erase(event) == 0) return Result::kInvalidHandle;
  delete event;
  return Result::kOk;
}

Result event_record(Event* event, Stream* stream) {
  Streams& s = state();
  Lock lock(s.mu);
  event->stream = stream;
  event->host_ns = now_ns();
  if (stream->capture_id != 0) {  // part of the graph; it never pends
    event->seq = 0;
    event->capture_id = stream->capture_id;
    event->capture_graph = stream->capture_graph;
    event->terminals = stream->terminals;
    return Result::kOk;
  }
  event->capture_id = 0;
  event->capture_graph = nullptr;
  event->terminals.clear();
  event->seq = ++stream->recorded;
  event->polls_left = event_polls();
  if (event->polls_left == 0 && !Streams::blocked(event)) Streams::complete(stream, event->seq);
  return Result::kOk;
}

Result event_query(Event* event) {
  Streams& s = state();
  Lock lock(s.mu);
  if (event->stream == nullptr || Streams::done(event)) return Result::kOk;
  if (Streams::blocked(event)) return Result::kNotReady;
  if (event->polls_left > 0) {
    --event->polls_left;
    return Result::kNotReady;
  }
  Streams::complete(event->stream, event->seq);
  return Result::kOk;
}

Result event_synchronize(Event* event) {
  Streams& s = state();
  Lock lock(s.mu);
  if (event->stream == nullptr || Streams::done(event)) return Result::kOk;
  if (Streams::blocked(event)) event->stream->busy = false;  // the busy kernel before it has finished
  Streams::complete(event->stream, event->seq);
  return Result::kOk;
}

Result event_elapsed_ms(Event* start, Event* end, float* ms) {
  Streams& s = state();
  Lock lock(s.mu);
  if (((start->flags | end->flags) & kEventDisableTiming) != 0) return Result::kInvalidHandle;
  if (start->stream == nullptr || end->stream == nullptr) return Result::kInvalidHandle;
  if (!Streams::done(start) || !Streams::done(end)) return Result::kNotReady;
  *ms = static_cast<float>(static_cast<double>(end->host_ns - start->host_ns) / 1e6);
  return Result::kOk;
}

bool submit(Stream* stream, Work work) {
  Streams& s = state();
  Lock lock(s.mu);
  if (stream->capture_id != 0) {
    void* node = stream->capture_graph->add(std::move(stream->terminals));
    stream->terminals.assign(1, node);
    return false;
  }
  if (work == Work::kBusyKernel && !stream->busy) {
    stream->busy = true;
    stream->busy_after = stream->recorded;
  }
  return true;
}

// ---- capture and graphs

Result capture_begin(Stream* stream, int mode, Graph* into) {
  Streams& s = state();
  Lock lock(s.mu);
  if (stream->is_default) return Result::kCaptureUnsupported;
  if (stream->capture_id != 0) return Result::kIllegalState;
  Graph* g = into;
  if (g == nullptr) {
    g = new Graph();
    s.graphs.insert(g);
  }
  stream->capture_id = ++s.next_capture_id;
  stream->capture_graph = g;
  stream->capture_origin = true;
  stream->terminals.clear();
  (void)mode;
  return Result::kOk;
}

Result capture_end(Stream* stream, Graph** out) {
  Streams& s = state();
  Lock lock(s.mu);
  if (stream->capture_id == 0 || !stream->capture_origin) return Result::kIllegalState;
  uint64_t id = stream->capture_id;
  *out = stream->capture_graph;
  for (Stream* other : s.streams) {
    if (other->capture_id == id) {
      other->capture_id = 0;
      other->capture_graph = nullptr;
      other->capture_origin = false;
      other->terminals.clear();
    }
  }
  return Result::kOk;
}

void capture_info(const Stream* stream, CaptureStatus* status, uint64_t* id, Graph** graph, void* const** terminals,
                  size_t* count) {
  Streams& s = state();
  Lock lock(s.mu);
  if (status != nullptr) *status = stream->capture_id != 0 ? CaptureStatus::kActive : CaptureStatus::kNone;
  if (id != nullptr) *id = stream->capture_id;
  if (graph != nullptr) *graph = stream->capture_graph;
  if (terminals != nullptr) *terminals = stream->terminals.empty() ? nullptr : stream->terminals.data();
  if (count != nullptr) *count = stream->terminals.size();
}

Result capture_update_dependencies(Stream* stream, void* const* nodes, size_t count, bool set) {
  Streams& s = state();
  Lock lock(s.mu);
  if (stream->capture_id == 0) return Result::kIllegalState;
  if (set) stream->terminals.clear();
  for (size_t i = 0; i < count; ++i)
    if (std::find(stream->terminals.begin(), stream->terminals.end(), nodes[i]) == stream->terminals.end())
      stream->terminals.push_back(nodes[i]);
  return Result::kOk;
}

int exchange_capture_mode(int mode) {
  int previous = t_capture_mode;
  t_capture_mode = mode;
  return previous;
}

Graph* resolve_graph(const void* handle) {
  Streams& s = state();
  Lock lock(s.mu);
  Graph* g = static_cast<Graph*>(const_cast<void*>(handle));
  return s.graphs.count(g) != 0 ? g : nullptr;
}

Result graph_create(Graph** out) {
  Streams& s = state();
  Lock lock(s.mu);
  *out = new Graph();
  s.graphs.insert(*out);
  return Result::kOk;
}

Result graph_destroy(Graph* graph) {
  Streams& s = state();
  Lock lock(s.mu);
  if (s.graphs.count(graph) == 0) return Result::kInvalidHandle;
  for (Stream* stream : s.streams) {
    if (stream->capture_graph == graph) return Result::kIllegalState;
  }
  s.graphs.erase(graph);
  delete graph;
  return Result::kOk;
}

Result graph_nodes(Graph* graph, void** nodes, size_t* count) {
  Streams& s = state();
  Lock lock(s.mu);
  if (nodes == nullptr) {
    *count = graph->nodes.size();
    return Result::kOk;
  }
  size_t n = std::min(*count, graph->nodes.size());
  for (size_t i = 0; i < n; ++i) nodes[i] = graph->nodes[i].get();
  *count = n;
  return Result::kOk;
}

Result graph_add_node(Graph* graph, void* const* deps, size_t count, void** out) {
  Streams& s = state();
  Lock lock(s.mu);
  *out = graph->add(std::vector<void*>(deps, deps + count));
  return Result::kOk;
}

Result node_dependencies(const void* node, void** deps, size_t* count) {
  Streams& s = state();
  Lock lock(s.mu);
  const Node* n = static_cast<const Node*>(node);
  if (n == nullptr) return Result::kInvalidValue;
  if (deps == nullptr) {
    *count = n->deps.size();
    return Result::kOk;
  }
  // As CUDA: up to `count` filled, the rest of them set to null, the
  // number filled returned.
  size_t k = std::min(*count, n->deps.size());
  std::copy(n->deps.begin(), n->deps.begin() + static_cast<std::ptrdiff_t>(k), deps);
  std::fill(deps + k, deps + *count, nullptr);
  *count = k;
  return Result::kOk;
}

Result graph_instantiate(Graph* graph, GraphExec** out) {
  Streams& s = state();
  Lock lock(s.mu);
  *out = new GraphExec{graph->nodes.size()};
  return Result::kOk;
}

Result graph_exec_destroy(GraphExec* exec) {
  delete exec;
  return Result::kOk;
}

Result graph_launch(GraphExec* exec, Stream* stream) {
  (void)exec;
  submit(stream, Work::kGraph);
  return Result::kOk;
}

// ---- kernels

void register_kernel(const void* host_function, const char* device_name) {
  // torch.cuda._sleep's kernel (at::cuda::spin_kernel): tests use it to keep a
  // stream busy, so that its events stay pending until a synchronization.
  if (device_name == nullptr || std::strstr(device_name, "spin_kernel") == nullptr) return;
  Streams& s = state();
  Lock lock(s.mu);
  s.busy_kernels.insert(host_function);
}

bool is_busy_kernel(const void* host_function) {
  Streams& s = state();
  Lock lock(s.mu);
  return !s.busy_kernels.empty() && s.busy_kernels.count(host_function) != 0;
}

}  // namespace vgpu
