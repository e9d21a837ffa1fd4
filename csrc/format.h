// The allocscope capture file format: the one place that defines it.
//
// docs/format.md is the byte-for-byte specification; python/allocscope/_format.py
// mirrors these numbers and tests/unit/test_format_constants.py checks that the
// two agree. Any change that an older reader cannot skip bumps kFormatVersion.
//
//   file    := header chunk*
//   header  := magic[8] u32 version u32 flags            (16 bytes, little endian)
//   chunk   := u8 type, u8 0, u16 0, u32 length, u32 crc, payload[length]
//              crc = CRC-32 (zlib polynomial) of type byte, length (4 bytes LE)
//              and payload, so a torn or flipped chunk is detected.
//
// A file ends with a FOOTER chunk when recording stopped cleanly; a crash leaves
// a valid prefix of whole chunks that readers load with a warning.
#pragma once

#include <cstdint>

namespace allocscope::format {

// \x89 catches 7-bit transfers, \r\n and \n catch newline translation.
inline constexpr char kMagic[8] = {'\x89', 'A', 'L', 'S', '\r', '\n', '\x1a', '\n'};
inline constexpr uint32_t kFormatVersion = 2;  // 2: the op column
inline constexpr uint32_t kHeaderSize = 16;
inline constexpr uint32_t kChunkHeaderSize = 12;

enum ChunkType : uint8_t {
  kChunkMetadata = 1,  // UTF-8 JSON object
  kChunkStrings = 2,   // new entries of the string table
  kChunkFrames = 3,    // new entries of the frame table
  kChunkStacks = 4,    // new nodes of the stack tree
  kChunkThreads = 5,   // new entries of the thread table
  kChunkStreams = 6,   // new entries of the stream table
  kChunkEvents = 7,    // a block of events, columnar
  kChunkBaseline = 8,  // UTF-8 JSON object: allocator snapshot + device memory
  kChunkFooter = 9,    // UTF-8 JSON object: totals; present iff stopped cleanly
};

// Event kinds. The high bit (kViaAllocator) marks an ALLOC or FREE that was
// seen only through the native allocator's trace hook: memory that bypassed
// the wrapper (blocks allocated before recording, allocator-internal
// allocations, callers holding a stale allocator pointer). Those carry no stack.
enum EventKind : uint8_t {
  kAlloc = 1,           // addr, size=requested, block (0=unknown), stack, arg=ns in allocator
  kFree = 2,            // addr, size (0 when the wrapper saw it: see the ALLOC)
  kFreeCompleted = 3,   // deferred free completed (cross-stream use); addr, size
  kSegmentAlloc = 4,    // addr, size = segment size
  kSegmentFree = 5,     // addr, size
  kSegmentMap = 6,      // addr, size (expandable segments)
  kSegmentUnmap = 7,    // addr, size
  kOom = 8,             // size=requested, block=rounded, arg=device free bytes, stack
  kEmptyCache = 9,      // emptyCache() called; arg = mempool id (first)
  kSetFraction = 10,    // setMemoryFraction; arg = fraction * 1e9
  kSnapshot = 11,       // the allocator took a snapshot (baselines point here)
  // Private memory pools (CUDA graph captures, torch.cuda.MemPool); arg/block =
  // the pool id's two halves, stream names the device.
  kPoolBegin = 12,      // beginAllocateToPool; addr 1: createOrIncrefPool (no capture)
  kPoolEnd = 13,        // endAllocateToPool
  kPoolRelease = 14,    // releasePool
  kPoolAlloc = 15,      // the next ALLOC at addr (or OOM: addr 0) went to this private pool
  kMark = 16,           // arg = string id of the label, stack
  // 17..63: annotations written by allocscope.watch (python/allocscope/watcher.py);
  // arg = string id, addr/size = payload. Readers keep unknown annotation kinds.
  kModuleEnter = 17,    // arg = module name; addr bit 0 backward, bit 1 leaf
  kModuleExit = 18,     // as kModuleEnter; size = bytes of a leaf's new outputs
  kPhase = 19,          // arg = phase name; addr = optimizer steps completed
  kWatch = 20,          // arg = JSON summary of a watched model and optimizer
  kParameter = 21,      // tensor labels: arg = name, addr = storage pointer,
  kBuffer = 22,         //   size = storage bytes
  kGradient = 23,
  kOptimizerState = 24,
  kActivation = 25,     // arg = the module that saved it for backward
  kInput = 26,
  kFirstAnnotation = 16,
  kLastAnnotation = 63,
};
inline constexpr uint8_t kViaAllocator = 0x80;
inline constexpr uint8_t kKindMask = 0x7f;

// Columns of an EVENTS chunk, in the order they are stored.
enum Column : uint8_t {
  kColKind = 0,    // stored raw (one byte per event), so count <= payload size
  kColTime = 1,    // zigzag delta of monotonic ns from the previous event
  kColThread = 2,  // index into the thread table
  kColStream = 3,  // index into the stream table (device + stream)
  kColAddr = 4,    // zigzag delta of (addr >> shift) from the previous event
  kColSize = 5,
  kColBlock = 6,
  kColStack = 7,   // node id in the stack tree; 0 = no Python stack
  kColArg = 8,
  kNumColumns = 9,
};

enum ColumnEncoding : uint8_t {
  kEncRaw = 0,     // count bytes (kind column only)
  kEncConst = 1,   // one varint: every event has this value
  kEncDense = 2,   // varint byte length, then count varints
  kEncSparse = 3,  // varint k, varint byte length, k index varints (first
                   // absolute, then gaps), k value varints; others are 0
};

// Reserved table entries.
inline constexpr uint32_t kNoStack = 0;    // stack node 0: the empty stack
inline constexpr uint16_t kNoStream = 0;   // stream 0: no device (marks)
inline constexpr uint16_t kCpuStream = 1;  // stream 1: the CPU (device -1)
inline constexpr uint16_t kOtherThread = 0;  // thread 0: table overflow

}  // namespace allocscope::format
