// libcudnn.so.9, part 3: recurrent networks, dropout and CTC loss.
//
// torch lays its RNN parameters out as views into cuDNN's weight space, at the
// addresses cudnnGetRNNWeightParams gives (aten/src/ATen/native/cudnn/RNN.cpp
// asserts that each gate's matrix follows the previous one). The stand-in
// lays out, per pseudo-layer (layer x direction): the input matrices of every
// gate, the recurrent matrices of every gate, then one bias vector per
// matrix, then an LSTM's projection; so torch's checks hold and the weight
// space is what the parameters take (biases are laid out whatever the bias
// mode: at most one hidden-sized vector per matrix too many).
//
// Temporary space: the work space and the reserve space (kept for backward)
// come from the tables (ops "rnn_ws", "rnn_reserve"); where a table has no
// row, the reserve is an estimate (each step's gates and two states, per
// layer and direction: about what torch's native kernels keep for
// backward; not measured) and the work space is none (docs/vgpu.md).
#include <sstream>
#include <type_traits>

#include "cudnn_legacy.h"

namespace {

int gates(int cell_mode) {
  switch (cell_mode) {
    case CUDNN_LSTM:
      return 4;
    case CUDNN_GRU:
      return 3;
    default:
      return 1;
  }
}

int directions(const cudnnRNNStruct& r) {
  return r.dir_mode == CUDNN_BIDIRECTIONAL ? 2 : 1;
}

int out_size(const cudnnRNNStruct& r) {
  return r.proj_size > 0 && r.proj_size < r.hidden_size ? r.proj_size : r.hidden_size;
}

bool projects(const cudnnRNNStruct& r) {
  return r.cell_mode == CUDNN_LSTM && out_size(r) != r.hidden_size;
}

// Elements of one pseudo-layer's matrices and biases, and where each starts.
struct PseudoLayer {
  int64_t in = 0;           // columns of the input matrices
  int64_t input_mats = 0;   // elements of all input matrices
  int64_t rec_mats = 0;     // elements of all recurrent matrices
  int64_t biases = 0;       // elements of all bias vectors
  int64_t projection = 0;   // elements of the projection matrix
  int64_t total() const { return input_mats + rec_mats + biases + projection; }
};

PseudoLayer pseudo_layer(const cudnnRNNStruct& r, int pseudo) {
  PseudoLayer p;
  const int layer = pseudo / directions(r);
  const int64_t g = gates(r.cell_mode), h = r.hidden_size;
  p.in = layer == 0 ? r.input_size : static_cast<int64_t>(out_size(r)) * directions(r);
  p.input_mats = g * h * p.in;
  p.rec_mats = g * h * out_size(r);
  p.biases = 2 * g * h;
  p.projection = projects(r) ? static_cast<int64_t>(out_size(r)) * h : 0;
  return p;
}

int64_t weight_elements(const cudnnRNNStruct& r) {
  int64_t total = 0;
  for (int i = 0; i < r.num_layers * directions(r); ++i) total += pseudo_layer(r, i).total();
  return total;
}

void describe(cudnnTensorDescriptor_t desc, int dtype, int64_t rows, int64_t cols) {
  if (!desc) return;
  desc->dtype = dtype;
  desc->dims = {1, static_cast<int>(rows), static_cast<int>(cols)};
  desc->strides = {static_cast<int>(rows * cols), static_cast<int>(cols), 1};
}

}  // namespace

VGPU_CUDNN_DESCRIPTOR(RNNDescriptor, cudnnRNNDescriptor_t)
VGPU_CUDNN_DESCRIPTOR(RNNDataDescriptor, cudnnRNNDataDescriptor_t)
VGPU_CUDNN_DESCRIPTOR(DropoutDescriptor, cudnnDropoutDescriptor_t)
VGPU_CUDNN_DESCRIPTOR(CTCLossDescriptor, cudnnCTCLossDescriptor_t)

