// The recorder: one per process, leaked on purpose (deleters of tensors made
// while recording may run during interpreter teardown, long after a static
// would have been destroyed).
//
// Events go into a bounded multi-producer ring; the ring position is the
// event's sequence number. A writer thread drains the ring, encodes events and
// new table entries into chunks (writer.h) and appends them to the file. The
// writer never takes the GIL or an allocator lock, so a producer may wait for
// ring space while holding either.
//
// A thread that records anything first enters (EmitScope): it marks itself
// busy, then checks that recording is active. stop() clears `active` and then
// waits until no thread is busy, so no event is pushed after the writer's last
// drain (the busy/active pair is a Dekker handshake: both sides use seq_cst).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "format/format.h"
#include "stacks.h"
#include "tables.h"

namespace allocscope {

struct RawEvent {
  int64_t time_ns = 0;  // 0: stamped when pushed
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t block = 0;
  uint64_t arg = 0;
  uint32_t stack = 0;
  uint32_t op = 0;  // stack-tree node of the op chain (ops.h)
  uint16_t thread = 0;
  uint16_t stream = 0;
  uint8_t kind = 0;
};

class EventRing {
 public:
  static constexpr uint64_t kCapacity = uint64_t{1} << 16;

  EventRing();
  // Blocks (spinning, yielding) while the ring is full. Returns the event's
  // sequence number.
  uint64_t push(const RawEvent& ev);
  // Consumer only: copies published events in order into out; returns count.
  size_t drain(std::vector<RawEvent>* out, uint64_t* first_seq);
  uint64_t head() const { return head_.load(std::memory_order_acquire); }
  bool nearly_full() const;
  void reset();  // no producers or consumer running

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};  // pos + 1 once the event at pos is written
    RawEvent ev;
  };
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
};

struct StartOptions {
  std::string path;
  std::string metadata_json;
  bool python_stacks = true;
  bool ops = true;  // the op behind each allocation (ops.h)
  bool checkpoints = false;  // follow the live set, so that checkpoints can be written (checkpoint.h)
  // Catch SIGTERM also where it has a handler that is not Python's (the
  // caller knows Python's: signal.getsignal); recorder.cpp.
  bool sigterm_over_foreign = false;
  // A helper process's file (an Inductor compile worker's, a launcher's):
  // removed when the recording ends, however it ends, if it holds no memory
  // (no allocation, free, segment or OOM event; the caller knows the start
  // baseline held no segment).
  bool remove_if_unused = false;
};

struct StopSummary {
  uint64_t events = 0;
  uint64_t dropped = 0;  // events lost to write errors
  uint64_t bytes = 0;
  uint64_t stacks = 0;
  uint64_t stack_misses = 0;     // distinct stacks symbolized
  uint64_t stack_overflows = 0;  // stacks dropped: the tables were full
  std::string error;  // first write error, if any
  bool removed = false;  // the file held no memory and was removed (StartOptions::remove_if_unused)
};

class Writer;
class Checkpointer;
class EmitScope;

class Recorder {
 public:
  static Recorder& get();

  // Python-facing; the caller holds the GIL.
  void start(const StartOptions& options);  // throws std::runtime_error
  StopSummary stop(const std::string& reason);
  // Starts recording ops in a recording that runs without them (record(ops=None)
  // does at its first watch()): ops that are running already are not part of
  // any allocation's chain. Returns whether it started them. Caller holds the GIL.
  bool start_ops();
  bool active() const { return active_.load(std::memory_order_relaxed); }
  std::string walker() const { return walker_; }
  uint64_t next_seq() const { return ring_.head(); }
  // Changes with every recording: ids cached by threads are of one.
  uint64_t generation() const { return generation_.load(std::memory_order_relaxed); }
  // Queues a JSON chunk (baseline) for the writer.
  void add_json_chunk(uint8_t type, std::string json);
  // Interns `label` and records an annotation event (kMark..kLastAnnotation).
  // Returns false when not recording.
  bool annotate(uint8_t kind, const std::string& label, uint64_t addr, uint64_t size, bool with_stack);
  // The same for a label interned already (intern()), without a stack: the
  // saved-tensor hook's ACTIVATION labels (saved.h). Not for module scopes.
  bool annotate_interned(uint8_t kind, uint32_t label, uint64_t addr, uint64_t size);
  // A watched module's forward scope begins or ends (kModuleEnter/Exit with
  // `flags`), its name interned already: module_hooks.h.
  bool module_scope(bool enter, uint32_t label, uint64_t flags, uint64_t size);
  // A string's id in this recording's tables (InternTables::kFull when full).
  uint32_t intern(const std::string& s);
  // Checkpoints (checkpoint.h): arm one, then take the baseline (which on
  // CUDA makes the SNAPSHOT event the point waits for, at_snapshot) and
  // hand it over ("" when none could be taken). arm returns the sequence
  // number the point is at or after, or UINT64_MAX when this recording
  // writes no checkpoints.
  uint64_t arm_checkpoint(bool at_snapshot);
  void checkpoint_baseline(std::string json);
  // Wakes the writer to write everything pushed so far (e.g. before an OOM
  // propagates and the process possibly dies).
  void request_flush();

