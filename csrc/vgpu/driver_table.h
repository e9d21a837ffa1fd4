// What libcuda.so.1 (driver.cpp) offers libcudart (cudart.cpp) beyond the
// driver API: the entry points cudaGetDriverEntryPointByVersion hands out.
#pragma once

extern "C" {
// The driver function named `symbol` (its base name, as c10 asks for it:
// "cuMemCreate", "cuMemGetAddressRange"), or nullptr.
__attribute__((visibility("default"))) void* vgpu_driver_entry_point(const char* symbol);
}
