// libcudnn.so.9, part 1: cuDNN's backend (graph) API on the virtual GPU.
//
// torch builds every cuDNN convolution (and cuDNN attention) through
// cudnn_frontend, which speaks this API: descriptors are created, given
// attributes, finalized and read back; an execution plan's workspace size is
// read, torch allocates that much from its caching allocator, and the plan is
// executed. Here a descriptor is a bag of attributes: what is set is stored
// (descriptors set as attributes are copied, as cuDNN copies them), what is
// read back is what was set, and finalizing the few descriptors cuDNN fills
// in gives them what cuDNN would:
//   operation graph -> one engine (global count 1);
//   engine heuristics -> one engine config, whatever the mode (instant, B,
//     fallback): torch runs the first config that builds and executes;
//   execution plan -> the workspace of its operation graph, from the tables
//     recorded on cards (cudnn_tables.h).
// Execution computes nothing, as every kernel on the virtual GPU.
#include <cudnn.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "cudnn_tables.h"

#define API extern "C" __attribute__((visibility("default")))

namespace {

struct Desc;
using DescPtr = std::shared_ptr<const Desc>;

struct Attr {
  cudnnBackendAttributeType_t type;
  int64_t count = 0;
  std::vector<uint8_t> bytes;  // count elements of a plain type
  std::vector<DescPtr> descs;  // count descriptors
};

struct Desc {
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<int, Attr> attrs;

  const Attr* find(int name) const {
    auto it = attrs.find(name);
    return it == attrs.end() ? nullptr : &it->second;
  }
  const Desc* child(int name, int64_t i = 0) const {
    const Attr* a = find(name);
    return a && i < static_cast<int64_t>(a->descs.size()) ? a->descs[i].get() : nullptr;
  }
  std::vector<int64_t> ints(int name) const {
    const Attr* a = find(name);
    std::vector<int64_t> out;
    if (a && a->type == CUDNN_TYPE_INT64) {
      out.resize(a->count);
      std::memcpy(out.data(), a->bytes.data(), a->count * sizeof(int64_t));
    }
    return out;
  }
  int enum_value(int name, int otherwise) const {
    const Attr* a = find(name);
    if (!a || a->count < 1 || a->bytes.size() < sizeof(int)) return otherwise;
    int v;
    std::memcpy(&v, a->bytes.data(), sizeof(int));
    return v;
  }
  void set_descs(int name, std::vector<DescPtr> descs) {
    Attr& a = attrs[name];
    a.type = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    a.count = static_cast<int64_t>(descs.size());
    a.bytes.clear();
    a.descs = std::move(descs);
  }
  void set_int64(int name, int64_t v) {
    Attr& a = attrs[name];
    a.type = CUDNN_TYPE_INT64;
    a.count = 1;
    a.bytes.resize(sizeof(v));
    std::memcpy(a.bytes.data(), &v, sizeof(v));
    a.descs.clear();
  }
};

// Bytes per element of each attribute type (enums are ints).
size_t element_size(cudnnBackendAttributeType_t type) {
  switch (type) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
      return sizeof(void*);
    case CUDNN_TYPE_BOOLEAN:
      return sizeof(bool);
    case CUDNN_TYPE_INT64:
    case CUDNN_TYPE_DOUBLE:
      return 8;
    case CUDNN_TYPE_FLOAT:
    case CUDNN_TYPE_INT32:
      return 4;
    case CUDNN_TYPE_CHAR:
      return 1;
    case CUDNN_TYPE_FRACTION:
      return sizeof(cudnnFraction_t);
    default:
      return sizeof(int);
  }
}

// The operation's tensors as the tables key them: {x, w, y} of the
// convolution whatever the direction (dgrad's x is dx, wgrad's w is dw).
struct ConvNames {
  int kind;  // cudnn_tables.h ConvKind
  int x, w, y, conv;
};

bool conv_names(cudnnBackendDescriptorType_t type, ConvNames* out) {
  switch (type) {
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
      *out = {vgpu_cudnn::kFprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC};
      return true;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
      *out = {vgpu_cudnn::kDgrad, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC};
      return true;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      *out = {vgpu_cudnn::kWgrad, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC};
      return true;
    default:
      return false;
  }
}

vgpu_cudnn::TensorShape tensor_shape(const Desc* t) {
  vgpu_cudnn::TensorShape s;
  if (!t) return s;
  s.dims = t->ints(CUDNN_ATTR_TENSOR_DIMENSIONS);
  s.strides = t->ints(CUDNN_ATTR_TENSOR_STRIDES);
  s.dtype = t->enum_value(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT);
  return s;
}

// The workspace an operation graph asks for: the sum over its convolutions
// (torch's graphs hold one, or one with pointwise epilogues, which take
// none); other graphs (cuDNN attention) ask for none (docs/vgpu.md).
uint64_t graph_workspace(const Desc* graph) {
  const Attr* ops = graph ? graph->find(CUDNN_ATTR_OPERATIONGRAPH_OPS) : nullptr;
  if (!ops) return 0;
  uint64_t total = 0;
  for (const DescPtr& op : ops->descs) {
    ConvNames n;
    if (!conv_names(op->type, &n)) continue;
    const Desc* conv = op->child(n.conv);
    vgpu_cudnn::ConvProblem p;
    p.kind = static_cast<vgpu_cudnn::ConvKind>(n.kind);
    p.x = tensor_shape(op->child(n.x));
    p.w = tensor_shape(op->child(n.w));
    p.y = tensor_shape(op->child(n.y));
    if (conv) {
      p.padding = conv->ints(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS);
      p.stride = conv->ints(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES);
      p.dilation = conv->ints(CUDNN_ATTR_CONVOLUTION_DILATIONS);
    }
    total += vgpu_cudnn::conv_workspace(p);
  }
  return total;
}

