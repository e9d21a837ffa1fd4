// One device state per virtual card, shared by the processes of a run
// (docs/vgpu.md, "Several processes"). When ALLOCSCOPE_VGPU_SHARED names a
// file, every process maps it and charges each card there as well as in its
// own accounting, so that cudaMemGetInfo shows what all processes use on a
// card, and a charge that would pass the card's total fails in whichever
// process asks, as on a real card. Without it, each process has its cards to
// itself.
#pragma once

#include <cstdint>

namespace vgpu {
namespace shared {

// Whether this process shares its cards (the file could be mapped).
bool enabled();
// Takes n bytes on device for this process, or returns false when all
// processes together would pass `total` (nothing is taken then).
// `force`: take them even past the total (a context is created regardless).
bool charge(int device, uint64_t n, uint64_t total, bool force);
void uncharge(int device, uint64_t n);
void note_context(int device);
// What every process of the run holds on the device.
uint64_t used(int device);
// What the other processes hold on it, and how many of them have a context there.
uint64_t others(int device, int* contexts);
// How many contexts any process of the run created on the device, ever
// (0 where the cards are not shared).
int contexts_created(int device);

}  // namespace shared
}  // namespace vgpu
