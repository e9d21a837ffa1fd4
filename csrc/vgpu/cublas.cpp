// libcublas.so.<major>: cuBLAS on the virtual GPU. Handles keep what torch
// sets on them (stream, math and pointer modes, workspace); the host-device
// copies copy; every computing function succeeds and computes nothing
// (cublas_inert.cpp). torch allocates cuBLAS workspaces itself, through the
// caching allocator, so they show up in a capture as on a real GPU.
#include <cublas_v2.h>

#include "core.h"

namespace {

struct Handle {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
  void* workspace = nullptr;
  size_t workspace_size = 0;
};

Handle* of(cublasHandle_t h) {
  return reinterpret_cast<Handle*>(h);
}

// `count` strided pieces of `piece` bytes, copied in stream order.
cublasStatus_t copy_strided(int count, size_t piece, const void* src, size_t src_stride, void* dst,
                            size_t dst_stride, cudaStream_t handle) {
  if (count < 0) return CUBLAS_STATUS_INVALID_VALUE;
  vgpu::Stream* stream = vgpu::resolve_stream(handle);
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!vgpu::submit(stream, vgpu::Work::kCopy)) return CUBLAS_STATUS_SUCCESS;
  for (int i = 0; i < count; ++i) {
    if (vgpu::copy(static_cast<char*>(dst) + i * dst_stride, static_cast<const char*>(src) + i * src_stride, piece) !=
        vgpu::Result::kOk) {
      return CUBLAS_STATUS_MAPPING_ERROR;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

API const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "the operation completed successfully"
                                         : "an error on allocscope's virtual GPU";
}
API const char* cublasGetStatusName(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INTERNAL_ERROR";
}
API cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (vgpu::device_count() == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = reinterpret_cast<cublasHandle_t>(new Handle());
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete of(handle);
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  of(handle)->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  *stream = of(handle)->stream;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  of(handle)->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  *mode = of(handle)->math;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  of(handle)->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
  *mode = of(handle)->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t size) {
  of(handle)->workspace = workspace;
  of(handle)->workspace_size = size;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasSetSmCountTarget(cublasHandle_t, int) {
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasSetVectorAsync(int n, int size, const void* x, int incx, void* y, int incy,
                                        cudaStream_t stream) {
  return copy_strided(n, static_cast<size_t>(size), x, static_cast<size_t>(incx) * size, y,
                      static_cast<size_t>(incy) * size, stream);
}
API cublasStatus_t cublasGetVectorAsync(int n, int size, const void* x, int incx, void* y, int incy,
                                        cudaStream_t stream) {
  return cublasSetVectorAsync(n, size, x, incx, y, incy, stream);
}
API cublasStatus_t cublasSetMatrixAsync(int rows, int cols, int size, const void* a, int lda, void* b, int ldb,
                                        cudaStream_t stream) {
  if (rows < 0 || lda < rows || ldb < rows) return CUBLAS_STATUS_INVALID_VALUE;
  return copy_strided(cols, static_cast<size_t>(rows) * size, a, static_cast<size_t>(lda) * size, b,
                      static_cast<size_t>(ldb) * size, stream);
}
API cublasStatus_t cublasGetMatrixAsync(int rows, int cols, int size, const void* a, int lda, void* b, int ldb,
                                        cudaStream_t stream) {
  return cublasSetMatrixAsync(rows, cols, size, a, lda, b, ldb, stream);
}
