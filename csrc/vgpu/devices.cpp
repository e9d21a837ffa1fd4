// Devices: the configuration read from the environment (core.h), device
// attributes, the calling thread's current device; and what allocscope's
// Python side reads through ctypes.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <strings.h>
#include <vector>

#include "core.h"

namespace vgpu {
namespace {

// ---- configuration, read once from the environment

struct Config {
  std::vector<DeviceInfo> devices;
  int event_polls = 1;
};

void config_error(const std::string& what) {
  std::fprintf(stderr, "allocscope vgpu: %s; no virtual GPU\n", what.c_str());
}

bool parse_u64(const char* text, uint64_t* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-') return false;
  *out = v;
  return true;
}

const Preset* find_preset(const std::string& key) {
  for (const Preset& p : kPresets) {
    if (strcasecmp(p.key, key.c_str()) == 0) return &p;
  }
  return nullptr;
}

struct Device {
  const Preset* preset;
  uint64_t memory;  // bytes; 0: the preset's (or ALLOCSCOPE_VGPU_MEMORY's)
};

// "H100-80GB", "2xH100-80GB", "H100-80GB,A100-40GB", and a device's own
// memory in bytes after a colon: "H100-80GB:21474836480" (allocscope's
// Python side writes sizes such as "20GiB" out in bytes).
bool parse_devices(const char* spec, std::vector<Device>* out) {
  std::string text(spec);
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    int count = 1;
    size_t x = item.find_first_of("xX");
    if (x != std::string::npos && x > 0 && item.find_first_not_of("0123456789") == x) {
      count = std::atoi(item.substr(0, x).c_str());
      item = item.substr(x + 1);
    }
    uint64_t memory = 0;
    size_t colon = item.find(':');
    if (colon != std::string::npos) {
      if (!parse_u64(item.c_str() + colon + 1, &memory) || memory < kGranularity) return false;
      item.erase(colon);
    }
    const Preset* preset = find_preset(item);
    if (preset == nullptr || count < 1 || count > 16) return false;
    for (int i = 0; i < count; ++i) out->push_back(Device{preset, memory});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return !out->empty() && out->size() <= 16;
}

Config load_config() {
  Config c;
  const char* spec = std::getenv("ALLOCSCOPE_VGPU");
  if (spec == nullptr || *spec == '\0') return c;
  std::vector<Device> devices;
  if (!parse_devices(spec, &devices)) {
    config_error(std::string("ALLOCSCOPE_VGPU=") + spec + " names no known GPU (allocscope run --gpu list)");
    return c;
  }
  uint64_t memory = 0, context = kDefaultContextBytes, polls = 1;
  const char* m = std::getenv("ALLOCSCOPE_VGPU_MEMORY");
  if (m != nullptr && *m != '\0' && (!parse_u64(m, &memory) || memory < kGranularity)) {
    config_error(std::string("ALLOCSCOPE_VGPU_MEMORY=") + m + " is not a size in bytes of at least 2 MiB");
    return c;
  }
  const char* ctx = std::getenv("ALLOCSCOPE_VGPU_CONTEXT");
  if (ctx != nullptr && *ctx != '\0' && !parse_u64(ctx, &context)) {
    config_error(std::string("ALLOCSCOPE_VGPU_CONTEXT=") + ctx + " is not a size in bytes");
    return c;
  }
  const char* p = std::getenv("ALLOCSCOPE_VGPU_EVENT_POLLS");
  if (p != nullptr && *p != '\0' && (!parse_u64(p, &polls) || polls > 1000000)) {
    config_error(std::string("ALLOCSCOPE_VGPU_EVENT_POLLS=") + p + " is not a count");
    return c;
  }
  for (const Device& d : devices) {  // a device's own memory, else everyone's, else its model's
    uint64_t total = d.memory != 0 ? d.memory : memory != 0 ? memory : d.preset->total_bytes;
    c.devices.push_back(DeviceInfo{d.preset, total, std::min(context, total)});
  }
  c.event_polls = static_cast<int>(polls);
  return c;
}

const Config& config() {
  static const Config c = load_config();
  return c;
}

thread_local int t_device = 0;

bool valid_device(int device) {
  return device >= 0 && device < device_count();
}

}  // namespace

// ---- devices

int device_count() {
  return static_cast<int>(config().devices.size());
}

const DeviceInfo* device(int index) {
  return valid_device(index) ? &config().devices[index] : nullptr;
}

int event_polls() {
  return config().event_polls;
}

int pci_bus(int device) {
  return 0x18 + device;
}

Result device_attribute(int device, int attribute, int* value) {
  if (!valid_device(device)) return device_count() == 0 ? Result::kNoDevice : Result::kInvalidDevice;
  const Preset& p = *config().devices[device].preset;
  int v = 0;
  switch (attribute) {
    case 1: v = 1024; break;                       // max threads per block
    case 2: case 3: v = 1024; break;               // max block dim x, y
    case 4: v = 64; break;                         // max block dim z
    case 5: v = 0x7fffffff; break;                 // max grid dim x
    case 6: case 7: v = 65535; break;              // max grid dim y, z
    case 8: v = 48 * 1024; break;                  // shared memory per block
    case 9: v = 64 * 1024; break;                  // constant memory
    case 10: v = 32; break;                        // warp size
    case 11: v = 0x7fffffff; break;                // max pitch
    case 12: case 82: v = 65536; break;            // registers per block, per multiprocessor
    case 13: v = p.clock_khz; break;
    case 14: v = 512; break;                       // texture alignment
    case 15: case 19: case 31: v = 1; break;       // gpu overlap, can map host memory, concurrent kernels
    case 16: v = p.sms; break;
    case 32: v = std::strstr(p.name, "GeForce") == nullptr ? 1 : 0; break;  // ECC: data-center cards
    case 33: v = pci_bus(device); break;
    case 36: v = p.memory_clock_khz; break;
    case 37: v = p.bus_width_bits; break;
    case 38: v = p.l2_bytes; break;
    case 39: v = p.max_threads_per_sm; break;
    case 40: v = 2; break;                         // async engines
    case 41: case 78: case 79: case 80: case 83: v = 1; break;  // unified addressing, priorities, L1, managed
    case 51: v = 32; break;                        // texture pitch alignment
    case 75: v = p.major; break;
    case 76: v = p.minor; break;
    case 81: v = p.smem_per_sm; break;
    case 86: case 89: case 90: case 91: case 95: v = 1; break;  // atomics, managed, preemption, coop launch
    case 97: v = p.smem_per_block_optin; break;
    case 99: case 102: case 103: case 115: v = 1; break;  // host register, VMM, POSIX fd handles, pools
    case 106: v = p.max_blocks_per_sm; break;
    case 111: v = 1024; break;                     // reserved shared memory per block
    case 120: v = p.major >= 9 ? 1 : 0; break;     // cluster launch
    case 125: v = 1; break;                        // IPC events
    default: v = 0;  // includes 128: no fabric handles
  }
  *value = v;
  return Result::kOk;
}

int current_device() {
  return t_device;
}

Result set_current_device(int device) {
  if (!valid_device(device)) return device_count() == 0 ? Result::kNoDevice : Result::kInvalidDevice;
  t_device = device;
  return Result::kOk;
}

}  // namespace vgpu

