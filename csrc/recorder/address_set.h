// A set of non-zero addresses emptied in O(1): open addressing, each slot
// tagged with the generation it was written in, clear() starts a new one.
// For the saved-tensor labeler's storages labelled in a forward (saved.h):
// an std::unordered_set allocated a node per saved tensor and freed them all
// at every forward, which cost about as much as the label itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace allocscope {

class AddressSet {
 public:
  // Adds `address` (non-zero); whether it was not in the set.
  bool insert(uint64_t address) {
    if ((used_ + 1) * 2 > slots_.size()) grow();
    size_t mask = slots_.size() - 1;
    for (size_t i = slot_of(address, mask);; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.generation != generation_) {
        s = Slot{address, generation_};
        ++used_;
        return true;
      }
      if (s.address == address) return false;
    }
  }

  void clear() {
    ++generation_;
    used_ = 0;
  }

 private:
  struct Slot {
    uint64_t address = 0;
    uint64_t generation = 0;  // 0: never written (generations start at 1)
  };

  static size_t slot_of(uint64_t address, size_t mask) {
    return static_cast<size_t>((address * 0x9E3779B97F4A7C15ull) >> 32) & mask;
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.generation != generation_) continue;
      size_t i = slot_of(s.address, mask);
      while (slots_[i].generation == generation_) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_ = std::vector<Slot>(256);
  uint64_t generation_ = 1;
  size_t used_ = 0;
};

}  // namespace allocscope
