#include "writer.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "format/chunk.h"
#include "format/columns.h"
#include "format/format.h"
#include "recorder.h"
#include "tables.h"

namespace allocscope {
namespace {

using namespace format;

inline void put_bytes(std::vector<uint8_t>* out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out->insert(out->end(), b, b + n);
}

inline void put_string(std::vector<uint8_t>* out, const char* s, size_t n) {
  put_varint(out, n);
  put_bytes(out, s, n);
}

bool write_all(int fd, const struct iovec* iov, int count, std::string* error) {
  struct iovec local[3];
  std::memcpy(local, iov, sizeof(struct iovec) * count);
  int first = 0;
  while (first < count) {
    ssize_t n = ::writev(fd, local + first, count - first);
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = std::strerror(errno);
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (first < count && left >= local[first].iov_len) {
      left -= local[first].iov_len;
      ++first;
    }
    if (first < count) {
      local[first].iov_base = static_cast<char*>(local[first].iov_base) + left;
      local[first].iov_len -= left;
    }
  }
  return true;
}

}  // namespace

Writer::Writer(const std::string& path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot open " + path + " for writing: " + std::strerror(errno));
  // A write lock for as long as the file is written (docs/format.md, "While
  // it is written"): `allocscope run` waits for the processes of its command
  // that outlive the first one (an engine orphaned by its parent) to finish
  // their captures. A POSIX record lock: released when this process closes
  // the file or dies however it dies, and never inherited by a forked child.
  struct flock lock;
  std::memset(&lock, 0, sizeof(lock));
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  (void)::fcntl(fd_, F_SETLK, &lock);  // without it (a file system without locks) nothing waits
  uint8_t header[kHeaderSize] = {};
  std::memcpy(header, kMagic, sizeof(kMagic));
  uint32_t version = kFormatVersion;
  std::memcpy(header + 8, &version, 4);  // little endian hosts only (x86-64, aarch64)
  struct iovec iov = {header, sizeof(header)};
  if (!write_all(fd_, &iov, 1, &error_)) {
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("cannot write " + path + ": " + error_);
  }
  bytes_ = sizeof(header);
}

Writer::~Writer() {
  close();
}

void Writer::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool Writer::write_chunk(uint8_t type, const std::vector<uint8_t>& payload) {
  if (fd_ < 0 || !error_.empty()) return false;
  uint8_t header[kChunkHeaderSize] = {type, 0, 0, 0};
  uint32_t length = static_cast<uint32_t>(payload.size());
  std::memcpy(header + 4, &length, 4);
  uint32_t crc = chunk_crc(type, length, payload.data());
  std::memcpy(header + 8, &crc, 4);
  // One writev per chunk: a crash leaves whole chunks plus at most one torn one.
  struct iovec iov[2] = {{header, sizeof(header)}, {const_cast<uint8_t*>(payload.data()), payload.size()}};
  if (!write_all(fd_, iov, 2, &error_)) return false;
  bytes_ += sizeof(header) + payload.size();
  return true;
}

void Writer::write_json(uint8_t type, const std::string& json) {
  payload_.assign(json.begin(), json.end());
  write_chunk(type, payload_);
}

void Writer::write_tables(const InternTables& tables, const ThreadTable& threads, const StreamTable& streams) {
  // Stack nodes name frames, frames name strings, and producers publish a
  // string before a frame that names it, a frame before a node. Reading the
  // sizes in the reverse order (nodes, frames, strings) therefore takes in
  // every entry that anything in the snapshot names; writing in the forward
  // order puts each entry before its first use.
  const size_t nodes = tables.nodes.size();
  const size_t frames = tables.frames.size();
  const size_t strings = tables.strings.size();
  const size_t thread_count = threads.size();
  const size_t stream_count = streams.size();
  if (strings > strings_done_) {
    payload_.clear();
    put_varint(&payload_, strings_done_);
    put_varint(&payload_, strings - strings_done_);
    for (size_t i = strings_done_; i < strings; ++i) {
      put_string(&payload_, tables.strings[i].data(), tables.strings[i].size());
    }
    if (write_chunk(kChunkStrings, payload_)) strings_done_ = strings;
  }
  if (frames > frames_done_) {
    payload_.clear();
    put_varint(&payload_, frames_done_);
    put_varint(&payload_, frames - frames_done_);
    for (size_t i = frames_done_; i < frames; ++i) {
      const FrameEntry& f = tables.frames[i];
      put_varint(&payload_, f.filename);
      put_varint(&payload_, f.function);
      put_varint(&payload_, zigzag(f.line));
    }
    if (write_chunk(kChunkFrames, payload_)) frames_done_ = frames;
  }
  if (nodes > nodes_done_) {
    payload_.clear();
    put_varint(&payload_, nodes_done_);
    put_varint(&payload_, nodes - nodes_done_);
    for (size_t i = nodes_done_; i < nodes; ++i) {
      put_varint(&payload_, tables.nodes[i].parent);
      put_varint(&payload_, tables.nodes[i].frame);
    }
    if (write_chunk(kChunkStacks, payload_)) nodes_done_ = nodes;
  }
  if (thread_count > threads_done_) {
    payload_.clear();
    put_varint(&payload_, threads_done_);
    put_varint(&payload_, thread_count - threads_done_);
    auto& table = const_cast<ThreadTable&>(threads);
    for (size_t i = threads_done_; i < thread_count; ++i) {
      const ThreadEntry& t = table.entry(static_cast<uint32_t>(i));
      put_varint(&payload_, t.tid);
      put_string(&payload_, t.name, strnlen(t.name, sizeof(t.name)));
    }
    if (write_chunk(kChunkThreads, payload_)) threads_done_ = thread_count;
  }
  if (stream_count > streams_done_) {
    payload_.clear();
    put_varint(&payload_, streams_done_);
    put_varint(&payload_, stream_count - streams_done_);
    for (size_t i = streams_done_; i < stream_count; ++i) {
      put_varint(&payload_, zigzag(streams[static_cast<uint32_t>(i)].device));
      put_varint(&payload_, streams[static_cast<uint32_t>(i)].handle);
    }
    if (write_chunk(kChunkStreams, payload_)) streams_done_ = stream_count;
  }
}

void Writer::encode_events(const RawEvent* events, size_t n, uint64_t first_seq, std::vector<uint8_t>* out) {
  put_varint(out, n);
  put_varint(out, first_seq);
  put_varint(out, zigzag(n ? events[0].time_ns : 0));
  // Addresses share their low zero bits (512 on CUDA, 64 on CPU): drop them.
  uint64_t any = 0;
  for (size_t i = 0; i < n; ++i) any |= events[i].addr;
  uint8_t shift = any == 0 ? 0 : static_cast<uint8_t>(__builtin_ctzll(any));
  out->push_back(shift);

  out->push_back(kEncRaw);
  for (size_t i = 0; i < n; ++i) out->push_back(events[i].kind);

  auto column = [&](auto get) {
    values_.resize(n);
    for (size_t i = 0; i < n; ++i) values_[i] = get(i);
    encode_column(values_, out);
  };
  column([&](size_t i) { return zigzag(events[i].time_ns - (i ? events[i - 1].time_ns : events[0].time_ns)); });
  column([&](size_t i) { return uint64_t{events[i].thread}; });
  column([&](size_t i) { return uint64_t{events[i].stream}; });
  column([&](size_t i) {
    int64_t cur = static_cast<int64_t>(events[i].addr >> shift);
    int64_t prev = i ? static_cast<int64_t>(events[i - 1].addr >> shift) : 0;
    return zigzag(cur - prev);
  });
  column([&](size_t i) { return events[i].size; });
  column([&](size_t i) { return events[i].block; });
  column([&](size_t i) { return uint64_t{events[i].stack}; });
  column([&](size_t i) { return events[i].arg; });
  column([&](size_t i) { return uint64_t{events[i].op}; });
}

void Writer::write_events(const std::vector<RawEvent>& events, uint64_t first_seq, size_t begin, size_t end) {
  end = std::min(end, events.size());
  if (begin >= end) return;
  payload_.clear();
  encode_events(events.data() + begin, end - begin, first_seq + begin, &payload_);
  if (write_chunk(kChunkEvents, payload_)) {
    events_written_ += end - begin;
  } else {
    events_dropped_ += end - begin;
  }
}

void Writer::write_checkpoint(const std::string& header_json, const std::vector<RawEvent>& events,
                              const std::vector<uint64_t>& seqs) {
  // docs/format.md, CHECKPOINT: the header, the retained events as an
  // EVENTS payload, then their sequence numbers (deltas, one column).
  payload_.clear();
  put_string(&payload_, header_json.data(), header_json.size());
  std::vector<uint8_t> block;
  encode_events(events.data(), events.size(), 0, &block);
  put_varint(&payload_, block.size());
  put_bytes(&payload_, block.data(), block.size());
  values_.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i)
    values_[i] = zigzag(static_cast<int64_t>(seqs[i] - (i ? seqs[i - 1] : 0)));
  encode_column(values_, &payload_);
  write_chunk(kChunkCheckpoint, payload_);
}

}  // namespace allocscope
