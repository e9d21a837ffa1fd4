// libcudart.so.<major>: streams, events, stream capture and graphs
// (cudart.cpp has the overview), and the user objects graphs keep alive.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cudart_common.h"

namespace {

using namespace cudart;

struct UserObject {
  void* ptr;
  cudaHostFn_t destroy;
  unsigned refs;
};
std::mutex g_user_objects_mu;
// References graphs hold, released when the graph is destroyed.
std::unordered_map<cudaGraph_t, std::vector<std::pair<UserObject*, unsigned>>> g_graph_objects;

void release_user_object(UserObject* o, unsigned count) {
  {
    std::lock_guard<std::mutex> lock(g_user_objects_mu);
    o->refs -= count < o->refs ? count : o->refs;
    if (o->refs > 0) return;
  }
  o->destroy(o->ptr);
  delete o;
}

}  // namespace

// ---- streams

API cudaError_t cudaStreamCreateWithPriority(cudaStream_t* handle, unsigned int flags, int priority) {
  vgpu::Stream* stream = nullptr;
  Result r = vgpu::stream_create(current(), flags, priority, &stream);
  *handle = reinterpret_cast<cudaStream_t>(stream);
  return ret(r);
}
API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* handle, unsigned int flags) {
  return cudaStreamCreateWithPriority(handle, flags, 0);
}
API cudaError_t cudaStreamCreate(cudaStream_t* handle) {
  return cudaStreamCreateWithPriority(handle, 0, 0);
}
API cudaError_t cudaStreamDestroy(cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::stream_destroy(stream));
}
API cudaError_t cudaStreamGetPriority(cudaStream_t handle, int* priority) {
  STREAM_OR_RETURN(stream, handle);
  *priority = vgpu::stream_priority(stream);
  return cudaSuccess;
}
API cudaError_t cudaStreamQuery(cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::stream_query(stream));
}
API cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::stream_synchronize(stream));
}
API cudaError_t cudaStreamWaitEvent(cudaStream_t stream_handle, cudaEvent_t event_handle, unsigned int) {
  STREAM_OR_RETURN(stream, stream_handle);
  EVENT_OR_RETURN(event, event_handle);
  return ret(vgpu::stream_wait_event(stream, event));
}

// ---- events

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* handle, unsigned int flags) {
  vgpu::Event* event = nullptr;
  Result r = vgpu::event_create(flags, &event);
  *handle = reinterpret_cast<cudaEvent_t>(event);
  return ret(r);
}
API cudaError_t cudaEventCreate(cudaEvent_t* handle) {
  return cudaEventCreateWithFlags(handle, 0);
}
API cudaError_t cudaEventDestroy(cudaEvent_t handle) {
  EVENT_OR_RETURN(event, handle);
  return ret(vgpu::event_destroy(event));
}
API cudaError_t cudaEventRecord(cudaEvent_t event_handle, cudaStream_t stream_handle) {
  EVENT_OR_RETURN(event, event_handle);
  STREAM_OR_RETURN(stream, stream_handle);
  return ret(vgpu::event_record(event, stream));
}
API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int) {
  return cudaEventRecord(event, stream);
}
API cudaError_t cudaEventQuery(cudaEvent_t handle) {
  EVENT_OR_RETURN(event, handle);
  return ret(vgpu::event_query(event));
}
API cudaError_t cudaEventSynchronize(cudaEvent_t handle) {
  EVENT_OR_RETURN(event, handle);
  return ret(vgpu::event_synchronize(event));
}
API cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start_handle, cudaEvent_t end_handle) {
  EVENT_OR_RETURN(start, start_handle);
  EVENT_OR_RETURN(end, end_handle);
  return ret(vgpu::event_elapsed_ms(start, end, ms));
}

// ---- capture and graphs

