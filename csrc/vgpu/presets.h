// The GPU models the virtual GPU can be: what torch reads of a device.
//
// total_mib is the total memory CUDA reports (cudaMemGetInfo, totalGlobalMem)
// on a typical card of that model: less than the marketing size and less than
// nvidia-smi's total, and it varies a little with the driver and ECC. The
// values come from `torch.cuda.get_device_properties` printouts of real cards;
// `make gpu-check` records the real figure where a GPU is lent (H100-80GB:
// 81079 MiB measured on an H100 80GB HBM3, driver 580.159.04). Override with
// ALLOCSCOPE_VGPU_MEMORY (allocscope run --gpu-memory).
#pragma once

#include <cstdint>

namespace vgpu {

struct Preset {
  const char* key;   // what users type: --gpu H100-80GB
  const char* name;  // cudaDeviceProp::name, as the driver reports it
  uint64_t total_mib;
  int major, minor;
  int sms;
  int l2_bytes;
  int smem_per_block_optin;  // bytes
  int smem_per_sm;           // bytes
  int max_threads_per_sm;
  int max_blocks_per_sm;
  int bus_width_bits;
  int clock_khz;
  int memory_clock_khz;
};

inline constexpr int kKiB = 1024;
inline constexpr int kMiB = 1024 * 1024;

inline constexpr Preset kPresets[] = {
    {"H100-80GB", "NVIDIA H100 80GB HBM3", 81079, 9, 0, 132, 50 * kMiB, 227 * kKiB, 228 * kKiB, 2048, 32, 5120,
     1980000, 2619000},
    {"H200-141GB", "NVIDIA H200", 143156, 9, 0, 132, 50 * kMiB, 227 * kKiB, 228 * kKiB, 2048, 32, 6144, 1980000,
     3201000},
    {"A100-80GB", "NVIDIA A100-SXM4-80GB", 81050, 8, 0, 108, 40 * kMiB, 163 * kKiB, 164 * kKiB, 2048, 32, 5120,
     1410000, 1593000},
    {"A100-40GB", "NVIDIA A100-SXM4-40GB", 40536, 8, 0, 108, 40 * kMiB, 163 * kKiB, 164 * kKiB, 2048, 32, 5120,
     1410000, 1215000},
    {"L4-24GB", "NVIDIA L4", 22563, 8, 9, 58, 48 * kMiB, 99 * kKiB, 100 * kKiB, 1536, 24, 192, 2040000, 6251000},
    {"RTX4090-24GB", "NVIDIA GeForce RTX 4090", 24563, 8, 9, 128, 72 * kMiB, 99 * kKiB, 100 * kKiB, 1536, 24, 384,
     2520000, 10501000},
    {"T4-16GB", "Tesla T4", 15095, 7, 5, 40, 4 * kMiB, 64 * kKiB, 64 * kKiB, 1024, 16, 256, 1590000, 5001000},
    {"V100-16GB", "Tesla V100-SXM2-16GB", 16160, 7, 0, 80, 6 * kMiB, 96 * kKiB, 96 * kKiB, 2048, 32, 4096, 1530000,
     877000},
};

inline constexpr int kPresetCount = sizeof(kPresets) / sizeof(kPresets[0]);

// The CUDA context's share of device memory, taken when a device's context is
// created: about what a real card shows used before its first tensor (CUDA 12+
// with lazy module loading). Override with ALLOCSCOPE_VGPU_CONTEXT.
inline constexpr uint64_t kDefaultContextBytes = 512ull * kMiB;

}  // namespace vgpu
