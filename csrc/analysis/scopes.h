// The module-scope walk of python/allocscope/attribution/scopes.py in C++:
// MODULE_ENTER/EXIT and PHASE events replayed per thread, each change of a
// thread's innermost open scope reported. The Python walk stays the
// reference (tests/unit/test_native_scopes.py compares them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace allocscope::scopes {

struct Symbol {
  bool enter;
  int64_t name;  // an index into names
  bool backward;
  bool restored;  // an ENTER a checkpoint wrote (format.h kModuleRestored): placed on top as it is
};

struct Change {
  int64_t event, thread, innermost;  // innermost: a name index, -1 for none
};

// events/threads/symbols: one entry per scope or PHASE event (symbol -1:
// a PHASE event, which closes every thread's backward scopes).
std::vector<Change> walk(size_t n, const int64_t* events, const int64_t* threads, const int64_t* symbols,
                         const std::vector<Symbol>& table, const std::vector<std::string>& names);

}  // namespace allocscope::scopes
