// libcudnn.so.9, part 2: the handle, versions, errors, and the legacy
// descriptor API torch still calls: batch norm (its workspace and the reserve
// space it keeps for backward come from the tables, cudnn_tables.h), the v7
// convolution API (torch's fallback where the v8 API is turned off), pooling
// and the spatial transformer. Calls that run kernels compute nothing.
#include "cudnn_legacy.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <type_traits>

namespace vgpu_cudnn {

TensorShape shape_of(const cudnnTensorStruct* t) {
  TensorShape s;
  if (!t) return s;
  s.dtype = t->dtype;
  s.dims.assign(t->dims.begin(), t->dims.end());
  s.strides.assign(t->strides.begin(), t->strides.end());
  return s;
}

size_t dtype_bytes(int dtype) {
  switch (dtype) {
    case CUDNN_DATA_DOUBLE:
    case CUDNN_DATA_INT64:
      return 8;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16:
      return 2;
    case CUDNN_DATA_INT8:
    case CUDNN_DATA_UINT8:
    case CUDNN_DATA_BOOLEAN:
      return 1;
    default:
      return 4;
  }
}

}  // namespace vgpu_cudnn

namespace {

// Filters have a format, not strides: dense in NCHW order, or in NHWC order.
vgpu_cudnn::TensorShape filter_shape(const cudnnFilterStruct* f) {
  vgpu_cudnn::TensorShape s;
  if (!f) return s;
  s.dtype = f->dtype;
  s.dims.assign(f->dims.begin(), f->dims.end());
  const size_t n = s.dims.size();
  s.strides.assign(n, 1);
  if (f->format == CUDNN_TENSOR_NHWC && n >= 3) {
    int64_t acc = s.dims[1];
    for (size_t i = n; i-- > 2;) {
      s.strides[i] = acc;
      acc *= s.dims[i];
    }
    s.strides[0] = acc;
  } else {
    int64_t acc = 1;
    for (size_t i = n; i-- > 0;) {
      s.strides[i] = acc;
      acc *= s.dims[i];
    }
  }
  return s;
}

uint64_t legacy_conv_workspace(vgpu_cudnn::ConvKind kind, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                               const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y) {
  vgpu_cudnn::ConvProblem p;
  p.kind = kind;
  p.x = vgpu_cudnn::shape_of(x);
  p.w = filter_shape(w);
  p.y = vgpu_cudnn::shape_of(y);
  if (conv) {
    p.padding.assign(conv->padding.begin(), conv->padding.end());
    p.stride.assign(conv->stride.begin(), conv->stride.end());
    p.dilation.assign(conv->dilation.begin(), conv->dilation.end());
  }
  return vgpu_cudnn::conv_workspace(p);
}

template <typename Perf, typename Algo>
void one_algorithm(Algo algo, uint64_t memory, int requested, int* returned, Perf* results) {
  if (returned) *returned = 0;
  if (requested < 1 || !results) return;
  std::memset(&results[0], 0, sizeof(Perf));
  results[0].algo = algo;
  results[0].status = CUDNN_STATUS_SUCCESS;
  results[0].memory = memory;
  results[0].determinism = CUDNN_DETERMINISTIC;
  results[0].mathType = CUDNN_DEFAULT_MATH;
  if (returned) *returned = 1;
}

thread_local char last_error[256] = "";

}  // namespace

// ---- handle, versions, errors

