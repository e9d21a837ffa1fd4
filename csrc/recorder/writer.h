// Encodes and appends chunks to a capture file (layout: format.h,
// docs/format.md). Used by the recorder's writer thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace allocscope {

struct RawEvent;
class InternTables;
class ThreadTable;
class StreamTable;

class Writer {
 public:
  // Creates or truncates `path` and writes the file header; throws
  // std::runtime_error with the reason on failure.
  explicit Writer(const std::string& path);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void write_json(uint8_t type, const std::string& json);
  // Writes the table entries added since the previous call.
  void write_tables(const InternTables& tables, const ThreadTable& threads, const StreamTable& streams);
  // Writes events[begin, end) (the batch's first event has first_seq) as one chunk.
  void write_events(const std::vector<RawEvent>& events, uint64_t first_seq, size_t begin = 0,
                    size_t end = SIZE_MAX);
  // A CHECKPOINT chunk: its JSON header, the retained events and their sequence numbers.
  void write_checkpoint(const std::string& header_json, const std::vector<RawEvent>& events,
                        const std::vector<uint64_t>& seqs);
  void close();

  uint64_t bytes() const { return bytes_; }
  uint64_t events_written() const { return events_written_; }
  uint64_t events_dropped() const { return events_dropped_; }
  const std::string& error() const { return error_; }

 private:
  bool write_chunk(uint8_t type, const std::vector<uint8_t>& payload);
  void encode_events(const RawEvent* events, size_t n, uint64_t first_seq, std::vector<uint8_t>* out);

  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint64_t events_written_ = 0;
  uint64_t events_dropped_ = 0;
  std::string error_;
  size_t strings_done_ = 0, frames_done_ = 0, nodes_done_ = 0, threads_done_ = 0, streams_done_ = 0;
  std::vector<uint8_t> payload_;
  std::vector<uint64_t> values_;
};

}  // namespace allocscope
