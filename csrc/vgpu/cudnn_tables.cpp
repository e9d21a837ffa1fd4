// The cuDNN tables and their rule (cudnn_tables.h).
#include "cudnn_tables.h"

#include <cudnn.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "core.h"

namespace vgpu_cudnn {
namespace {

struct Row {
  int version;
  int64_t batch;
  uint64_t bytes;
};

// Rows by card, operation and problem; and the cuDNN versions each card's
// operation was recorded with. Read once: a lookup runs at every batch
// norm and every convolution plan.
struct Tables {
  std::unordered_map<std::string, std::vector<Row>> rows;  // "card\top\tproblem"
  std::unordered_map<std::string, std::vector<int>> versions;  // "card\top"
};

const Tables& tables() {
  static Tables t;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("ALLOCSCOPE_VGPU_CUDNN_TABLES");
    if (!path || !*path) return;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::vector<std::string> f;
      std::stringstream ss(line);
      std::string field;
      while (std::getline(ss, field, '\t')) f.push_back(field);
      if (f.size() != 6) continue;
      try {
        Row r{std::stoi(f[1]), std::stoll(f[3]), std::stoull(f[5])};
        t.rows[f[0] + '\t' + f[2] + '\t' + f[4]].push_back(r);
        t.versions[f[0] + '\t' + f[2]].push_back(r.version);
      } catch (...) {
        // a malformed row answers nothing
      }
    }
  });
  return t;
}

std::string join(const std::vector<int64_t>& v, size_t from = 0) {
  std::string s;
  for (size_t i = from; i < v.size(); ++i) {
    if (i > from) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// Channels last when the channel dimension is the densest (NHWC, NDHWC).
const char* layout(const TensorShape& t) {
  if (t.dims.size() >= 3 && t.strides.size() == t.dims.size() && t.dims[1] > 1 && t.strides[1] == 1) return "nhwc";
  return "nchw";
}

const char* kind_name(ConvKind k) {
  return k == kFprop ? "conv_fprop" : k == kDgrad ? "conv_dgrad" : "conv_wgrad";
}

const char* current_card() {
  const vgpu::DeviceInfo* d = vgpu::device(vgpu::current_device());
  return d ? d->preset->name : "";
}

uint64_t round_up(double bytes) {
  auto b = static_cast<uint64_t>(bytes + 0.999999);
  return (b + 511) / 512 * 512;
}

}  // namespace

uint64_t lookup(const std::string& op, int64_t batch, const std::string& key) {
  const std::string card = current_card();
  const Tables& t = tables();
  // The recorded version nearest this library's.
  auto v = t.versions.find(card + '\t' + op);
  if (v == t.versions.end()) return 0;
  int best_version = v->second.front();
  for (int version : v->second) {
    if (std::abs(version - CUDNN_VERSION) < std::abs(best_version - CUDNN_VERSION)) best_version = version;
  }
  auto rows = t.rows.find(card + '\t' + op + '\t' + key);
  if (rows == t.rows.end()) return 0;
  const Row* nearest = nullptr;
  for (const Row& r : rows->second) {
    if (r.version != best_version) continue;
    if (r.batch == batch) return r.bytes;
    if (!nearest || std::llabs(r.batch - batch) < std::llabs(nearest->batch - batch)) nearest = &r;
  }
  if (!nearest || nearest->batch <= 0) return 0;
  return round_up(static_cast<double>(nearest->bytes) * batch / nearest->batch);
}

uint64_t conv_workspace(const ConvProblem& p) {
  if (p.x.dims.empty()) return 0;
  std::ostringstream key;
  key << "dt=" << p.x.dtype << ' ' << layout(p.x) << " x=" << join(p.x.dims, 1) << " w=" << join(p.w.dims)
      << " y=" << join(p.y.dims, 1) << " pad=" << join(p.padding) << " stride=" << join(p.stride)
      << " dil=" << join(p.dilation);
  return lookup(kind_name(p.kind), p.x.dims[0], key.str());
}

uint64_t batch_norm_bytes(const char* op, int mode, const TensorShape& x) {
  if (x.dims.empty()) return 0;
  std::ostringstream key;
  key << "dt=" << x.dtype << ' ' << layout(x) << " mode=" << mode << " x=" << join(x.dims, 1);
  return lookup(op, x.dims[0], key.str());
}

}  // namespace vgpu_cudnn