const Desc* config_graph(const Desc* cfg) {
  const Desc* engine = cfg ? cfg->child(CUDNN_ATTR_ENGINECFG_ENGINE) : nullptr;
  return engine ? engine->child(CUDNN_ATTR_ENGINE_OPERATION_GRAPH) : nullptr;
}

// An engine config's workspace and shared memory (cuDNN >= 9.2): the frontend
// sets aside configs whose shared memory it does not know to fit.
void fill_config(Desc& cfg) {
  cfg.set_int64(CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, static_cast<int64_t>(graph_workspace(config_graph(&cfg))));
  Attr& smem = cfg.attrs[CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED];
  smem.type = CUDNN_TYPE_INT32;
  smem.count = 1;
  smem.bytes.assign(sizeof(int32_t), 0);
  smem.descs.clear();
}

// Fills what cuDNN fills at finalize.
void on_finalize(Desc& d) {
  switch (d.type) {
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      d.set_int64(CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, 1);
      break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
      auto engine = std::make_shared<Desc>();
      engine->type = CUDNN_BACKEND_ENGINE_DESCRIPTOR;
      engine->finalized = true;
      if (const Attr* g = d.find(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)) {
        engine->set_descs(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, g->descs);
      }
      engine->set_int64(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 0);
      auto cfg = std::make_shared<Desc>();
      cfg->type = CUDNN_BACKEND_ENGINECFG_DESCRIPTOR;
      cfg->finalized = true;
      cfg->set_descs(CUDNN_ATTR_ENGINECFG_ENGINE, {engine});
      cfg->set_descs(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, {});
      fill_config(*cfg);
      d.set_descs(CUDNN_ATTR_ENGINEHEUR_RESULTS, {cfg});
      break;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      if (!d.find(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES)) d.set_descs(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, {});
      fill_config(d);
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      d.set_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                  static_cast<int64_t>(graph_workspace(config_graph(d.child(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)))));
      break;
    default:
      break;
  }
  d.finalized = true;
}

}  // namespace

API cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* out) {
  if (!out) return CUDNN_STATUS_BAD_PARAM;
  auto* d = new Desc();
  d->type = type;
  *out = d;
  return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t desc) {
  delete static_cast<Desc*>(desc);
  return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  auto* d = static_cast<Desc*>(desc);
  d->attrs.clear();
  d->finalized = false;
  return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name,
                                           cudnnBackendAttributeType_t type, int64_t count, const void* elements) {
  if (!desc || count < 0 || (count > 0 && !elements)) return CUDNN_STATUS_BAD_PARAM;
  auto* d = static_cast<Desc*>(desc);
  if (d->finalized) return CUDNN_STATUS_NOT_INITIALIZED;
  Attr a;
  a.type = type;
  a.count = count;
  if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    auto* in = static_cast<const cudnnBackendDescriptor_t*>(elements);
    for (int64_t i = 0; i < count; ++i) {
      if (!in[i]) return CUDNN_STATUS_BAD_PARAM;
      a.descs.push_back(std::make_shared<const Desc>(*static_cast<const Desc*>(in[i])));
    }
  } else {
    const auto* p = static_cast<const uint8_t*>(elements);
    a.bytes.assign(p, p + count * element_size(type));
  }
  d->attrs[name] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const desc, cudnnBackendAttributeName_t name,
                                           cudnnBackendAttributeType_t type, int64_t requested, int64_t* count,
                                           void* elements) {
  if (!desc || requested < 0) return CUDNN_STATUS_BAD_PARAM;
  const auto* d = static_cast<const Desc*>(desc);
  const Attr* a = d->find(name);
  // What cuDNN has nothing for reads as no elements (knob infos, notes,
  // intermediates): the frontend then filters nothing and sets nothing.
  int64_t n = a ? a->count : 0;
  if (requested == 0 || !elements) {
    if (count) *count = n;
    return CUDNN_STATUS_SUCCESS;
  }
  n = std::min(n, requested);
  if (count) *count = n;
  if (!a || n == 0) return CUDNN_STATUS_SUCCESS;
  if (a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
    auto* out = static_cast<cudnnBackendDescriptor_t*>(elements);
    for (int64_t i = 0; i < n; ++i) {
      if (!out[i]) return CUDNN_STATUS_BAD_PARAM;
      *static_cast<Desc*>(out[i]) = *a->descs[i];
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR || element_size(type) != element_size(a->type)) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  std::memcpy(elements, a->bytes.data(), n * element_size(a->type));
  return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  on_finalize(*static_cast<Desc*>(desc));
  return CUDNN_STATUS_SUCCESS;
}

API cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                      cudnnBackendDescriptor_t variant_pack) {
  if (!handle || !plan || !variant_pack) return CUDNN_STATUS_BAD_PARAM;
  const auto* p = static_cast<const Desc*>(plan);
  if (!p->finalized || p->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}
