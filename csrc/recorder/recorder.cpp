#include "recorder.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>

#include "checkpoint.h"
#include "clock.h"
#include "backward_scopes.h"
#include "ops.h"
#include "pystack.h"
#include "writer.h"

namespace allocscope {

// ---------------------------------------------------------------------------
// EventRing

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

EventRing::EventRing() : slots_(new Slot[kCapacity]) {}

uint64_t EventRing::push(const RawEvent& ev) {
  uint64_t pos = head_.fetch_add(1, std::memory_order_acq_rel);
  // Full: wait for the writer. It needs neither the GIL nor any allocator
  // lock, so waiting here while holding them cannot deadlock.
  for (int spins = 0; pos - tail_.load(std::memory_order_acquire) >= kCapacity; ++spins) {
    if (spins < 64) {
      cpu_relax();
    } else {
      sched_yield();
    }
  }
  Slot& slot = slots_[pos & (kCapacity - 1)];
  slot.ev = ev;
  // Events without a time are stamped after claiming the slot, so that times
  // follow sequence order as closely as possible across threads.
  if (ev.time_ns == 0) slot.ev.time_ns = now_ns();
  slot.seq.store(pos + 1, std::memory_order_release);
  return pos;
}

size_t EventRing::drain(std::vector<RawEvent>* out, uint64_t* first_seq) {
  out->clear();
  uint64_t tail = tail_.load(std::memory_order_relaxed);
  *first_seq = tail;
  while (true) {
    Slot& slot = slots_[tail & (kCapacity - 1)];
    if (slot.seq.load(std::memory_order_acquire) != tail + 1) break;
    out->push_back(slot.ev);
    ++tail;
    // Free space in steps so that producers waiting on a full ring go on.
    if ((tail & 1023) == 0) tail_.store(tail, std::memory_order_release);
  }
  tail_.store(tail, std::memory_order_release);
  return out->size();
}

bool EventRing::nearly_full() const {
  return head_.load(std::memory_order_relaxed) - tail_.load(std::memory_order_relaxed) > kCapacity / 2;
}

void EventRing::reset() {
  for (uint64_t i = 0; i < kCapacity; ++i) slots_[i].seq.store(0, std::memory_order_relaxed);
  head_.store(0);
  tail_.store(0);
}

// ---------------------------------------------------------------------------
// Signals and fork

namespace {

// SIGTERM's default action kills the process without running Python cleanup.
// While recording, where SIGTERM has its default action or a handler that
// is not Python's (faulthandler.register(SIGTERM, chain=True), which
// Megatron-LM registers on import: it dumps the tracebacks, then the
// default action kills), the recorder catches it, finishes the file in the
// writer thread and then re-raises it with what was there before: the
// process goes as it would have, with a complete capture. A Python handler
// is left be: it raises SystemExit or calls os._exit, which finish the
// capture from Python (recording/exits.py), or it lets the program go on.
volatile sig_atomic_t g_sigterm = 0;
// While 1, a SIGTERM is the writer's to act on; else the handler acts as the
// one it replaced at once (a handler installed after ours that chains to it,
// as faulthandler's, still reaches it once the recording has stopped).
volatile sig_atomic_t g_writer_acts = 0;
struct sigaction g_old_sigterm;

// Async-signal-safe: what the handler replaced, then the signal again.
void raise_as_before() {
  sigaction(SIGTERM, &g_old_sigterm, nullptr);
  kill(getpid(), SIGTERM);
}

void on_sigterm(int) {
  if (!g_writer_acts) {
    raise_as_before();
    return;
  }
  g_sigterm = 1;
}

// over_foreign: also where SIGTERM has a handler that is not Python's.
bool install_sigterm_handler(bool over_foreign) {
  struct sigaction current;
  if (sigaction(SIGTERM, nullptr, &current) != 0) return false;
  bool is_default = !(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL;
  bool ignored = !(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN;
  if (!is_default && (!over_foreign || ignored)) return false;
  struct sigaction ours;
  std::memset(&ours, 0, sizeof(ours));
  ours.sa_handler = on_sigterm;
  sigemptyset(&ours.sa_mask);
  ours.sa_flags = SA_RESTART;
  g_old_sigterm = current;
  return sigaction(SIGTERM, &ours, nullptr) == 0;
}

void restore_sigterm_handler() {
  struct sigaction current;
  // Leave a handler someone installed after us alone.
  if (sigaction(SIGTERM, nullptr, &current) == 0 && current.sa_handler == on_sigterm) {
    sigaction(SIGTERM, &g_old_sigterm, nullptr);
  }
}

}  // namespace

void Recorder::atfork_child() {
  // The child has no writer thread: nothing may wait for one, and nothing
  // would act on a SIGTERM the handler caught. Its allocators stay wrapped but
  // pass through; stop() there is a no-op (owner_pid_ differs).
  Recorder& r = get();
  // The recorder's mutexes may have been held by threads that the child does
  // not have: it must not take them, so it cannot record.
  if (r.active_.load() || r.writer_thread_.joinable()) r.forked_while_recording_ = true;
  r.active_.store(false);
  g_writer_acts = 0;
  if (r.sigterm_installed_) restore_sigterm_handler();  // async-signal-safe
  r.sigterm_installed_ = false;
}

// ---------------------------------------------------------------------------
// Recorder

Recorder& Recorder::get() {
  static Recorder* instance = new Recorder();  // leaked: see the header
  return *instance;
}

Recorder::Recorder() {
  pthread_atfork(nullptr, nullptr, &Recorder::atfork_child);
  tables_.clear();
}

ThreadEntry* Recorder::enter(uint16_t* thread_index) {
  if (!active_.load(std::memory_order_relaxed)) return nullptr;  // cheap early out
  ThreadEntry* entry = threads_.current(generation_.load(std::memory_order_relaxed), thread_index);
  entry->busy.fetch_add(1, std::memory_order_seq_cst);
  if (!active_.load(std::memory_order_seq_cst)) {
    entry->busy.fetch_sub(1, std::memory_order_seq_cst);
    return nullptr;
  }
  return entry;
}

void Recorder::maybe_wake() {
  if (ring_.nearly_full() && !wake_pending_.exchange(true)) request_flush();
}

void Recorder::request_flush() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_ = true;
  }
  wake_cv_.notify_one();
}

namespace {

// Adds the recorder's own facts to the metadata object Python produced.
std::string with_recorder_info(const std::string& metadata, const std::string& walker) {
  size_t end = metadata.find_last_not_of(" \t\r\n");
  if (metadata.empty() || metadata[0] != '{' || end == std::string::npos || metadata[end] != '}') {
    throw std::invalid_argument("metadata must be a JSON object");
  }
  bool empty = metadata.find_first_not_of(" \t\r\n", 1) == end;
  std::string info = "\"recorder\": {\"stack_walker\": \"" + walker +
      "\", \"ring_capacity\": " + std::to_string(EventRing::kCapacity) +
      ", \"max_stack_depth\": " + std::to_string(StackInterner::kMaxDepth) + "}";
  return metadata.substr(0, end) + (empty ? "" : ", ") + info + "}";
}

}  // namespace

void Recorder::start(const StartOptions& options) {
  if (forked_while_recording_) {
    throw std::runtime_error(
        "cannot record in a process forked while its parent was recording (the recorder's locks may be held "
        "by threads the fork did not copy); start this process with the 'spawn' method, or record in the parent");
  }
  if (active_.load() || writer_thread_.joinable()) {
    throw std::runtime_error("allocscope is already recording to " + path_ + "; stop that recording first");
  }
  auto writer = std::make_unique<Writer>(options.path);  // throws

  generation_.fetch_add(1);
  ring_.reset();
  {
    std::lock_guard<std::mutex> lock(tables_.mu);
    tables_.clear();
  }
  threads_.clear();
  streams_.clear();
  python_stacks_ = options.python_stacks;
  walker_ = "none";
  if (python_stacks_) stacks_.reset(&walker_);
  writer->write_json(format::kChunkMetadata, with_recorder_info(options.metadata_json, walker_));
  if (!writer->error().empty()) throw std::runtime_error("cannot write " + options.path + ": " + writer->error());
  path_ = options.path;
  writer_ = std::move(writer);
  remove_if_unused_ = options.remove_if_unused;
  memory_written_ = false;
  removed_.store(false);
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_ = false;
    stop_requested_ = false;
    pending_chunks_.clear();
    pending_arms_.clear();
    pending_checkpoint_baselines_.clear();
    stop_reason_.clear();
  }
  checkpointer_ = options.checkpoints ? std::make_unique<Checkpointer>(&tables_) : nullptr;
  owner_pid_ = getpid();
  g_sigterm = 0;
  sigterm_installed_ = install_sigterm_handler(options.sigterm_over_foreign);
  g_writer_acts = 1;
  writer_thread_ = std::thread(&Recorder::writer_main, this);
  active_.store(true, std::memory_order_seq_cst);
  if (options.ops) ops::start(python_stacks_);
}