CUDNN_API cudnnStatus_t cudnnSetRNNDescriptor_v8(cudnnRNNDescriptor_t desc, cudnnRNNAlgo_t, cudnnRNNMode_t cell_mode,
                                                 cudnnRNNBiasMode_t bias_mode, cudnnDirectionMode_t dir_mode,
                                                 cudnnRNNInputMode_t input_mode, cudnnDataType_t dtype,
                                                 cudnnDataType_t, cudnnMathType_t, int32_t input_size,
                                                 int32_t hidden_size, int32_t proj_size, int32_t num_layers,
                                                 cudnnDropoutDescriptor_t, uint32_t) {
  if (!desc || hidden_size < 1 || num_layers < 1 || input_size < 0) return CUDNN_STATUS_BAD_PARAM;
  *desc = {cell_mode, bias_mode, dir_mode, input_mode, dtype, input_size, hidden_size, proj_size, num_layers};
  return CUDNN_STATUS_SUCCESS;
}

CUDNN_API cudnnStatus_t cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t desc, cudnnDataType_t dtype,
                                                  cudnnRNNDataLayout_t layout, int max_seq_length, int batch_size,
                                                  int vector_size, const int[], void*) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  *desc = {dtype, layout, max_seq_length, batch_size, vector_size};
  return CUDNN_STATUS_SUCCESS;
}

CUDNN_API cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t, cudnnRNNDescriptor_t desc, size_t* bytes) {
  if (!desc || !bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = static_cast<size_t>(weight_elements(*desc)) * vgpu_cudnn::dtype_bytes(desc->dtype);
  return CUDNN_STATUS_SUCCESS;
}

CUDNN_API cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t, cudnnRNNDescriptor_t desc, int32_t pseudo,
                                                size_t, const void* space, int32_t lin_id,
                                                cudnnTensorDescriptor_t m_desc, void** m_addr,
                                                cudnnTensorDescriptor_t b_desc, void** b_addr) {
  if (!desc || pseudo < 0 || pseudo >= desc->num_layers * directions(*desc)) return CUDNN_STATUS_BAD_PARAM;
  const int g = gates(desc->cell_mode);
  const bool projection_id = projects(*desc) && lin_id == 2 * g;
  if (lin_id < 0 || (lin_id >= 2 * g && !projection_id)) return CUDNN_STATUS_BAD_PARAM;
  int64_t base = 0;
  for (int i = 0; i < pseudo; ++i) base += pseudo_layer(*desc, i).total();
  const PseudoLayer p = pseudo_layer(*desc, pseudo);
  const int64_t h = desc->hidden_size;
  const size_t elem = vgpu_cudnn::dtype_bytes(desc->dtype);
  const auto* start = static_cast<const char*>(space);
  if (projection_id) {
    if (m_addr) *m_addr = const_cast<char*>(start + (base + p.input_mats + p.rec_mats + p.biases) * elem);
    describe(m_desc, desc->dtype, out_size(*desc), h);
    if (b_addr) *b_addr = nullptr;
    return CUDNN_STATUS_SUCCESS;
  }
  const bool input = lin_id < g;
  const int64_t cols = input ? p.in : out_size(*desc);
  const int64_t matrix = input ? base + lin_id * h * p.in : base + p.input_mats + (lin_id - g) * h * cols;
  if (m_addr) *m_addr = const_cast<char*>(start + matrix * elem);
  describe(m_desc, desc->dtype, h, cols);
  if (b_addr) *b_addr = const_cast<char*>(start + (base + p.input_mats + p.rec_mats + lin_id * h) * elem);
  describe(b_desc, desc->dtype, h, 1);
  return CUDNN_STATUS_SUCCESS;
}

CUDNN_API cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t, cudnnRNNDescriptor_t desc, cudnnForwardMode_t mode,
                                                  cudnnRNNDataDescriptor_t x, size_t* work, size_t* reserve) {
  if (!desc || !x) return CUDNN_STATUS_BAD_PARAM;
  std::ostringstream key;
  key << "dt=" << desc->dtype << " cell=" << desc->cell_mode << " layers=" << desc->num_layers
      << " dirs=" << directions(*desc) << " in=" << desc->input_size << " hidden=" << desc->hidden_size
      << " proj=" << out_size(*desc) << " seq=" << x->max_seq_length;
  const std::string k = key.str();
  if (work) *work = vgpu_cudnn::lookup("rnn_ws", x->batch_size, k);
  if (reserve) {
    uint64_t bytes = 0;
    if (mode == CUDNN_FWD_MODE_TRAINING) {
      bytes = vgpu_cudnn::lookup("rnn_reserve", x->batch_size, k);
      if (bytes == 0) {
        const int64_t per_step = static_cast<int64_t>(gates(desc->cell_mode) + 2) * desc->hidden_size;
        bytes = static_cast<uint64_t>(per_step) * x->max_seq_length * x->batch_size * desc->num_layers *
                directions(*desc) * vgpu_cudnn::dtype_bytes(desc->dtype);
      }
    }
    *reserve = bytes;
  }
  return CUDNN_STATUS_SUCCESS;
}