CUDNN_API cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  *handle = new cudnnContext();
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  if (!handle || !stream) return CUDNN_STATUS_BAD_PARAM;
  *stream = handle->stream;
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API size_t cudnnGetVersion(void) {
  return CUDNN_VERSION;
}
CUDNN_API size_t cudnnGetCudartVersion(void) {
  return CUDART_VERSION;
}
CUDNN_API cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int* value) {
  if (!value) return CUDNN_STATUS_BAD_PARAM;
  switch (type) {
    case MAJOR_VERSION:
      *value = CUDNN_MAJOR;
      return CUDNN_STATUS_SUCCESS;
    case MINOR_VERSION:
      *value = CUDNN_MINOR;
      return CUDNN_STATUS_SUCCESS;
    case PATCH_LEVEL:
      *value = CUDNN_PATCHLEVEL;
      return CUDNN_STATUS_SUCCESS;
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}
CUDNN_API const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED (allocscope's virtual GPU does not model this cuDNN call: docs/vgpu.md)";
    default:
      return "CUDNN_STATUS_INTERNAL_ERROR";
  }
}
CUDNN_API void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  std::strncpy(message, last_error, max_size - 1);
  message[max_size - 1] = '\0';
}

// ---- descriptors

VGPU_CUDNN_DESCRIPTOR(TensorDescriptor, cudnnTensorDescriptor_t)
VGPU_CUDNN_DESCRIPTOR(FilterDescriptor, cudnnFilterDescriptor_t)
VGPU_CUDNN_DESCRIPTOR(ConvolutionDescriptor, cudnnConvolutionDescriptor_t)
VGPU_CUDNN_DESCRIPTOR(ActivationDescriptor, cudnnActivationDescriptor_t)
VGPU_CUDNN_DESCRIPTOR(PoolingDescriptor, cudnnPoolingDescriptor_t)
VGPU_CUDNN_DESCRIPTOR(SpatialTransformerDescriptor, cudnnSpatialTransformerDescriptor_t)

CUDNN_API cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t desc, cudnnDataType_t dtype, int nb_dims,
                                                   const int dims[], const int strides[]) {
  if (!desc || nb_dims < 0 || (nb_dims > 0 && (!dims || !strides))) return CUDNN_STATUS_BAD_PARAM;
  desc->dtype = dtype;
  desc->dims.assign(dims, dims + nb_dims);
  desc->strides.assign(strides, strides + nb_dims);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t desc, int requested,
                                                   cudnnDataType_t* dtype, int* nb_dims, int dims[], int strides[]) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  if (dtype) *dtype = static_cast<cudnnDataType_t>(desc->dtype);
  if (nb_dims) *nb_dims = static_cast<int>(desc->dims.size());
  for (int i = 0; i < requested && i < static_cast<int>(desc->dims.size()); ++i) {
    if (dims) dims[i] = desc->dims[i];
    if (strides) strides[i] = desc->strides[i];
  }
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t dtype,
                                                   cudnnTensorFormat_t format, int nb_dims, const int dims[]) {
  if (!desc || nb_dims < 0 || (nb_dims > 0 && !dims)) return CUDNN_STATUS_BAD_PARAM;
  desc->dtype = dtype;
  desc->format = format;
  desc->dims.assign(dims, dims + nb_dims);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnGetFilterNdDescriptor(const cudnnFilterDescriptor_t desc, int requested,
                                                   cudnnDataType_t* dtype, cudnnTensorFormat_t* format, int* nb_dims,
                                                   int dims[]) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  if (dtype) *dtype = static_cast<cudnnDataType_t>(desc->dtype);
  if (format) *format = static_cast<cudnnTensorFormat_t>(desc->format);
  if (nb_dims) *nb_dims = static_cast<int>(desc->dims.size());
  for (int i = 0; i < requested && i < static_cast<int>(desc->dims.size()) && dims; ++i) dims[i] = desc->dims[i];
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t desc, int n, const int pad[],
                                                        const int stride[], const int dilation[],
                                                        cudnnConvolutionMode_t, cudnnDataType_t) {
  if (!desc || n < 0 || (n > 0 && (!pad || !stride || !dilation))) return CUDNN_STATUS_BAD_PARAM;
  desc->padding.assign(pad, pad + n);
  desc->stride.assign(stride, stride + n);
  desc->dilation.assign(dilation, dilation + n);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t desc, int groups) {
  if (!desc || groups < 1) return CUDNN_STATUS_BAD_PARAM;
  desc->groups = groups;
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t) {
  return desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}