bool Recorder::start_ops() {
  // Under ops_mu_, which stop() holds while it removes the callback and
  // clears active_: a recording that stops never keeps a callback started here.
  std::lock_guard<std::mutex> lock(ops_mu_);
  if (!active() || ops::active()) return false;
  ops::start(python_stacks_);
  return true;
}

void Recorder::wait_until_idle(int64_t timeout_ns) {
  int64_t deadline = now_ns() + timeout_ns;
  uint32_t n = threads_.size();
  for (uint32_t i = 0; i < n; ++i) {
    while (threads_.entry(i).busy.load(std::memory_order_seq_cst) > 0) {
      if (timeout_ns > 0 && now_ns() > deadline) return;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

StopSummary Recorder::stop(const std::string& reason) {
  StopSummary summary;
  // In a forked child the thread object is a copy of the parent's: no thread.
  if (!writer_thread_.joinable() || getpid() != owner_pid_) return summary;
  {
    // Threads in the recorder may be waiting for the GIL (a new stack) or for
    // the writer (a full ring): release the GIL while waiting for them.
    pystack::GilRelease nogil;
    {
      std::lock_guard<std::mutex> lock(ops_mu_);
      ops::stop();
      active_.store(false, std::memory_order_seq_cst);
    }
    wait_until_idle(0);
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      stop_requested_ = true;
      if (stop_reason_.empty()) stop_reason_ = reason;
    }
    wake_cv_.notify_one();
    writer_thread_.join();
  }
  g_writer_acts = 0;
  if (sigterm_installed_) restore_sigterm_handler();
  sigterm_installed_ = false;
  // A SIGTERM caught while the writer was finishing: it goes on as it would have.
  if (g_sigterm) raise_as_before();
  summary.events = writer_->events_written();
  summary.dropped = writer_->events_dropped();
  summary.bytes = writer_->bytes();
  summary.error = writer_->error();
  summary.removed = removed_.load();
  summary.stacks = tables_.nodes.size() - 1;
  summary.stack_misses = stacks_.misses();
  summary.stack_overflows = stacks_.overflows();
  writer_.reset();
  if (python_stacks_) stacks_.release();
  return summary;
}

void Recorder::add_json_chunk(uint8_t type, std::string json) {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    pending_chunks_.emplace_back(type, std::move(json));
    wake_ = true;
  }
  wake_cv_.notify_one();
}

uint64_t Recorder::arm_checkpoint(bool at_snapshot) {
  std::lock_guard<std::mutex> lock(wake_mu_);
  if (!active_.load() || checkpointer_ == nullptr || stop_requested_) return UINT64_MAX;
  uint64_t seq = ring_.head();
  pending_arms_.emplace_back(seq, at_snapshot);
  return seq;
}

void Recorder::checkpoint_baseline(std::string json) {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    if (checkpointer_ == nullptr) return;
    pending_checkpoint_baselines_.push_back(std::move(json));
    wake_ = true;
  }
  wake_cv_.notify_one();
}

