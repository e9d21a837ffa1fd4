#include "decode.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "format/format.h"

namespace allocscope::decode {
namespace {

using format::kEncConst;
using format::kEncDense;
using format::kEncRaw;
using format::kEncSparse;

struct Reader {
  const uint8_t* data;
  size_t length;
  size_t pos = 0;

  uint64_t varint(const char* past_end = "varint runs past the end of its chunk") {
    uint64_t value = 0;
    for (int shift = 0;; shift += 7) {
      if (pos >= length) throw FormatError(past_end);
      uint8_t b = data[pos++];
      if (shift == 63 && b > 1) throw FormatError("varint does not fit in 64 bits");
      value |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (b < 0x80) return value;
      if (shift + 7 > 63) throw FormatError("varint longer than 10 bytes");
    }
  }
};

// Exactly `count` varints filling buf[0, n) exactly, into out (as
// capture/codec.py's decode_varints: the count of terminating bytes is checked first).
void varints(const uint8_t* buf, size_t n, size_t count, uint64_t* out) {
  if (count == 0) {
    if (n != 0) throw FormatError("bytes left after the last varint");
    return;
  }
  if (n == 0) throw FormatError("missing varints");
  size_t ends = 0;
  for (size_t i = 0; i < n; ++i) ends += buf[i] < 0x80;
  if (ends != count || buf[n - 1] >= 0x80)
    throw FormatError("expected " + std::to_string(count) + " varints, found " + std::to_string(ends));
  size_t k = 0;
  uint64_t value = 0;
  int shift = 0;
  for (size_t i = 0; i < n; ++i) {
    uint8_t b = buf[i];
    if (shift > 63 || (shift == 63 && b > 1)) throw FormatError("varint does not fit in 64 bits");
    value |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (b < 0x80) {
      out[k++] = value;
      value = 0;
      shift = 0;
    } else {
      shift += 7;
    }
  }
}

// One column of `count` values at r.pos, into out.
void column(Reader& r, size_t count, uint64_t* out, std::vector<uint64_t>& scratch) {
  if (r.pos >= r.length) throw FormatError("column missing");
  uint8_t enc = r.data[r.pos++];
  if (enc == kEncConst) {
    uint64_t v = r.varint();
    for (size_t i = 0; i < count; ++i) out[i] = v;
    return;
  }
  if (enc == kEncDense) {
    uint64_t n = r.varint();
    if (n > r.length - r.pos) throw FormatError("column runs past the end of its chunk");
    varints(r.data + r.pos, n, count, out);
    r.pos += n;
    return;
  }
  if (enc == kEncSparse) {
    uint64_t k = r.varint();
    uint64_t n = r.varint();
    if (k > count || n > r.length - r.pos) throw FormatError("sparse column is inconsistent");
    scratch.resize(2 * k);
    varints(r.data + r.pos, n, 2 * k, scratch.data());
    r.pos += n;
    std::memset(out, 0, count * sizeof(uint64_t));
    uint64_t index = 0;
    for (uint64_t j = 0; j < k; ++j) {
      uint64_t gap = scratch[j];
      if (gap >= count || (j > 0 && gap == 0)) throw FormatError("sparse column indices are not increasing");
      index += gap;
      if (index >= count) throw FormatError("sparse column index out of range");
      out[index] = scratch[k + j];
    }
    return;
  }
  throw FormatError("unknown column encoding " + std::to_string(enc));
}

int64_t unzigzag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

template <typename T>
void narrow(const std::vector<uint64_t>& values, size_t count, uint64_t limit, const char* name, T* out) {
  for (size_t i = 0; i < count; ++i) {
    if (values[i] >= limit) throw FormatError(std::string(name) + " index out of range");
    out[i] = static_cast<T>(values[i]);
  }
}

}  // namespace

Decoded events(const uint8_t* payload, size_t length, int version, const Out& out) {
  Reader r{payload, length};
  Decoded d;
  uint64_t count = r.varint();
  if (count == 0 || count > length) throw FormatError("event count is inconsistent with the chunk size");
  if (count > out.capacity) throw FormatError("the chunk holds more events than its header said");
  d.count = count;
  d.first_seq = r.varint();
  int64_t base_time = unzigzag(r.varint());
  if (r.pos + 2 + count > length) throw FormatError("events chunk is too short");
  uint8_t shift = r.data[r.pos++];
  if (shift > 63) throw FormatError("address shift out of range");
  if (r.data[r.pos++] != kEncRaw) throw FormatError("the kind column must be stored raw");
  std::memcpy(out.kind, r.data + r.pos, count);
  r.pos += count;

  std::vector<uint64_t> values(count), scratch;
  // time: deltas from base_time (wrapping, as numpy's int64 cumsum)
  column(r, count, values.data(), scratch);
  uint64_t t = static_cast<uint64_t>(base_time);
  // numpy adds the base after the cumsum; in two's complement the order does not matter.
  for (size_t i = 0; i < count; ++i) out.time[i] = static_cast<int64_t>(t += static_cast<uint64_t>(unzigzag(values[i])));
  column(r, count, values.data(), scratch);
  std::vector<uint64_t> thread(values);
  column(r, count, values.data(), scratch);
  std::vector<uint64_t> stream(values);
  column(r, count, values.data(), scratch);
  uint64_t a = 0;
  for (size_t i = 0; i < count; ++i) out.addr[i] = (a += static_cast<uint64_t>(unzigzag(values[i]))) << shift;
  column(r, count, out.size, scratch);
  column(r, count, out.block, scratch);
  column(r, count, values.data(), scratch);
  std::vector<uint64_t> stack(values);
  column(r, count, out.arg, scratch);
  if (version >= 2) {
    column(r, count, values.data(), scratch);
  } else {
    std::fill(values.begin(), values.end(), 0);
  }
  if (r.pos != length) throw FormatError("bytes left at the end of an events chunk");
  // Range checks in EventBlock's order, after the whole chunk parsed.
  narrow(thread, count, uint64_t{1} << 16, "thread", out.thread);
  narrow(stream, count, uint64_t{1} << 16, "stream", out.stream);
  narrow(stack, count, uint64_t{1} << 32, "stack", out.stack);
  narrow(values, count, uint64_t{1} << 32, "op", out.op);
  return d;
}

}  // namespace allocscope::decode
