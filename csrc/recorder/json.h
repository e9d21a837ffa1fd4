// A minimal JSON writer for the recorder's JSON chunks (baselines). Numbers
// are written as integers or with full double precision; strings are escaped.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace allocscope {

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }

  JsonWriter& key(const char* k) {
    comma();
    string(k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(int64_t v) { return raw(std::to_string(v)); }
  JsonWriter& value(uint64_t v) { return raw(std::to_string(v)); }
  JsonWriter& value(int v) { return raw(std::to_string(v)); }
  JsonWriter& value(bool v) { return raw(v ? "true" : "false"); }
  JsonWriter& value(double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return raw(buf);
  }
  JsonWriter& value(const std::string& v) {
    comma();
    string(v.c_str(), v.size());
    return *this;
  }
  template <typename T>
  JsonWriter& field(const char* k, const T& v) {
    key(k);
    return value(v);
  }

  const std::string& str() const { return out_; }

 private:
  JsonWriter& open(char c) {
    comma();
    out_ += c;
    first_ = true;
    return *this;
  }
  JsonWriter& close(char c) {
    out_ += c;
    first_ = false;
    return *this;
  }
  JsonWriter& raw(const std::string& s) {
    comma();
    out_ += s;
    return *this;
  }
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_) out_ += ',';
    first_ = false;
  }
  void string(const char* s, size_t n = std::string::npos) {
    if (n == std::string::npos) n = std::char_traits<char>::length(s);
    out_ += '"';
    for (size_t i = 0; i < n; ++i) {
      unsigned char c = static_cast<unsigned char>(s[i]);
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out_ += buf;
          } else {
            out_ += static_cast<char>(c);
          }
      }
    }
    out_ += '"';
  }

  std::string out_;
  bool first_ = true;
  bool after_key_ = false;
};

}  // namespace allocscope
