// The workspaces (and batch-norm reserve spaces) cuDNN asks torch for on the
// virtual GPU, from tables recorded on real cards (benchmarks/cudnn_tables.py,
// run by `make gpu-check`; docs/vgpu.md "cuDNN").
//
// A table row is: card name (cudaDeviceProp::name), cuDNN version, operation,
// batch size, the problem without its batch size, bytes. The file is
// ALLOCSCOPE_VGPU_CUDNN_TABLES (tab-separated; '#' starts a comment). For the
// current device's card and the recorded cuDNN version nearest this one:
//   - the same problem at the same batch size: the recorded bytes;
//   - the same problem at other batch sizes: the bytes at the nearest one,
//     scaled by the ratio of batch sizes (rounded up to 512 B);
//   - otherwise (another card, a problem never recorded): 0 bytes.
// Both sides build the problem key the same way: here (problem_key) and in
// benchmarks/cudnn_tables.py (problem_key); tests/integration/test_cudnn.py
// checks that a table recorded on the virtual GPU reads back as written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vgpu_cudnn {

enum ConvKind { kFprop, kDgrad, kWgrad };

struct TensorShape {
  std::vector<int64_t> dims, strides;
  int dtype = 0;  // cudnnDataType_t
};

// {x, w, y} of a convolution whatever its direction: dgrad's x is dx, and
// wgrad's w is dw.
struct ConvProblem {
  ConvKind kind = kFprop;
  TensorShape x, w, y;
  std::vector<int64_t> padding, stride, dilation;
};

uint64_t conv_workspace(const ConvProblem& p);

// Batch norm (the legacy API torch calls): op is "bn_fwd_ws", "bn_reserve"
// or "bn_bwd_ws"; mode is the cudnnBatchNormMode_t.
uint64_t batch_norm_bytes(const char* op, int mode, const TensorShape& x);

// What the tables answer for a key (exposed for the stand-in's own checks).
uint64_t lookup(const std::string& op, int64_t batch, const std::string& key);

}  // namespace vgpu_cudnn
