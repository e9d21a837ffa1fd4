// Checkpoints (docs/format.md, CHECKPOINT): the writer thread follows what
// is live as it writes events, so that now and then it can write, in one
// chunk, everything a reader needs to start reading at that point instead of
// at the beginning: the live allocations with the labels, phase and module
// scope they were made in, the watches, the scopes open on each thread, and
// the allocator's state (a baseline the program took). The writer thread
// alone uses a LiveSet; nothing here runs on a producer's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "format/scope_walk.h"
#include "recorder.h"

namespace allocscope {

class InternTables;

class LiveSet {
 public:
  explicit LiveSet(const InternTables* tables) : tables_(tables) {}

  // Every event written, in sequence order.
  void apply(const RawEvent& ev, uint64_t seq);
  // The events a reader puts before those from `point_seq` on (sequence
  // numbers in seqs), in order: docs/format.md says which and why.
  void retained(uint64_t point_seq, int64_t point_time, std::vector<RawEvent>* events,
                std::vector<uint64_t>* seqs) const;
  // Optimizer steps completed, as the last PHASE event said (-1: none yet).
  int64_t iteration() const { return iteration_; }
  // The labels (string ids) of the MARK events since the last call.
  std::vector<uint64_t> take_marks();
  // After a checkpoint: drops the phases no later one can need.
  void forget_old_phases();
  size_t live_rows() const { return rows_.size(); }
  // Whether a private memory pool (CUDA graphs, MemPool) was used: which
  // pools route which allocations is not part of a checkpoint.
  bool private_pools() const { return private_pools_; }
  void clear();

 private:
  using Labels = std::vector<std::pair<uint64_t, RawEvent>>;  // (seq, event)
  struct Row {
    RawEvent alloc;
    uint64_t seq = 0;
    int64_t module = -1;  // the innermost scope open on its thread when it was made (a string id)
    Labels labels;        // at most one per (kind, name)
  };
  static void add_label(Labels* labels, uint64_t seq, const RawEvent& ev);
  // The index of the first PHASE event after seq (the one before it, if
  // any, is the phase an event at seq was made in).
  size_t phases_after(uint64_t seq) const;

  const InternTables* tables_;
  std::unordered_map<uint64_t, Row> rows_;        // live allocations by address
  std::unordered_map<uint64_t, Labels> orphans_;  // labels of memory no recorded allocation holds
  Labels watches_, phases_;
  format::ScopeWalk walk_;
  std::vector<uint64_t> marks_;
  int64_t iteration_ = -1;
  bool private_pools_ = false;
};

class Writer;

// When to write checkpoints and what: the program asks for one (arm: the
// point is its next event, or the SNAPSHOT event its baseline makes), then
// hands over that baseline; the writer splits its events at the point,
// takes the live set there, and writes the CHECKPOINT chunk once the
// baseline has come. Writer thread only (the recorder passes the requests).
class Checkpointer {
 public:
  explicit Checkpointer(const InternTables* tables) : live_(tables), tables_(tables) {}

  void arm(uint64_t seq, bool at_snapshot);
  // The baseline of the oldest armed point without one ("": none could be taken: no checkpoint).
  void baseline(std::string json);
  // Writes a drained batch (events first_seq, ...), split at the points in it.
  void write_batch(Writer& writer, const std::vector<RawEvent>& batch, uint64_t first_seq);
  // Recording stops (after the last batch): writes what is complete.
  void finish(Writer& writer);

 private:
  struct Point {
    uint64_t seq;  // the point is at or after this event
    bool at_snapshot;
    bool taken = false;
    int batches_waited = 0;  // since its baseline came, while not taken (a snapshot that never comes)
    std::string header;      // the JSON header's fields before the baseline
    std::vector<RawEvent> events;
    std::vector<uint64_t> seqs;
    std::optional<std::string> baseline;
  };
  void take(Point& p, uint64_t tail_seq, int64_t time, uint64_t events_before);
  void write_ready(Writer& writer);

  LiveSet live_;
  const InternTables* tables_;
  std::deque<Point> points_;
};

}  // namespace allocscope