API cudaError_t cudaStreamBeginCapture(cudaStream_t handle, cudaStreamCaptureMode mode) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::capture_begin(stream, static_cast<int>(mode), nullptr));
}
API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t handle, cudaGraph_t graph_handle,
                                              const cudaGraphNode_t* deps, const cudaGraphEdgeData*, size_t count,
                                              cudaStreamCaptureMode mode) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  Result r = vgpu::capture_begin(stream, static_cast<int>(mode), graph);
  if (r == Result::kOk && count > 0)
    r = vgpu::capture_update_dependencies(stream, reinterpret_cast<void* const*>(deps), count, true);
  return ret(r);
}
API cudaError_t cudaStreamEndCapture(cudaStream_t handle, cudaGraph_t* graph) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::Graph* g = nullptr;
  Result r = vgpu::capture_end(stream, &g);
  *graph = reinterpret_cast<cudaGraph_t>(g);
  return ret(r);
}
API cudaError_t cudaStreamIsCapturing(cudaStream_t handle, cudaStreamCaptureStatus* status) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::CaptureStatus s;
  vgpu::capture_info(stream, &s, nullptr, nullptr);
  *status = static_cast<cudaStreamCaptureStatus>(s);
  return cudaSuccess;
}
namespace {
cudaError_t capture_info(cudaStream_t handle, cudaStreamCaptureStatus* status, unsigned long long* id,
                         cudaGraph_t* graph, const cudaGraphNode_t** dependencies,
                         const cudaGraphEdgeData** edge_data, size_t* num_dependencies) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::CaptureStatus s;
  uint64_t capture_id = 0;
  vgpu::Graph* g = nullptr;
  void* const* terminals = nullptr;
  size_t count = 0;
  vgpu::capture_info(stream, &s, &capture_id, &g, &terminals, &count);
  *status = static_cast<cudaStreamCaptureStatus>(s);
  if (id != nullptr) *id = capture_id;
  if (graph != nullptr) *graph = reinterpret_cast<cudaGraph_t>(g);
  if (dependencies != nullptr) *dependencies = reinterpret_cast<const cudaGraphNode_t*>(terminals);
  if (edge_data != nullptr) *edge_data = nullptr;  // every edge a plain one
  if (num_dependencies != nullptr) *num_dependencies = count;
  return cudaSuccess;
}
cudaError_t add_node(cudaGraphNode_t* node, cudaGraph_t graph_handle, const cudaGraphNode_t* deps, size_t count) {
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr || (deps == nullptr && count > 0)) return ret(cudaErrorInvalidValue);
  void* out = nullptr;
  Result r = vgpu::graph_add_node(graph, reinterpret_cast<void* const*>(deps), count, &out);
  *node = reinterpret_cast<cudaGraphNode_t>(out);
  return ret(r);
}
cudaError_t update_dependencies(cudaStream_t handle, cudaGraphNode_t* nodes, size_t count, unsigned int flags) {
  STREAM_OR_RETURN(stream, handle);
  if (flags != cudaStreamAddCaptureDependencies && flags != cudaStreamSetCaptureDependencies)
    return ret(cudaErrorInvalidValue);
  return ret(vgpu::capture_update_dependencies(stream, reinterpret_cast<void* const*>(nodes), count,
                                               flags == cudaStreamSetCaptureDependencies));
}
cudaError_t node_dependencies(cudaGraphNode_t node, cudaGraphNode_t* deps, size_t* count) {
  if (count == nullptr) return ret(cudaErrorInvalidValue);
  return ret(vgpu::node_dependencies(node, reinterpret_cast<void**>(deps), count));
}
}  // namespace

