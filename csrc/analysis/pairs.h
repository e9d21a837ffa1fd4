// Pairing a capture's frees with their allocations by address, in event
// order: python/allocscope/attribution/lifetimes.py (lifetimes) and
// allocator/recorded.py (deferred_frees) in one pass with a hash map instead
// of a sort. Their numpy versions stay the reference
// (tests/unit/test_native_pairs.py compares them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace allocscope::pairs {

struct Lifetimes {
  std::vector<int64_t> alloc, free;  // each ALLOC (event order) and its FREE (-1: none)
  std::vector<int64_t> unmatched;    // FREEs of memory no recorded ALLOC made
  std::vector<int64_t> doubles;      // ALLOCs of an address whose previous ALLOC was not freed
};

Lifetimes lifetimes(size_t n, const uint8_t* kind, const uint64_t* addr);

// Per tensor label (events label_idx, in increasing order): the position,
// in ALLOC order, of the ALLOC open at its address when it was written;
// kLabelClosed where the last ALLOC there was freed before it; kLabelNone
// where no ALLOC there came before it (memory from before recording, if
// any). attribution/rows.py's join_labels (numpy) is the reference.
inline constexpr int64_t kLabelClosed = -1;
inline constexpr int64_t kLabelNone = -2;
std::vector<int64_t> label_allocs(size_t n, const uint8_t* kind, const uint64_t* addr, size_t labels,
                                  const int64_t* label_idx);

// The tensor labels that decide their rows' meaning. Labels in event order,
// each with its row (>= 0) and priority (lower wins): a winner beats every
// earlier label of its row (the first of equal priority stays); `last` marks
// each row's final winner. attribution/categories.py's _label_winners
// (numpy) is the reference.
struct Winners {
  std::vector<int64_t> winners;  // positions among the labels, in event order
  std::vector<uint8_t> last;     // per winner
};
Winners label_winners(size_t n, const int64_t* row, const int64_t* priority);

// Per event: a FREE whose block waited for another stream (a FREE_COMPLETED
// follows it at its address), or that is still pending at the end (the last
// event at an address in pending_at_end).
std::vector<uint8_t> deferred_frees(size_t n, const uint8_t* kind, const uint64_t* addr,
                                    const std::unordered_set<uint64_t>& pending_at_end);

}  // namespace allocscope::pairs