uint32_t Recorder::intern(const std::string& s) {
  std::lock_guard<std::mutex> lock(tables_.mu);
  return tables_.intern_string(s);
}

bool Recorder::annotate_interned(uint8_t kind, uint32_t label, uint64_t addr, uint64_t size) {
  EmitScope scope;
  if (!scope) return false;
  backward_scopes::sync(scope);
  RawEvent ev;
  ev.kind = kind;
  ev.addr = addr;
  ev.size = size;
  ev.arg = label == InternTables::kFull ? UINT32_MAX : label;
  ev.stack = 0;
  scope.push(ev);
  return true;
}

bool Recorder::annotate(uint8_t kind, const std::string& label, uint64_t addr, uint64_t size, bool with_stack) {
  if (kind < format::kFirstAnnotation || kind > format::kLastAnnotation) {
    throw std::invalid_argument("annotation kind must be in [16, 63]");
  }
  EmitScope scope;
  if (!scope) return false;
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(tables_.mu);
    id = tables_.intern_string(label);
  }
  return annotate_id(scope, kind, id, addr, size, with_stack);
}

bool Recorder::module_scope(bool enter, uint32_t label, uint64_t flags, uint64_t size) {
  EmitScope scope;
  if (!scope) return false;
  return annotate_id(scope, enter ? format::kModuleEnter : format::kModuleExit, label, flags, size, false);
}

