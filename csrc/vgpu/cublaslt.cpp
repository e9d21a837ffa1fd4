// libcublasLt.so.<major>: cuBLASLt on the virtual GPU. Descriptors and
// preferences are created and destroyed; the heuristic offers one algorithm
// that needs no workspace beyond what torch gives; matmuls compute nothing.
#include <cublasLt.h>

#include <cstring>

#define API extern "C" __attribute__((visibility("default")))

API size_t cublasLtGetVersion(void) {
  return CUBLAS_VERSION;
}
// Handles of their own (torch shares cuBLAS's; DeepGEMM, in vLLM, makes one).
API cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(new char[1]);
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete[] reinterpret_cast<char*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t, cudaDataType_t) {
  *desc = new cublasLtMatmulDescOpaque_t();
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*,
                                                  size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType, uint64_t, uint64_t,
                                              int64_t) {
  *layout = new cublasLtMatrixLayoutOpaque_t();
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t,
                                                    const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t();
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                        cublasLtMatmulPreferenceAttributes_t, const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                                  cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                                  cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int requested,
                                                  cublasLtMatmulHeuristicResult_t results[], int* returned) {
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  std::memset(&results[0], 0, sizeof(results[0]));
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulAlgoInit(cublasLtHandle_t, cublasComputeType_t, cudaDataType_t, cudaDataType_t,
                                          cudaDataType_t, cudaDataType_t, cudaDataType_t, int,
                                          cublasLtMatmulAlgo_t* algo) {
  std::memset(algo, 0, sizeof(*algo));
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                           cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                           const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  cublasLtMatmulAlgo_t copy = *algo;  // may alias result->algo
  std::memset(result, 0, sizeof(*result));
  result->algo = copy;
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.0f;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t*, cublasLtMatmulAlgoConfigAttributes_t,
                                                        const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t*,
                                                        cublasLtMatmulAlgoConfigAttributes_t, void* buf, size_t size,
                                                        size_t* written) {
  if (buf != nullptr) std::memset(buf, 0, size);
  if (written != nullptr) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                                  cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t, const void*, const void*,
                                  cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*,
                                  void*, size_t, cudaStream_t) {
  return CUBLAS_STATUS_SUCCESS;
}