CUDNN_API cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t desc, cudnnActivationMode_t,
                                                     cudnnNanPropagation_t, double) {
  return desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}
CUDNN_API cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t desc, cudnnPoolingMode_t,
                                                    cudnnNanPropagation_t, int, int, int, int, int, int) {
  return desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}
CUDNN_API cudnnStatus_t cudnnSetSpatialTransformerNdDescriptor(cudnnSpatialTransformerDescriptor_t desc,
                                                               cudnnSamplerType_t, cudnnDataType_t, const int,
                                                               const int[]) {
  return desc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

// ---- convolutions, v7 API: one algorithm, with the tables' workspace

CUDNN_API cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                               const cudnnFilterDescriptor_t w,
                                                               const cudnnConvolutionDescriptor_t conv,
                                                               const cudnnTensorDescriptor_t y, const int requested,
                                                               int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
  one_algorithm(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, legacy_conv_workspace(vgpu_cudnn::kFprop, x, w, conv, y),
                requested, returned, results);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const void*, const cudnnFilterDescriptor_t w, const void*,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y, void*, const int requested,
    int* returned, cudnnConvolutionFwdAlgoPerf_t* results, void*, size_t) {
  return cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, conv, y, requested, returned, results);
}
CUDNN_API cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                                const cudnnFilterDescriptor_t w,
                                                                const cudnnConvolutionDescriptor_t conv,
                                                                const cudnnTensorDescriptor_t y,
                                                                cudnnConvolutionFwdAlgo_t, size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = legacy_conv_workspace(vgpu_cudnn::kFprop, x, w, conv, y);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t, const void*, const cudnnTensorDescriptor_t, const void*,
                                                const cudnnFilterDescriptor_t, const void*,
                                                const cudnnConvolutionDescriptor_t, cudnnConvolutionFwdAlgo_t, void*,
                                                size_t, const void*, const cudnnTensorDescriptor_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t, const void*, const cudnnTensorDescriptor_t, const void*, const cudnnFilterDescriptor_t, const void*,
    const cudnnConvolutionDescriptor_t, cudnnConvolutionFwdAlgo_t, void*, size_t, const void*,
    const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t, const void*,
    const cudnnActivationDescriptor_t, const cudnnTensorDescriptor_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, const int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* results) {
  one_algorithm(CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, legacy_conv_workspace(vgpu_cudnn::kDgrad, dx, w, conv, dy),
                requested, returned, results);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const void*, const cudnnTensorDescriptor_t dy, const void*,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, void*, const int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results, void*, size_t) {
  return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, dy, conv, dx, requested, returned, results);
}
CUDNN_API cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                                     const cudnnTensorDescriptor_t dy,
                                                                     const cudnnConvolutionDescriptor_t conv,
                                                                     const cudnnTensorDescriptor_t dx,
                                                                     cudnnConvolutionBwdDataAlgo_t, size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = legacy_conv_workspace(vgpu_cudnn::kDgrad, dx, w, conv, dy);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t, const void*, const cudnnFilterDescriptor_t,
                                                     const void*, const cudnnTensorDescriptor_t, const void*,
                                                     const cudnnConvolutionDescriptor_t, cudnnConvolutionBwdDataAlgo_t,
                                                     void*, size_t, const void*, const cudnnTensorDescriptor_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, const int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* results) {
  one_algorithm(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, legacy_conv_workspace(vgpu_cudnn::kWgrad, x, dw, conv, dy),
                requested, returned, results);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const void*, const cudnnTensorDescriptor_t dy, const void*,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, void*, const int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* results, void*, size_t) {
  return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, dy, conv, dw, requested, returned, results);
}
CUDNN_API cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                                       const cudnnTensorDescriptor_t dy,
                                                                       const cudnnConvolutionDescriptor_t conv,
                                                                       const cudnnFilterDescriptor_t dw,
                                                                       cudnnConvolutionBwdFilterAlgo_t, size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = legacy_conv_workspace(vgpu_cudnn::kWgrad, x, dw, conv, dy);
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t, const void*, const cudnnTensorDescriptor_t,
                                                       const void*, const cudnnTensorDescriptor_t, const void*,
                                                       const cudnnConvolutionDescriptor_t,
                                                       cudnnConvolutionBwdFilterAlgo_t, void*, size_t, const void*,
                                                       const cudnnFilterDescriptor_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}

