#include "checkpoint.h"

#include <algorithm>
#include <string_view>

#include "format/format.h"
#include "json.h"
#include "tables.h"
#include "writer.h"

namespace allocscope {

using namespace format;

void LiveSet::add_label(Labels* labels, uint64_t seq, const RawEvent& ev) {
  // A repeated label (the same kind, name and size) cannot change which label of
  // a row wins (attribution/categories.py: the first of equal priority):
  // keeping one bounds a long-lived row's labels.
  for (const auto& [s, have] : *labels)
    if (have.kind == ev.kind && have.arg == ev.arg && have.size == ev.size) return;
  labels->emplace_back(seq, ev);
}

void LiveSet::apply(const RawEvent& ev, uint64_t seq) {
  const uint8_t kind = ev.kind & kKindMask;
  switch (kind) {
    case kAlloc: {
      Row& row = rows_[ev.addr];
      row.alloc = ev;
      row.seq = seq;
      row.module = ScopeWalk::innermost(walk_.open(ev.thread));
      row.labels.clear();
      return;
    }
    case kFree:
      if (rows_.erase(ev.addr) == 0) orphans_.erase(ev.addr);  // memory from before recording, freed
      return;
    case kParameter:
    case kBuffer:
    case kGradient:
    case kOptimizerState:
    case kActivation:
    case kInput: {
      auto row = rows_.find(ev.addr);
      add_label(row != rows_.end() ? &row->second.labels : &orphans_[ev.addr], seq, ev);
      return;
    }
    case kWatch:
      watches_.emplace_back(seq, ev);
      return;
    case kPhase:
      phases_.emplace_back(seq, ev);
      iteration_ = static_cast<int64_t>(ev.addr);
      walk_.phase([](int64_t, const ScopeWalk::Scopes&) {});
      return;
    case kModuleEnter:
    case kModuleExit: {
      auto name_of = [this](int64_t id) -> std::string_view {
        return static_cast<size_t>(id) < tables_->strings.size() ? tables_->strings[static_cast<size_t>(id)]
                                                                 : std::string_view();
      };
      walk_.apply(ev.thread, kind == kModuleEnter, static_cast<int64_t>(ev.arg), (ev.addr & kModuleBackward) != 0,
                  (ev.addr & kModuleRestored) != 0, name_of);
      return;
    }
    case kMark:
      marks_.push_back(ev.arg);
      return;
    case kPoolBegin:
    case kPoolEnd:
    case kPoolRelease:
    case kPoolAlloc:
      private_pools_ = true;
      return;
    default:
      return;
  }
}

void LiveSet::retained(uint64_t point_seq, int64_t point_time, std::vector<RawEvent>* events,
                       std::vector<uint64_t>* seqs) const {
  struct Item {
    uint64_t seq;
    uint32_t order;  // among events sharing a sequence number
    RawEvent ev;
  };
  std::vector<Item> items;
  items.reserve(rows_.size() * 3 + watches_.size() + 16);
  for (const auto& [seq, ev] : watches_) items.push_back({seq, 0, ev});
  // The phase each live allocation was made in and the one that ended it
  // (its category by the phase rule), and the phase now.
  std::vector<bool> keep(phases_.size(), false);
  if (!phases_.empty()) keep.back() = true;
  auto phase_of = [&](uint64_t seq) {
    size_t k = phases_after(seq);
    if (k > 0) keep[k - 1] = true;
    if (k < phases_.size()) keep[k] = true;
  };
  for (const auto& [addr, row] : rows_) {
    phase_of(row.seq);
    if (row.module >= 0) {
      // The scope it was made in, put back around it alone: a forward scope
      // opened and closed at once leaves every thread's scopes as they were.
      RawEvent enter;
      enter.kind = kModuleEnter;
      enter.arg = static_cast<uint64_t>(row.module);
      enter.addr = kModuleRestored;
      enter.thread = row.alloc.thread;
      enter.time_ns = row.alloc.time_ns;
      RawEvent exit = enter;
      exit.kind = kModuleExit;
      items.push_back({row.seq, 0, enter});
      items.push_back({row.seq, 2, exit});
    }
    items.push_back({row.seq, 1, row.alloc});
    for (const auto& [seq, ev] : row.labels) items.push_back({seq, 0, ev});
  }
  for (const auto& [addr, labels] : orphans_)
    for (const auto& [seq, ev] : labels) items.push_back({seq, 0, ev});
  for (size_t k = 0; k < phases_.size(); ++k)
    if (keep[k]) items.push_back({phases_[k].first, 0, phases_[k].second});
  // The scopes open now, each thread's from the outermost in: restored
  // ENTERs stack as they come.
  uint32_t order = 0;
  for (const auto& [thread, scopes] : walk_.threads()) {
    for (const auto& [name, backward] : scopes) {
      RawEvent enter;
      enter.kind = kModuleEnter;
      enter.arg = static_cast<uint64_t>(name);
      enter.addr = kModuleRestored | (backward ? kModuleBackward : 0);
      enter.thread = static_cast<uint16_t>(thread);
      enter.time_ns = point_time;
      items.push_back({point_seq, order++, enter});
    }
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.seq != b.seq ? a.seq < b.seq : a.order < b.order; });
  events->clear();
  seqs->clear();
  for (const Item& it : items) {
    events->push_back(it.ev);
    seqs->push_back(it.seq);
  }
}

