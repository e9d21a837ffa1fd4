#include "columns.h"

#include "format.h"

namespace allocscope::format {

void encode_column(const std::vector<uint64_t>& values, std::vector<uint8_t>* out) {
  const size_t n = values.size();
  bool constant = true;
  size_t dense = 0, nonzero = 0, sparse = 0;
  size_t last = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = values[i];
    constant = constant && v == values[0];
    dense += varint_size(v);
    if (v != 0) {
      sparse += varint_size(nonzero == 0 ? i : i - last) + varint_size(v);
      last = i;
      ++nonzero;
    }
  }
  if (constant) {
    out->push_back(kEncConst);
    put_varint(out, n ? values[0] : 0);
    return;
  }
  if (sparse + varint_size(nonzero) < dense) {
    out->push_back(kEncSparse);
    put_varint(out, nonzero);
    put_varint(out, sparse);
    size_t prev = 0;
    bool first = true;
    for (size_t i = 0; i < n; ++i) {
      if (values[i] == 0) continue;
      put_varint(out, first ? i : i - prev);
      prev = i;
      first = false;
    }
    for (size_t i = 0; i < n; ++i) {
      if (values[i] != 0) put_varint(out, values[i]);
    }
    return;
  }
  out->push_back(kEncDense);
  put_varint(out, dense);
  for (uint64_t v : values) put_varint(out, v);
}

}  // namespace allocscope::format