// CUDA 13 added edge data to these; CUDA 12 has both forms (the edge-data one
// as _v2/_v3), and its header maps cudaStreamGetCaptureInfo to _v2.
#if CUDART_VERSION >= 13000
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t handle, cudaStreamCaptureStatus* status, unsigned long long* id,
                                         cudaGraph_t* graph, const cudaGraphNode_t** dependencies,
                                         const cudaGraphEdgeData** edge_data, size_t* num_dependencies) {
  return capture_info(handle, status, id, graph, dependencies, edge_data, num_dependencies);
}
API cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t handle, cudaGraphNode_t* nodes,
                                                    const cudaGraphEdgeData*, size_t count, unsigned int flags) {
  return update_dependencies(handle, nodes, count, flags);
}
API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t* deps, cudaGraphEdgeData* edges,
                                             size_t* count) {
  if (edges != nullptr && deps != nullptr && count != nullptr) std::memset(edges, 0, *count * sizeof(*edges));
  return node_dependencies(node, deps, count);
}
API cudaError_t cudaGraphAddNode(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t* deps,
                                 const cudaGraphEdgeData*, size_t count, cudaGraphNodeParams*) {
  return add_node(node, graph, deps, count);
}
#else
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t handle, cudaStreamCaptureStatus* status, unsigned long long* id,
                                         cudaGraph_t* graph, const cudaGraphNode_t** dependencies,
                                         size_t* num_dependencies) {
  return capture_info(handle, status, id, graph, dependencies, nullptr, num_dependencies);
}
API cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t handle, cudaStreamCaptureStatus* status,
                                            unsigned long long* id, cudaGraph_t* graph,
                                            const cudaGraphNode_t** dependencies, const cudaGraphEdgeData** edge_data,
                                            size_t* num_dependencies) {
  return capture_info(handle, status, id, graph, dependencies, edge_data, num_dependencies);
}
API cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t handle, cudaGraphNode_t* nodes, size_t count,
                                                    unsigned int flags) {
  return update_dependencies(handle, nodes, count, flags);
}
API cudaError_t cudaStreamUpdateCaptureDependencies_v2(cudaStream_t handle, cudaGraphNode_t* nodes,
                                                       const cudaGraphEdgeData*, size_t count, unsigned int flags) {
  return update_dependencies(handle, nodes, count, flags);
}
API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t* deps, size_t* count) {
  return node_dependencies(node, deps, count);
}
API cudaError_t cudaGraphNodeGetDependencies_v2(cudaGraphNode_t node, cudaGraphNode_t* deps,
                                                cudaGraphEdgeData* edges, size_t* count) {
  if (edges != nullptr && deps != nullptr && count != nullptr) std::memset(edges, 0, *count * sizeof(*edges));
  return node_dependencies(node, deps, count);
}
API cudaError_t cudaGraphAddNode(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t* deps, size_t count,
                                 cudaGraphNodeParams*) {
  return add_node(node, graph, deps, count);
}
API cudaError_t cudaGraphAddNode_v2(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t* deps,
                                    const cudaGraphEdgeData*, size_t count, cudaGraphNodeParams*) {
  return add_node(node, graph, deps, count);
}
#endif
API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  *mode = static_cast<cudaStreamCaptureMode>(vgpu::exchange_capture_mode(static_cast<int>(*mode)));
  return cudaSuccess;
}
API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph_handle, unsigned long long) {
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  vgpu::GraphExec* e = nullptr;
  Result r = vgpu::graph_instantiate(graph, &e);
  *exec = reinterpret_cast<cudaGraphExec_t>(e);
  return ret(r);
}
API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::graph_launch(reinterpret_cast<vgpu::GraphExec*>(exec), stream));
}
API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  return ret(vgpu::graph_exec_destroy(reinterpret_cast<vgpu::GraphExec*>(exec)));
}
API cudaError_t cudaGraphDestroy(cudaGraph_t graph_handle) {
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  Result r = vgpu::graph_destroy(graph);
  if (r != Result::kOk) return ret(r);
  std::vector<std::pair<UserObject*, unsigned>> held;
  {
    std::lock_guard<std::mutex> lock(g_user_objects_mu);
    auto it = g_graph_objects.find(graph_handle);
    if (it != g_graph_objects.end()) {
      held.swap(it->second);
      g_graph_objects.erase(it);
    }
  }
  for (auto& [object, count] : held) release_user_object(object, count);
  return cudaSuccess;
}
API cudaError_t cudaGraphGetNodes(cudaGraph_t graph_handle, cudaGraphNode_t* nodes, size_t* count) {
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  return ret(vgpu::graph_nodes(graph, reinterpret_cast<void**>(nodes), count));
}
API cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle* handle, cudaGraph_t, unsigned int,
                                                 unsigned int) {
  static std::atomic<unsigned long long> next{1};
  *handle = next++;
  return cudaSuccess;
}
API cudaError_t cudaGraphDebugDotPrint(cudaGraph_t, const char* path, unsigned int) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return ret(cudaErrorInvalidValue);
  std::fputs("digraph allocscope_virtual_gpu {}\n", f);
  std::fclose(f);
  return cudaSuccess;
}
API cudaError_t cudaDeviceGetGraphMemAttribute(int, cudaGraphMemAttributeType, void* value) {
  *static_cast<cuuint64_t*>(value) = 0;
  return cudaSuccess;
}
API cudaError_t cudaDeviceSetGraphMemAttribute(int, cudaGraphMemAttributeType, void*) {
  return cudaSuccess;
}
// User objects keep what a graph needs alive: destroyed when released for good.
API cudaError_t cudaUserObjectCreate(cudaUserObject_t* object, void* ptr, cudaHostFn_t destroy, unsigned int refs,
                                     unsigned int) {
  *object = reinterpret_cast<cudaUserObject_t>(new UserObject{ptr, destroy, refs});
  return cudaSuccess;
}
API cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count) {
  release_user_object(reinterpret_cast<UserObject*>(object), count);
  return cudaSuccess;
}
API cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object, unsigned int count,
                                          unsigned int flags) {
  auto* o = reinterpret_cast<UserObject*>(object);
  std::lock_guard<std::mutex> lock(g_user_objects_mu);
  if ((flags & cudaGraphUserObjectMove) == 0) o->refs += count;  // with Move, the caller's references move
  g_graph_objects[graph].emplace_back(o, count);
  return cudaSuccess;
}