// ---- batch norm: workspaces and the reserve space from the tables

CUDNN_API cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t, const cudnnTensorDescriptor_t x,
    const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
    const cudnnActivationDescriptor_t, size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = vgpu_cudnn::batch_norm_bytes("bn_fwd_ws", mode, vgpu_cudnn::shape_of(x));
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnnHandle_t, cudnnBatchNormMode_t mode,
                                                                             cudnnBatchNormOps_t,
                                                                             const cudnnActivationDescriptor_t,
                                                                             const cudnnTensorDescriptor_t x,
                                                                             size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = vgpu_cudnn::batch_norm_bytes("bn_reserve", mode, vgpu_cudnn::shape_of(x));
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t, const cudnnTensorDescriptor_t x,
    const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
    const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t, const cudnnActivationDescriptor_t, size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  *bytes = vgpu_cudnn::batch_norm_bytes("bn_bwd_ws", mode, vgpu_cudnn::shape_of(x));
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t, const void*, const void*, const cudnnTensorDescriptor_t,
    const void*, const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t, void*,
    const cudnnTensorDescriptor_t, const void*, const void*, double, void*, void*, double, void*, void*,
    cudnnActivationDescriptor_t, void*, size_t, void*, size_t) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnBatchNormalizationForwardInference(cudnnHandle_t, cudnnBatchNormMode_t, const void*,
                                                                const void*, const cudnnTensorDescriptor_t, const void*,
                                                                const cudnnTensorDescriptor_t, void*,
                                                                const cudnnTensorDescriptor_t, const void*, const void*,
                                                                const void*, const void*, double) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t, const void*, const void*, const void*, const void*,
    const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t, const void*,
    const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t, void*, const cudnnTensorDescriptor_t,
    void*, const cudnnTensorDescriptor_t, const void*, const void*, void*, void*, double, const void*, const void*,
    cudnnActivationDescriptor_t, void*, size_t, void*, size_t) {
  return CUDNN_STATUS_SUCCESS;
}

// ---- pooling, spatial transformer: compute nothing, need no memory

CUDNN_API cudnnStatus_t cudnnPoolingForward(cudnnHandle_t, const cudnnPoolingDescriptor_t, const void*,
                                            const cudnnTensorDescriptor_t, const void*, const void*,
                                            const cudnnTensorDescriptor_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSpatialTfGridGeneratorForward(cudnnHandle_t, const cudnnSpatialTransformerDescriptor_t,
                                                           const void*, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSpatialTfGridGeneratorBackward(cudnnHandle_t, const cudnnSpatialTransformerDescriptor_t,
                                                            const void*, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSpatialTfSamplerForward(cudnnHandle_t, cudnnSpatialTransformerDescriptor_t, const void*,
                                                     const cudnnTensorDescriptor_t, const void*, const void*,
                                                     const void*, cudnnTensorDescriptor_t, void*) {
  return CUDNN_STATUS_SUCCESS;
}
CUDNN_API cudnnStatus_t cudnnSpatialTfSamplerBackward(cudnnHandle_t, cudnnSpatialTransformerDescriptor_t, const void*,
                                                      const cudnnTensorDescriptor_t, const void*, const void*,
                                                      const cudnnTensorDescriptor_t, void*, const void*,
                                                      const cudnnTensorDescriptor_t, const void*, const void*,
                                                      const void*, void*) {
  return CUDNN_STATUS_SUCCESS;
}