// ---- for allocscope's Python side

namespace {

std::string json_string(const char* text) {
  std::string out = "\"";
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c == '"' || *c == '\\') out += '\\';
    out += *c;
  }
  return out + "\"";
}

}  // namespace

const char* allocscope_vgpu_presets_json() {
  static const std::string json = [] {
    std::string out = "[";
    for (int i = 0; i < vgpu::kPresetCount; ++i) {
      const vgpu::Preset& p = vgpu::kPresets[i];
      char buf[512];
      std::snprintf(buf, sizeof(buf),
                    "%s{\"key\": %s, \"name\": %s, \"total_memory\": %llu, \"major\": %d, \"minor\": %d, "
                    "\"multi_processor_count\": %d, \"l2_cache_size\": %d}",
                    i == 0 ? "" : ", ", json_string(p.key).c_str(), json_string(p.name).c_str(),
                    static_cast<unsigned long long>(p.total_bytes), p.major, p.minor, p.sms, p.l2_bytes);
      out += buf;
    }
    return out + "]";
  }();
  return json.c_str();
}

const char* allocscope_vgpu_state_json() {
  thread_local std::string json;
  json = "{\"event_polls\": " + std::to_string(vgpu::event_polls()) + ", \"devices\": [";
  for (int i = 0; i < vgpu::device_count(); ++i) {
    const vgpu::DeviceInfo* d = vgpu::device(i);
    uint64_t nccl_peak = 0;
    uint64_t nccl = vgpu::nccl_bytes(i, &nccl_peak);
    json += (i == 0 ? "{" : ", {") + std::string("\"key\": ") + json_string(d->preset->key) +
            ", \"total\": " + std::to_string(d->total) + ", \"context_bytes\": " + std::to_string(d->context_bytes) +
            ", \"used\": " + std::to_string(vgpu::used_bytes(i)) +
            ", \"own\": " + std::to_string(vgpu::own_bytes(i)) +
            ", \"nccl\": " + std::to_string(nccl) +
            ", \"nccl_peak\": " + std::to_string(nccl_peak) +
            ", \"contexts_created\": " + std::to_string(vgpu::contexts_created(i));
    int contexts = 0;
    uint64_t others = vgpu::other_process_bytes(i, &contexts);
    json += ", \"other_processes\": " + std::to_string(others) +
            ", \"other_contexts\": " + std::to_string(contexts) + "}";
  }
  json += "]}";
  return json.c_str();
}