std::vector<uint64_t> LiveSet::take_marks() {
  std::vector<uint64_t> out;
  out.swap(marks_);
  return out;
}

void LiveSet::clear() {
  rows_.clear();
  orphans_.clear();
  watches_.clear();
  phases_.clear();
  walk_.clear();
  marks_.clear();
  iteration_ = -1;
  private_pools_ = false;
}

void Checkpointer::arm(uint64_t seq, bool at_snapshot) {
  Point p;
  p.seq = seq;
  p.at_snapshot = at_snapshot;
  points_.push_back(std::move(p));
}

void Checkpointer::baseline(std::string json) {
  for (Point& p : points_) {
    if (!p.baseline) {
      p.baseline = std::move(json);
      return;
    }
  }
}

void LiveSet::forget_old_phases() {
  // No later checkpoint needs a phase before the one the oldest live
  // allocation was made in: a long run's phases do not pile up.
  uint64_t oldest = UINT64_MAX;
  for (const auto& [addr, row] : rows_) oldest = std::min(oldest, row.seq);
  size_t k = phases_after(oldest);
  if (k == 0) return;
  // the phase the oldest was made in stays (and the last one, which is at or after it)
  phases_.erase(phases_.begin(), phases_.begin() + static_cast<std::ptrdiff_t>(k - 1));
}

size_t LiveSet::phases_after(uint64_t seq) const {
  auto it = std::upper_bound(phases_.begin(), phases_.end(), seq,
                             [](uint64_t s, const std::pair<uint64_t, RawEvent>& p) { return s < p.first; });
  return static_cast<size_t>(it - phases_.begin());
}

void Checkpointer::take(Point& p, uint64_t tail_seq, int64_t time, uint64_t events_before) {
  live_.retained(tail_seq, time, &p.events, &p.seqs);
  live_.forget_old_phases();
  JsonWriter j;
  j.begin_object().field("seq", tail_seq).field("events", events_before).field("iteration", live_.iteration());
  j.field("time_ns", time).field("live", static_cast<uint64_t>(live_.live_rows()));
  j.field("private_pools", live_.private_pools());
  j.key("marks").begin_array();
  for (uint64_t id : live_.take_marks()) {
    j.value(id < tables_->strings.size() ? std::string(tables_->strings[static_cast<size_t>(id)]) : std::string("?"));
  }
  j.end_array();
  p.header = j.str();  // the object stays open: the baseline goes last
  p.taken = true;
}

void Checkpointer::write_ready(Writer& writer) {
  while (!points_.empty()) {
    Point& p = points_.front();
    if (p.baseline && p.baseline->empty()) {  // no baseline could be taken: no checkpoint
      points_.pop_front();
      continue;
    }
    if (!p.taken && p.baseline && ++p.batches_waited > 2) {
      points_.pop_front();  // its snapshot never came (an allocator that makes no SNAPSHOT event)
      continue;
    }
    if (!p.taken || !p.baseline) return;
    writer.write_checkpoint(p.header + ",\"baseline\":" + *p.baseline + "}", p.events, p.seqs);
    points_.pop_front();
  }
}

void Checkpointer::write_batch(Writer& writer, const std::vector<RawEvent>& batch, uint64_t first_seq) {
  size_t from = 0;
  // The first point not taken yet (points are taken in order).
  auto next = [&]() -> Point* {
    for (Point& p : points_)
      if (!p.taken) return &p;
    return nullptr;
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    const uint64_t seq = first_seq + i;
    for (Point* p = next(); p != nullptr && !p->at_snapshot && seq >= p->seq; p = next()) {
      // The point is before this event.
      writer.write_events(batch, first_seq, from, i);
      from = i;
      take(*p, seq, i ? batch[i - 1].time_ns : batch[i].time_ns, writer.events_written());
    }
    live_.apply(batch[i], seq);
    Point* p = next();
    if (p != nullptr && p->at_snapshot && seq >= p->seq && (batch[i].kind & format::kKindMask) == format::kSnapshot) {
      // The point is after the snapshot its baseline took.
      writer.write_events(batch, first_seq, from, i + 1);
      from = i + 1;
      take(*p, seq + 1, batch[i].time_ns, writer.events_written());
    }
  }
  writer.write_events(batch, first_seq, from, batch.size());
  const uint64_t end = first_seq + batch.size();
  for (Point* p = next(); p != nullptr && !p->at_snapshot && end >= p->seq && !batch.empty(); p = next())
    take(*p, end, batch.back().time_ns, writer.events_written());
  write_ready(writer);
}

void Checkpointer::finish(Writer& writer) {
  // No events follow: a point not reached has nothing to start; the taken
  // ones whose baseline came are written, the rest dropped.
  for (Point& p : points_) p.batches_waited = 0;
  write_ready(writer);
  points_.clear();
}

}  // namespace allocscope