  // Hot path, any thread.
  ThreadEntry* enter(uint16_t* thread_index);
  uint64_t push(RawEvent& ev) {
    uint64_t seq = ring_.push(ev);
    maybe_wake();
    return seq;
  }
  uint32_t capture_stack() { return python_stacks_ ? stacks_.capture() : 0; }
  uint16_t stream_index(int32_t device, uint64_t handle) {
    return streams_.index(generation_.load(std::memory_order_relaxed), device, handle);
  }

  // Used by the writer thread.
  InternTables& tables() { return tables_; }
  ThreadTable& threads() { return threads_; }
  StreamTable& streams() { return streams_; }

 private:
  Recorder();
  // annotate() once the label is interned.
  bool annotate_id(EmitScope& scope, uint8_t kind, uint32_t id, uint64_t addr, uint64_t size, bool with_stack);
  void writer_main();
  void write_batch(const std::vector<RawEvent>& batch, uint64_t first_seq);
  void maybe_wake();
  void wait_until_idle(int64_t timeout_ns);
  void on_sigterm_in_writer();
  static void atfork_child();

  std::atomic<bool> active_{false};
  std::atomic<uint64_t> generation_{0};
  bool python_stacks_ = true;
  std::string walker_;
  std::string path_;

  EventRing ring_;
  InternTables tables_;
  ThreadTable threads_;
  StreamTable streams_;
  StackInterner stacks_{&tables_};

  std::unique_ptr<Writer> writer_;
  std::thread writer_thread_;
  std::mutex wake_mu_;
  std::mutex ops_mu_;  // start_ops() against stop()
  std::condition_variable wake_cv_;
  bool wake_ = false;
  bool stop_requested_ = false;
  std::atomic<bool> wake_pending_{false};
  std::vector<std::pair<uint8_t, std::string>> pending_chunks_;  // under wake_mu_
  std::unique_ptr<Checkpointer> checkpointer_;  // the writer thread's; null: no checkpoints
  std::vector<std::pair<uint64_t, bool>> pending_arms_;          // under wake_mu_
  std::vector<std::string> pending_checkpoint_baselines_;         // under wake_mu_
  std::string stop_reason_;                                      // under wake_mu_
  bool sigterm_installed_ = false;
  bool remove_if_unused_ = false;
  bool memory_written_ = false;  // the writer's: a memory event was written
  std::atomic<bool> removed_{false};
  pid_t owner_pid_ = 0;  // the process that started the recording
  bool forked_while_recording_ = false;  // set in a child forked while recording
};

// RAII participation in recording; see the class comment of Recorder.
class EmitScope {
 public:
  EmitScope() : entry_(Recorder::get().enter(&thread_)) {}
  ~EmitScope() {
    if (entry_ != nullptr) entry_->busy.fetch_sub(1, std::memory_order_seq_cst);
  }
  EmitScope(const EmitScope&) = delete;
  EmitScope& operator=(const EmitScope&) = delete;

  explicit operator bool() const { return entry_ != nullptr; }
  // Returns the event's sequence number.
  uint64_t push(RawEvent& ev) {
    ev.thread = thread_;
    return Recorder::get().push(ev);
  }

 private:
  // Declared (so initialized) before entry_: enter() writes it.
  uint16_t thread_ = 0;
  ThreadEntry* entry_;
};

}  // namespace allocscope
