// See pairs.h. A map from address to the state of its last event stands in
// for the numpy versions' sort by (address, sequence).
#include "pairs.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "format/format.h"

namespace allocscope::pairs {

Lifetimes lifetimes(size_t n, const uint8_t* kind, const uint64_t* addr) {
  Lifetimes out;
  std::unordered_map<uint64_t, int64_t> last_alloc;  // address -> its open ALLOC's position in out.alloc, or -1
  for (size_t i = 0; i < n; ++i) {
    int k = kind[i];
    if (k != format::kAlloc && k != format::kFree) continue;
    auto [it, fresh] = last_alloc.try_emplace(addr[i], -1);
    if (k == format::kAlloc) {
      if (!fresh && it->second >= 0) out.doubles.push_back(static_cast<int64_t>(i));
      it->second = static_cast<int64_t>(out.alloc.size());
      out.alloc.push_back(static_cast<int64_t>(i));
      out.free.push_back(-1);
    } else {
      if (it->second >= 0) {
        out.free[static_cast<size_t>(it->second)] = static_cast<int64_t>(i);
      } else {
        out.unmatched.push_back(static_cast<int64_t>(i));
      }
      it->second = -1;
    }
  }
  return out;
}

std::vector<int64_t> label_allocs(size_t n, const uint8_t* kind, const uint64_t* addr, size_t labels,
                                  const int64_t* label_idx) {
  std::vector<int64_t> out(labels, kLabelNone);
  std::unordered_map<uint64_t, int64_t> state;  // address -> its open ALLOC's position, or kLabelClosed
  int64_t position = 0;
  size_t j = 0;
  for (size_t i = 0; i < n && j < labels; ++i) {
    int k = kind[i];
    if (k == format::kAlloc) {
      state[addr[i]] = position++;
    } else if (k == format::kFree) {
      auto it = state.find(addr[i]);
      if (it != state.end()) it->second = kLabelClosed;
    }
    for (; j < labels && label_idx[j] == static_cast<int64_t>(i); ++j) {
      auto it = state.find(addr[i]);
      if (it != state.end()) out[j] = it->second;
    }
  }
  return out;
}

Winners label_winners(size_t n, const int64_t* row, const int64_t* priority) {
  Winners out;
  int64_t rows = 0;
  for (size_t j = 0; j < n; ++j) rows = std::max(rows, row[j] + 1);
  std::vector<int64_t> best(static_cast<size_t>(rows), std::numeric_limits<int64_t>::max());
  std::vector<int64_t> at(static_cast<size_t>(rows), -1);  // the row's current winner, among out.winners
  for (size_t j = 0; j < n; ++j) {
    size_t r = static_cast<size_t>(row[j]);
    if (priority[j] >= best[r]) continue;
    best[r] = priority[j];
    if (at[r] >= 0) out.last[static_cast<size_t>(at[r])] = 0;
    at[r] = static_cast<int64_t>(out.winners.size());
    out.winners.push_back(static_cast<int64_t>(j));
    out.last.push_back(1);
  }
  return out;
}

std::vector<uint8_t> deferred_frees(size_t n, const uint8_t* kind, const uint64_t* addr,
                                    const std::unordered_set<uint64_t>& pending_at_end) {
  std::vector<uint8_t> out(n, 0);
  std::unordered_map<uint64_t, int64_t> last_free;  // address -> its last event if a FREE, else -1
  for (size_t i = 0; i < n; ++i) {
    int k = kind[i];
    if (k != format::kAlloc && k != format::kFree && k != format::kFreeCompleted) continue;
    int64_t& last = last_free.try_emplace(addr[i], -1).first->second;
    if (k == format::kFreeCompleted && last >= 0) out[static_cast<size_t>(last)] = 1;
    last = k == format::kFree ? static_cast<int64_t>(i) : -1;
  }
  if (!pending_at_end.empty())
    for (const auto& [a, last] : last_free)
      if (last >= 0 && pending_at_end.count(a)) out[static_cast<size_t>(last)] = 1;
  return out;
}

}  // namespace allocscope::pairs
