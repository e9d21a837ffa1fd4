// The allocscope capture file format: the one place that defines it.
//
// docs/format.md is the byte-for-byte specification;
// python/allocscope/capture/format.py mirrors these numbers and
// tests/unit/test_format_constants.py checks that the two agree. The rules
// live beside them: the chunk checksum (chunk.h), the columns' encodings
// (columns.h). Any change that an older reader cannot skip bumps
// kFormatVersion.
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

// Each table is written once, as an X-macro list: X(C++ name, name in the
// spec and in Python, value). The enums below and the table the extension
// gives Python (format_constants(), checked against capture/format.py by
// tests/unit/test_format_constants.py) are both made from it.
#define ALLOCSCOPE_CHUNK_TYPES(X)                                        \
  X(kChunkMetadata, METADATA, 1) /* UTF-8 JSON object */                 \
  X(kChunkStrings, STRINGS, 2)   /* new entries of the string table */   \
  X(kChunkFrames, FRAMES, 3)     /* new entries of the frame table */    \
  X(kChunkStacks, STACKS, 4)     /* new nodes of the stack tree */       \
  X(kChunkThreads, THREADS, 5)   /* new entries of the thread table */   \
  X(kChunkStreams, STREAMS, 6)   /* new entries of the stream table */   \
  X(kChunkEvents, EVENTS, 7)     /* a block of events, columnar */       \
  X(kChunkBaseline, BASELINE, 8) /* UTF-8 JSON object: allocator snapshot + device memory */ \
  X(kChunkFooter, FOOTER, 9)     /* UTF-8 JSON object: totals; present iff stopped cleanly */ \
  X(kChunkCheckpoint, CHECKPOINT, 10) /* the live set, its labels and scopes, and a baseline */

// Event kinds. The high bit (kViaAllocator) marks an ALLOC or FREE that was
// seen only through the native allocator's trace hook: memory that bypassed
// the wrapper (blocks allocated before recording, allocator-internal
// allocations, callers holding a stale allocator pointer). Those carry no stack.
// 17..63: annotations written by allocscope.watch (python/allocscope/recording/
// watcher.py); arg = string id, addr/size = payload. Readers keep unknown
// annotation kinds.
#define ALLOCSCOPE_EVENT_KINDS(X)                                                                             \
  X(kAlloc, ALLOC, 1)                   /* addr, size=requested, block (0=unknown), stack, arg=ns in allocator */ \
  X(kFree, FREE, 2)                     /* addr, size (0 when the wrapper saw it: see the ALLOC) */              \
  X(kFreeCompleted, FREE_COMPLETED, 3)  /* deferred free completed (cross-stream use); addr, size */             \
  X(kSegmentAlloc, SEGMENT_ALLOC, 4)    /* addr, size = segment size */                                        \
  X(kSegmentFree, SEGMENT_FREE, 5)      /* addr, size */                                                       \
  X(kSegmentMap, SEGMENT_MAP, 6)        /* addr, size (expandable segments) */                                 \
  X(kSegmentUnmap, SEGMENT_UNMAP, 7)    /* addr, size */                                                       \
  X(kOom, OOM, 8)                       /* size=requested, block=rounded, arg=device free bytes, stack */      \
  X(kEmptyCache, EMPTY_CACHE, 9)        /* emptyCache() called; arg = mempool id (first) */                    \
  X(kSetFraction, SET_FRACTION, 10)     /* setMemoryFraction; arg = fraction * 1e9 */                          \
  X(kSnapshot, SNAPSHOT, 11)            /* the allocator took a snapshot (baselines point here) */             \
  /* Private memory pools (CUDA graph captures, torch.cuda.MemPool); arg/block = */                            \
  /* the pool id's two halves, stream names the device. */                                                    \
  X(kPoolBegin, POOL_BEGIN, 12)         /* beginAllocateToPool; addr 1: createOrIncrefPool (no capture) */     \
  X(kPoolEnd, POOL_END, 13)             /* endAllocateToPool */                                                \
  X(kPoolRelease, POOL_RELEASE, 14)     /* releasePool */                                                      \
  X(kPoolAlloc, POOL_ALLOC, 15)         /* the next ALLOC at addr (or OOM: addr 0) went to this private pool; size 1: placed there by a checkpoint restore */ \
  X(kMark, MARK, 16)                    /* arg = string id of the label, stack */                              \
  X(kModuleEnter, MODULE_ENTER, 17)     /* arg = module name; addr = kModule* flags */                         \
  X(kModuleExit, MODULE_EXIT, 18)       /* as kModuleEnter; size = bytes of a leaf's new outputs */            \
  X(kPhase, PHASE, 19)                  /* arg = phase name; addr = optimizer steps completed */               \
  X(kWatch, WATCH, 20)                  /* arg = JSON summary of a watched model and optimizer */              \
  X(kParameter, PARAMETER, 21)          /* tensor labels: arg = name, addr = storage pointer, */               \
  X(kBuffer, BUFFER, 22)                /*   size = storage bytes */                                           \
  X(kGradient, GRADIENT, 23)                                                                                   \
  X(kOptimizerState, OPTIMIZER_STATE, 24)                                                                      \
  X(kActivation, ACTIVATION, 25)        /* arg = the module that saved it for backward */                      \
  X(kInput, INPUT, 26)

#define ALLOCSCOPE_ENUMERATOR(cpp, name, value) cpp = value,

enum ChunkType : uint8_t { ALLOCSCOPE_CHUNK_TYPES(ALLOCSCOPE_ENUMERATOR) };

enum EventKind : uint8_t {
  ALLOCSCOPE_EVENT_KINDS(ALLOCSCOPE_ENUMERATOR)
  kFirstAnnotation = 16,
  kLastAnnotation = 63,
};

#undef ALLOCSCOPE_ENUMERATOR

// MODULE_ENTER/EXIT's addr bits.
inline constexpr uint64_t kModuleBackward = 1;  // a module's backward scope, written from autograd's hooks
inline constexpr uint64_t kModuleLeaf = 2;      // a module with no children
inline constexpr uint64_t kModuleRestored = 4;  // written by a checkpoint (docs/format.md, CHECKPOINT)

inline constexpr uint8_t kViaAllocator = 0x80;
inline constexpr uint8_t kKindMask = 0x7f;

// Columns of an EVENTS chunk, in the order they are stored (format 1 stops
// before op).
#define ALLOCSCOPE_COLUMNS(X)                                                               \
  X(kColKind, kind, 0)     /* stored raw (one byte per event), so count <= payload size */ \
  X(kColTime, time, 1)     /* zigzag delta of monotonic ns from the previous event */      \
  X(kColThread, thread, 2) /* index into the thread table */                              \
  X(kColStream, stream, 3) /* index into the stream table (device + stream) */            \
  X(kColAddr, addr, 4)     /* zigzag delta of (addr >> shift) from the previous event */  \
  X(kColSize, size, 5)                                                                     \
  X(kColBlock, block, 6)                                                                   \
  X(kColStack, stack, 7)   /* node id in the stack tree; 0 = no Python stack */           \
  X(kColArg, arg, 8)                                                                       \
  X(kColOp, op, 9)         /* format 2: string id of the op's name; 0 = none */

#define ALLOCSCOPE_ENUMERATOR(cpp, name, value) cpp = value,
enum Column : uint8_t { ALLOCSCOPE_COLUMNS(ALLOCSCOPE_ENUMERATOR) kNumColumns = 10 };
#undef ALLOCSCOPE_ENUMERATOR

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
