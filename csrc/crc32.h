#pragma once

#include <cstddef>
#include <cstdint>

namespace allocscope {

// CRC-32 with the zlib polynomial, so Python's zlib.crc32 checks it. Pass the
// previous value to continue a running checksum.
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

}  // namespace allocscope
