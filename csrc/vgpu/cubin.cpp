#include "cubin.h"

#include <elf.h>

#include <cstdint>
#include <cstring>

namespace vgpu {
namespace {

constexpr uint16_t kMachineCuda = 190;  // EM_CUDA

// The .nv.info attributes read here (the numbering cuobjdump -elf prints).
constexpr uint8_t kAttrMaxThreads = 0x05;
constexpr uint8_t kAttrRequiredThreads = 0x10;
constexpr uint8_t kAttrFrameSize = 0x11;
constexpr uint8_t kAttrRegisterCount = 0x2f;
// Entry formats: a value in the header (HVAL) or a sized payload (SVAL).
constexpr uint8_t kFormatHval = 0x03;
constexpr uint8_t kFormatSval = 0x04;

struct Image {
  const uint8_t* base;
  const Elf64_Ehdr* header;
  const Elf64_Shdr* sections;
  const char* section_names;

  const Elf64_Shdr* section(const char* name) const {
    for (int i = 0; i < header->e_shnum; ++i)
      if (std::strcmp(section_names + sections[i].sh_name, name) == 0) return &sections[i];
    return nullptr;
  }
  const uint8_t* data(const Elf64_Shdr& s) const { return base + s.sh_offset; }
};

// Calls visit(attribute, payload, payload_size) for each entry of an
// .nv.info section; an HVAL's 16-bit value is its payload.
template <typename Visit>
void each_attribute(const Image& image, const Elf64_Shdr& s, Visit visit) {
  const uint8_t* p = image.data(s);
  const uint8_t* end = p + s.sh_size;
  while (p + 4 <= end) {
    uint8_t format = p[0], attribute = p[1];
    uint16_t size = 0;
    std::memcpy(&size, p + 2, 2);
    if (format == kFormatSval) {
      if (p + 4 + size > end) return;
      visit(attribute, p + 4, size);
      p += 4 + size;
    } else {
      if (format == kFormatHval) visit(attribute, p + 2, 2);
      p += 4;
    }
  }
}

uint32_t word(const uint8_t* p, int index) {
  uint32_t v = 0;
  std::memcpy(&v, p + 4 * index, 4);
  return v;
}

int section_size(const Image& image, const std::string& name) {
  const Elf64_Shdr* s = image.section(name.c_str());
  return s == nullptr ? 0 : static_cast<int>(s->sh_size);
}

}  // namespace

bool read_cubin(const void* data, std::vector<KernelResources>* kernels) {
  auto* header = static_cast<const Elf64_Ehdr*>(data);
  if (data == nullptr || std::memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 ||
      header->e_ident[EI_CLASS] != ELFCLASS64 || header->e_machine != kMachineCuda ||
      header->e_shentsize != sizeof(Elf64_Shdr) || header->e_shstrndx >= header->e_shnum)
    return false;
  Image image{static_cast<const uint8_t*>(data), header, nullptr, nullptr};
  image.sections = reinterpret_cast<const Elf64_Shdr*>(image.base + header->e_shoff);
  image.section_names = reinterpret_cast<const char*>(image.data(image.sections[header->e_shstrndx]));
  const Elf64_Shdr* symtab = image.section(".symtab");
  if (symtab == nullptr || symtab->sh_link >= header->e_shnum || symtab->sh_entsize != sizeof(Elf64_Sym))
    return false;
  auto* symbols = reinterpret_cast<const Elf64_Sym*>(image.data(*symtab));
  const char* names = reinterpret_cast<const char*>(image.data(image.sections[symtab->sh_link]));
  size_t symbol_count = symtab->sh_size / sizeof(Elf64_Sym);

  // Kernels are the global functions; their index in .symtab keys the
  // per-kernel entries of the image-wide .nv.info.
  std::vector<size_t> index_of;
  for (size_t i = 0; i < symbol_count; ++i) {
    if (ELF64_ST_TYPE(symbols[i].st_info) != STT_FUNC || ELF64_ST_BIND(symbols[i].st_info) != STB_GLOBAL) continue;
    KernelResources k;
    k.name = names + symbols[i].st_name;
    k.static_shared = section_size(image, ".nv.shared." + k.name);
    if (const Elf64_Shdr* info = image.section((".nv.info." + k.name).c_str())) {
      each_attribute(image, *info, [&](uint8_t attribute, const uint8_t* p, uint16_t size) {
        if ((attribute == kAttrRequiredThreads || attribute == kAttrMaxThreads) && size >= 12) {
          int threads = static_cast<int>(word(p, 0) * word(p, 1) * word(p, 2));
          (attribute == kAttrRequiredThreads ? k.required_threads : k.max_threads) = threads;
        }
      });
    }
    kernels->push_back(k);
    index_of.push_back(i);
  }
  if (const Elf64_Shdr* info = image.section(".nv.info")) {
    each_attribute(image, *info, [&](uint8_t attribute, const uint8_t* p, uint16_t size) {
      if (size < 8 || (attribute != kAttrRegisterCount && attribute != kAttrFrameSize)) return;
      for (size_t n = 0; n < index_of.size(); ++n) {
        if (index_of[n] != word(p, 0)) continue;
        int value = static_cast<int>(word(p, 1));
        (attribute == kAttrRegisterCount ? (*kernels)[n].registers : (*kernels)[n].local_bytes) = value;
      }
    });
  }
  return true;
}

int max_threads_per_block(const KernelResources& k) {
  constexpr int kRegistersPerBlock = 65536, kUnit = 256, kWarp = 32, kMostThreads = 1024;
  int threads = kMostThreads;
  if (k.registers > 0) {
    int per_warp = (k.registers * kWarp + kUnit - 1) / kUnit * kUnit;
    int by_registers = kRegistersPerBlock / per_warp * kWarp;
    if (by_registers < threads) threads = by_registers;
  }
  if (k.max_threads > 0 && k.max_threads < threads) threads = k.max_threads;
  if (k.required_threads > 0 && k.required_threads < threads) threads = k.required_threads;
  return threads;
}

}  // namespace vgpu
