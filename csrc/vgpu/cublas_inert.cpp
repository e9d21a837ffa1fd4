// The computing cuBLAS functions (cublas_inert.inc): every one returns
// CUBLAS_STATUS_SUCCESS (0) and does nothing. cuBLAS functions all return
// cublasStatus_t in a register and leave their arguments to the caller, so
// one body serves every signature; this file includes no cuBLAS header so
// that the bodies need not repeat the declarations.
#define INERT(name) \
  extern "C" __attribute__((visibility("default"))) int name() { return 0; }
#include "cublas_inert.inc"