CUDNN_API cudnnStatus_t cudnnRNNForward(cudnnHandle_t, cudnnRNNDescriptor_t, cudnnForwardMode_t, const int32_t[],
                                        cudnnRNNDataDescriptor_t, const void*, cudnnRNNDataDescriptor_t, void*,
                                        cudnnTensorDescriptor_t, const void*, void*, cudnnTensorDescriptor_t,
                                        const void*, void*, size_t, const void*, size_t, void*, size_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnRNNBackwardData_v8(cudnnHandle_t, cudnnRNNDescriptor_t, const int32_t[],
                                                cudnnRNNDataDescriptor_t, const void*, const void*,
                                                cudnnRNNDataDescriptor_t, void*, cudnnTensorDescriptor_t, const void*,
                                                const void*, void*, cudnnTensorDescriptor_t, const void*, const void*,
                                                void*, size_t, const void*, size_t, void*, size_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnRNNBackwardWeights_v8(cudnnHandle_t, cudnnRNNDescriptor_t, cudnnWgradMode_t,
                                                   const int32_t[], cudnnRNNDataDescriptor_t, const void*,
                                                   cudnnTensorDescriptor_t, const void*, cudnnRNNDataDescriptor_t,
                                                   const void*, size_t, void*, size_t, void*, size_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}

// ---- dropout: the states' size from the tables (op "dropout_states")

CUDNN_API cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t, size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = vgpu_cudnn::lookup("dropout_states", 0, "");
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t desc, cudnnHandle_t, float, void*, size_t,
                                                  unsigned long long) {
  return desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}
CUDNN_API cudnnStatus_t cudnnRestoreDropoutDescriptor(cudnnDropoutDescriptor_t desc, cudnnHandle_t, float, void*,
                                                      size_t, unsigned long long) {
  return desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

// ---- CTC loss: no workspace (no table records it yet)

CUDNN_API cudnnStatus_t cudnnSetCTCLossDescriptorEx(cudnnCTCLossDescriptor_t desc, cudnnDataType_t,
                                                    cudnnLossNormalizationMode_t, cudnnNanPropagation_t) {
  return desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}
CUDNN_API cudnnStatus_t cudnnSetCTCLossDescriptor_v9(cudnnCTCLossDescriptor_t desc, cudnnDataType_t,
                                                     cudnnLossNormalizationMode_t, cudnnCTCGradMode_t, int) {
  return desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}
CUDNN_API cudnnStatus_t cudnnGetCTCLossWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t,
                                                     const cudnnTensorDescriptor_t, const int*, const int*, const int*,
                                                     cudnnCTCLossAlgo_t, cudnnCTCLossDescriptor_t, size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnGetCTCLossWorkspaceSize_v8(cudnnHandle_t, cudnnCTCLossAlgo_t, cudnnCTCLossDescriptor_t,
                                                        const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                        size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnCTCLoss(cudnnHandle_t, const cudnnTensorDescriptor_t, const void*, const int[],
                                     const int[], const int[], void*, const cudnnTensorDescriptor_t, void*,
                                     cudnnCTCLossAlgo_t, cudnnCTCLossDescriptor_t, void*, size_t) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnCTCLoss_v8(cudnnHandle_t, cudnnCTCLossAlgo_t, cudnnCTCLossDescriptor_t,
                                        const cudnnTensorDescriptor_t, const void*, const int[], const int[],
                                        const int[], void*, const cudnnTensorDescriptor_t, void*, size_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}
