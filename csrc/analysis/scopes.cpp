// See scopes.h; each step is the Python walk's (attribution/scopes.py, move).
#include "scopes.h"

#include <unordered_map>
#include <utility>

namespace allocscope::scopes {

namespace {

using Scope = std::pair<int64_t, bool>;  // name, backward

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

int64_t innermost(const std::vector<Scope>& open) { return open.empty() ? -1 : open.back().first; }

}  // namespace

std::vector<Change> walk(size_t n, const int64_t* events, const int64_t* threads, const int64_t* symbols,
                         const std::vector<Symbol>& table, const std::vector<std::string>& names) {
  std::vector<Change> out;
  std::unordered_map<int64_t, size_t> index;  // thread -> its open scopes, in first-change order
  std::vector<std::pair<int64_t, std::vector<Scope>>> open;
  for (size_t j = 0; j < n; ++j) {
    int64_t s = symbols[j];
    if (s < 0) {
      // Backward scopes whose inputs needed no gradient never close: a phase
      // change closes them all.
      for (auto& [thread, scopes] : open) {
        size_t before = scopes.size();
        std::vector<Scope> kept;
        for (const Scope& x : scopes)
          if (!x.second) kept.push_back(x);
        if (kept.size() != before) {
          scopes.swap(kept);
          out.push_back({events[j], thread, innermost(scopes)});
        }
      }
      continue;
    }
    const Symbol& sym = table[static_cast<size_t>(s)];
    auto found = index.find(threads[j]);
    std::vector<Scope> none;
    std::vector<Scope>& scopes = found == index.end() ? none : open[found->second].second;
    if (sym.enter) {
      size_t pos = scopes.size();
      if (sym.backward) {
        // A module's and its last child's backward begin at the same node,
        // child first: the parent goes under its open descendants.
        const std::string prefix = names[static_cast<size_t>(sym.name)] + ".";
        while (pos && scopes[pos - 1].second && starts_with(names[static_cast<size_t>(scopes[pos - 1].first)], prefix))
          --pos;
      }
      scopes.insert(scopes.begin() + static_cast<std::ptrdiff_t>(pos), Scope{sym.name, sym.backward});
    } else {
      size_t j2 = scopes.size();
      while (j2 > 0 && scopes[j2 - 1] != Scope{sym.name, sym.backward}) --j2;
      if (j2 == 0) continue;  // no such scope open: nothing changes
      scopes.erase(scopes.begin() + static_cast<std::ptrdiff_t>(j2 - 1));
    }
    if (found == index.end()) {
      index[threads[j]] = open.size();
      open.emplace_back(threads[j], std::move(none));
      out.push_back({events[j], threads[j], innermost(open.back().second)});
    } else {
      out.push_back({events[j], threads[j], innermost(scopes)});
    }
  }
  return out;
}

}  // namespace allocscope::scopes
