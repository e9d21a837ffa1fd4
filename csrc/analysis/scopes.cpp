// See scopes.h; each step is format/scope_walk.h's (the Python walk's,
// attribution/scopes.py).
#include "scopes.h"

#include "format/scope_walk.h"

namespace allocscope::scopes {

std::vector<Change> walk(size_t n, const int64_t* events, const int64_t* threads, const int64_t* symbols,
                         const std::vector<Symbol>& table, const std::vector<std::string>& names) {
  std::vector<Change> out;
  format::ScopeWalk walk;
  auto name_of = [&](int64_t name) -> const std::string& { return names[static_cast<size_t>(name)]; };
  for (size_t j = 0; j < n; ++j) {
    int64_t s = symbols[j];
    if (s < 0) {
      walk.phase([&](int64_t thread, const format::ScopeWalk::Scopes& scopes) {
        out.push_back({events[j], thread, format::ScopeWalk::innermost(scopes)});
      });
      continue;
    }
    const Symbol& sym = table[static_cast<size_t>(s)];
    if (walk.apply(threads[j], sym.enter, sym.name, sym.backward, sym.restored, name_of))
      out.push_back({events[j], threads[j], format::ScopeWalk::innermost(walk.open(threads[j]))});
  }
  return out;
}

}  // namespace allocscope::scopes
