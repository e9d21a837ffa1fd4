// The legacy (descriptor-per-call) side of the cuDNN stand-in: what its
// opaque descriptor types hold, shared by cudnn_legacy.cpp and cudnn_rnn.cpp.
#pragma once

#include <cudnn.h>

#include <vector>

#include "cudnn_tables.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  int dtype = CUDNN_DATA_FLOAT;
  std::vector<int> dims, strides;
};
struct cudnnFilterStruct {
  int dtype = CUDNN_DATA_FLOAT;
  int format = CUDNN_TENSOR_NCHW;
  std::vector<int> dims;
};
struct cudnnConvolutionStruct {
  std::vector<int> padding, stride, dilation;
  int groups = 1;
};
struct cudnnActivationStruct {};
struct cudnnPoolingStruct {};
struct cudnnDropoutStruct {};
struct cudnnSpatialTransformerStruct {};
struct cudnnCTCLossStruct {};
struct cudnnRNNStruct {
  int cell_mode = 0, bias_mode = 0, dir_mode = 0, input_mode = 0, dtype = CUDNN_DATA_FLOAT;
  int input_size = 0, hidden_size = 0, proj_size = 0, num_layers = 0;
};
struct cudnnRNNDataStruct {
  int dtype = CUDNN_DATA_FLOAT, layout = 0, max_seq_length = 0, batch_size = 0, vector_size = 0;
};

namespace vgpu_cudnn {
TensorShape shape_of(const cudnnTensorStruct* t);
size_t dtype_bytes(int dtype);
}  // namespace vgpu_cudnn

#define CUDNN_API extern "C" __attribute__((visibility("default")))

// cudnnCreateX / cudnnDestroyX for a descriptor type the stand-in holds.
#define VGPU_CUDNN_DESCRIPTOR(Name, Type)                          \
  CUDNN_API cudnnStatus_t cudnnCreate##Name(Type* out) {           \
    if (!out) return CUDNN_STATUS_BAD_PARAM;                       \
    *out = new std::remove_pointer_t<Type>();                      \
    return CUDNN_STATUS_SUCCESS;                                   \
  }                                                                \
  CUDNN_API cudnnStatus_t cudnnDestroy##Name(Type desc) {          \
    delete desc;                                                   \
    return CUDNN_STATUS_SUCCESS;                                   \
  }
