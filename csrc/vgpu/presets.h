// The GPU models the virtual GPU can be: what torch reads of a device.
//
// total_bytes is the total memory CUDA reports (cudaMemGetInfo, totalGlobalMem)
// on a typical card of that model: less than the marketing size and less than
// nvidia-smi's total, and it varies a little with the driver and ECC. The
// values come from `torch.cuda.get_device_properties` printouts of real cards;
// `make gpu-check` records the real figure where a GPU is lent (H100-80GB:
// 81079 MiB measured on an H100 80GB HBM3; H200-141GB: 150,109,880,320 B,
// 64 KiB short of 143,156 MiB, on an NVIDIA H200; driver 580.159.04). Override
// with ALLOCSCOPE_VGPU_MEMORY (allocscope run --gpu-memory).
#pragma once

#include <cstdint>

namespace vgpu {

struct Preset {
  const char* key;   // what users type: --gpu H100-80GB
  const char* name;  // cudaDeviceProp::name, as the driver reports it
  uint64_t total_bytes;
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

// Whether cards of this model reach each other over NVLink (the SXM parts:
// V100 SXM2, A100 SXM4, H100/H200 SXM5), not over PCIe; not a MIG instance.
constexpr bool has_nvlink(const Preset& p) {
  bool sxm = p.major >= 9 || (p.minor == 0 && (p.major == 8 || p.major == 7));
  for (const char* c = p.name; *c != '\0'; ++c) {
    if (c[0] == ' ' && c[1] == 'M' && c[2] == 'I' && c[3] == 'G') return false;
  }
  return sxm;
}

inline constexpr int kKiB = 1024;
inline constexpr int kMiB = 1024 * 1024;
constexpr uint64_t mib(uint64_t n) { return n << 20; }

// The whole cards. The H100's and H200's memory, SMs, capability and L2 are
// as torch read them on the cards (`make gpu-check`, 2026-11-25 and -26).
inline constexpr Preset kH100_80GB = {"H100-80GB", "NVIDIA H100 80GB HBM3", mib(81079), 9, 0, 132, 50 * kMiB, 227 * kKiB,
                                      228 * kKiB, 2048, 32, 5120, 1980000, 2619000};
inline constexpr Preset kH200_141GB = {"H200-141GB", "NVIDIA H200", 150109880320ull, 9, 0, 132, 60 * kMiB, 227 * kKiB,
                                       228 * kKiB, 2048, 32, 6144, 1980000, 3201000};
inline constexpr Preset kA100_80GB = {"A100-80GB", "NVIDIA A100-SXM4-80GB", mib(81050), 8, 0, 108, 40 * kMiB, 163 * kKiB,
                                      164 * kKiB, 2048, 32, 5120, 1410000, 1593000};
inline constexpr Preset kA100_40GB = {"A100-40GB", "NVIDIA A100-SXM4-40GB", mib(40536), 8, 0, 108, 40 * kMiB, 163 * kKiB,
                                      164 * kKiB, 2048, 32, 5120, 1410000, 1215000};

// A MIG GPU instance of `card`: what CUDA reports inside it. Its memory and
// SMs are the profile's; its L2 cache and memory bus are the profile's share
// of the card's memory slices (eighths), as NVIDIA's MIG guide gives them and
// deviceQuery inside an A100 80GB instance shows (1g.10gb: 5 MB L2, 640-bit
// bus); the rest is the card's.
constexpr Preset mig(const Preset& card, const char* key, const char* name, uint64_t total_mib, int sms,
                     int eighths) {
  Preset p = card;
  p.key = key;
  p.name = name;
  p.total_bytes = mib(total_mib);
  p.sms = sms;
  p.l2_bytes = card.l2_bytes / 8 * eighths;
  p.bus_width_bits = card.bus_width_bits / 8 * eighths;
  return p;
}

// The MIG profiles' memory (MiB) and SMs are what `nvidia-smi mig -lgip`
// prints for them (its GiB column is the total CUDA reports inside the
// instance: 4.75 GiB for an A100 40GB's 1g.5gb), from printouts of real
// cards in public notes; none was read on a card of ours (docs/vgpu.md says
// which). Profiles whose figures no printout gave take those of the profile
// with the same memory slices (1g.20gb's memory is 2g.20gb's).
inline constexpr Preset kPresets[] = {
    kH100_80GB,
    kH200_141GB,
    kA100_80GB,
    kA100_40GB,
    {"L4-24GB", "NVIDIA L4", mib(22563), 8, 9, 58, 48 * kMiB, 99 * kKiB, 100 * kKiB, 1536, 24, 192, 2040000, 6251000},
    {"RTX4090-24GB", "NVIDIA GeForce RTX 4090", mib(24563), 8, 9, 128, 72 * kMiB, 99 * kKiB, 100 * kKiB, 1536, 24, 384,
     2520000, 10501000},
    {"T4-16GB", "Tesla T4", mib(15095), 7, 5, 40, 4 * kMiB, 64 * kKiB, 64 * kKiB, 1024, 16, 256, 1590000, 5001000},
    {"V100-16GB", "Tesla V100-SXM2-16GB", mib(16160), 7, 0, 80, 6 * kMiB, 96 * kKiB, 96 * kKiB, 2048, 32, 4096, 1530000,
     877000},
    // H100 80GB: lgip 9.75, 19.62, 19.62, 39.50, 39.50, 79.25 GiB
    mig(kH100_80GB, "H100-80GB-MIG-1g.10gb", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984, 16, 1),
    mig(kH100_80GB, "H100-80GB-MIG-1g.20gb", "NVIDIA H100 80GB HBM3 MIG 1g.20gb", 20096, 26, 2),
    mig(kH100_80GB, "H100-80GB-MIG-2g.20gb", "NVIDIA H100 80GB HBM3 MIG 2g.20gb", 20096, 32, 2),
    mig(kH100_80GB, "H100-80GB-MIG-3g.40gb", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448, 60, 4),
    mig(kH100_80GB, "H100-80GB-MIG-4g.40gb", "NVIDIA H100 80GB HBM3 MIG 4g.40gb", 40448, 64, 4),
    mig(kH100_80GB, "H100-80GB-MIG-7g.80gb", "NVIDIA H100 80GB HBM3 MIG 7g.80gb", 81152, 132, 8),
    // H200: lgip 16.00 (1g.18gb), 32.50 (2g.35gb), 140.00 GiB (7g.141gb); 3g.71gb:
    // 60 SMs and 69.8 GB (65.00 GiB) as torch reported it inside one
    mig(kH200_141GB, "H200-141GB-MIG-1g.18gb", "NVIDIA H200 MIG 1g.18gb", 16384, 16, 1),
    mig(kH200_141GB, "H200-141GB-MIG-1g.35gb", "NVIDIA H200 MIG 1g.35gb", 33280, 26, 2),
    mig(kH200_141GB, "H200-141GB-MIG-2g.35gb", "NVIDIA H200 MIG 2g.35gb", 33280, 32, 2),
    mig(kH200_141GB, "H200-141GB-MIG-3g.71gb", "NVIDIA H200 MIG 3g.71gb", 66560, 60, 4),
    mig(kH200_141GB, "H200-141GB-MIG-4g.71gb", "NVIDIA H200 MIG 4g.71gb", 66560, 64, 4),
    mig(kH200_141GB, "H200-141GB-MIG-7g.141gb", "NVIDIA H200 MIG 7g.141gb", 143360, 132, 8),
    // A100 80GB: deviceQuery inside 1g.10gb, 2g.20gb, 3g.40gb: 10.2, 20.9, 42.4 GB (9.50, 19.50, 39.50 GiB)
    mig(kA100_80GB, "A100-80GB-MIG-1g.10gb", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9728, 14, 1),
    mig(kA100_80GB, "A100-80GB-MIG-1g.20gb", "NVIDIA A100-SXM4-80GB MIG 1g.20gb", 19968, 14, 2),
    mig(kA100_80GB, "A100-80GB-MIG-2g.20gb", "NVIDIA A100-SXM4-80GB MIG 2g.20gb", 19968, 28, 2),
    mig(kA100_80GB, "A100-80GB-MIG-3g.40gb", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40448, 42, 4),
    mig(kA100_80GB, "A100-80GB-MIG-4g.40gb", "NVIDIA A100-SXM4-80GB MIG 4g.40gb", 40448, 56, 4),
    // A100 40GB: lgip 4.75, 9.75, 9.75, 19.62, 19.62, 39.38 GiB
    mig(kA100_40GB, "A100-40GB-MIG-1g.5gb", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864, 14, 1),
    mig(kA100_40GB, "A100-40GB-MIG-1g.10gb", "NVIDIA A100-SXM4-40GB MIG 1g.10gb", 9984, 14, 2),
    mig(kA100_40GB, "A100-40GB-MIG-2g.10gb", "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 9984, 28, 2),
    mig(kA100_40GB, "A100-40GB-MIG-3g.20gb", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20096, 42, 4),
    mig(kA100_40GB, "A100-40GB-MIG-4g.20gb", "NVIDIA A100-SXM4-40GB MIG 4g.20gb", 20096, 56, 4),
    mig(kA100_40GB, "A100-40GB-MIG-7g.40gb", "NVIDIA A100-SXM4-40GB MIG 7g.40gb", 40320, 98, 8),
};

inline constexpr int kPresetCount = sizeof(kPresets) / sizeof(kPresets[0]);

// The CUDA context's share of device memory, taken when a device's context is
// created: about what a real card shows used before its first tensor (CUDA 12+
// with lazy module loading). Override with ALLOCSCOPE_VGPU_CONTEXT.
inline constexpr uint64_t kDefaultContextBytes = 512ull * kMiB;

}  // namespace vgpu
