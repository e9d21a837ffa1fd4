// Decoding EVENTS chunks (docs/format.md, "Events") into the loaded capture's
// columns: python/allocscope/capture/codec.py's EventBlock, in one pass per column
// and straight into the final arrays (no per-chunk arrays to join).
// EventBlock stays the reference (tests/unit/test_native_decode.py holds the
// two to the same results and the same refusals).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace allocscope::decode {

// A payload that does not follow the format. The message says what is wrong.
struct FormatError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Where one chunk's events go: each pointer at the chunk's first row, room
// for `capacity` rows.
struct Out {
  size_t capacity = 0;
  uint8_t* kind = nullptr;  // raw: the flag bits stay (capture/reader.py splits them)
  int64_t* time = nullptr;
  uint16_t* thread = nullptr;
  uint16_t* stream = nullptr;
  uint64_t* addr = nullptr;
  uint64_t* size = nullptr;
  uint64_t* block = nullptr;
  uint32_t* stack = nullptr;
  uint64_t* arg = nullptr;
  uint32_t* op = nullptr;  // zeros for format 1 (no op column)
};

struct Decoded {
  size_t count = 0;
  uint64_t first_seq = 0;
};

// Decodes one EVENTS payload of format `version` (1 or 2). Throws
// FormatError where EventBlock raises one, and when the chunk holds more
// than out.capacity events.
Decoded events(const uint8_t* payload, size_t length, int version, const Out& out);

}  // namespace allocscope::decode