bool Recorder::annotate_id(EmitScope& scope, uint8_t kind, uint32_t id, uint64_t addr, uint64_t size,
                           bool with_stack) {
  backward_scopes::sync(scope);
  if ((kind == format::kModuleEnter || kind == format::kModuleExit) && !(addr & format::kModuleBackward) &&
      id != InternTables::kFull) {
    // Forward module scopes: the module behind each autograd node (ops.h,
    // backward_scopes.h)
    if (kind == format::kModuleEnter) {
      ops::module_entered(id, (addr & format::kModuleLeaf) != 0);
    } else {
      ops::module_exited(id);
    }
    backward_scopes::forward_changed(ops::innermost_packed());
  }
  RawEvent ev;
  ev.kind = kind;
  ev.addr = addr;
  ev.size = size;
  ev.arg = id == InternTables::kFull ? UINT32_MAX : id;
  ev.stack = with_stack ? capture_stack() : 0;
  scope.push(ev);
  if (kind == format::kPhase) backward_scopes::phase_changed();  // (after it: a scope opened before is closed)
  return true;
}

void Recorder::on_sigterm_in_writer() {
  // The process is being terminated: stop recording, give threads in the
  // recorder a moment, and let the writer loop finish the file.
  active_.store(false, std::memory_order_seq_cst);
  wait_until_idle(200 * 1000 * 1000);
  std::lock_guard<std::mutex> lock(wake_mu_);
  stop_requested_ = true;
  stop_reason_ = "SIGTERM";
}

void Recorder::write_batch(const std::vector<RawEvent>& batch, uint64_t first_seq) {
  for (size_t i = 0; !memory_written_ && i < batch.size(); ++i) {
    uint8_t kind = batch[i].kind & ~format::kViaAllocator;
    memory_written_ = kind >= format::kAlloc && kind <= format::kOom;
  }
  if (checkpointer_ == nullptr) {
    writer_->write_events(batch, first_seq);
    return;
  }
  // Requests are taken after the drain: a SNAPSHOT event in the batch was
  // pushed after its point was armed, so the point is known here.
  std::vector<std::pair<uint64_t, bool>> arms;
  std::vector<std::string> baselines;
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    arms.swap(pending_arms_);
    baselines.swap(pending_checkpoint_baselines_);
  }
  for (const auto& [seq, at_snapshot] : arms) checkpointer_->arm(seq, at_snapshot);
  for (std::string& json : baselines) checkpointer_->baseline(std::move(json));
  checkpointer_->write_batch(*writer_, batch, first_seq);
}

void Recorder::writer_main() {
  std::vector<RawEvent> batch;
  batch.reserve(EventRing::kCapacity);
  std::vector<std::pair<uint8_t, std::string>> chunks;
  while (true) {
    bool stopping;
    std::string reason;
    {
      std::unique_lock<std::mutex> lock(wake_mu_);
      wake_cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return wake_ || stop_requested_; });
      wake_ = false;
      chunks.swap(pending_chunks_);
      stopping = stop_requested_;
      reason = stop_reason_;
    }
    wake_pending_.store(false);
    // Drain the events first, then write the table entries published so far,
    // then the events: every entry an event names was published before the
    // event was pushed, so it is written before the event (tables.h).
    uint64_t first_seq = 0;
    ring_.drain(&batch, &first_seq);
    writer_->write_tables(tables_, threads_, streams_);
    write_batch(batch, first_seq);
    for (auto& chunk : chunks) writer_->write_json(chunk.first, chunk.second);
    chunks.clear();
    if (g_sigterm && !stopping) {
      on_sigterm_in_writer();
      continue;
    }
    if (stopping) {
      ring_.drain(&batch, &first_seq);  // nothing is pushed any more: see stop()
      writer_->write_tables(tables_, threads_, streams_);
      write_batch(batch, first_seq);
      if (checkpointer_) checkpointer_->finish(*writer_);
      std::string footer = "{\"events\": " + std::to_string(writer_->events_written()) +
          ", \"dropped\": " + std::to_string(writer_->events_dropped()) +
          ", \"end_monotonic_ns\": " + std::to_string(now_ns()) + ", \"reason\": \"" + reason + "\"}";
      writer_->write_json(format::kChunkFooter, footer);
      writer_->close();
      if (remove_if_unused_ && !memory_written_ && writer_->error().empty() && unlink(path_.c_str()) == 0) {
        removed_.store(true);
      }
      if (reason == "SIGTERM") {
        // Go the way SIGTERM would have taken us without allocscope: with
        // what was there before ours (whatever is there now: a handler
        // installed since, which chained to ours, has run already).
        g_writer_acts = 0;
        g_sigterm = 0;
        raise_as_before();
      }
      return;
    }
  }
}

}  // namespace allocscope
