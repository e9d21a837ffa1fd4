// A chunk's checksum (format.h, docs/format.md): CRC-32 with zlib's
// polynomial (Python's zlib.crc32 computes the same) of the chunk's type
// byte, its length (4 bytes, little endian) and its payload, so that a torn
// or flipped chunk is detected. python/allocscope/capture/format.py's
// chunk_crc is the same rule; the file's readers and writers use these two.
#pragma once

#include <cstddef>
#include <cstdint>

namespace allocscope::format {

// Pass the previous value to continue a running checksum.
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

uint32_t chunk_crc(uint8_t type, uint32_t length, const void* payload);

}  // namespace allocscope::format
