// The module-scope walk of docs/attribution.md (rule 4), one event at a
// time: MODULE_ENTER/EXIT events move a thread's open scopes, a PHASE event
// closes every thread's backward scopes. The analysis walks a whole capture
// with it (csrc/analysis/scopes.cpp), the recorder's writer the events as it
// writes them (csrc/recorder/checkpoint.cpp, to know the scope each live
// allocation was made in). attribution/scopes.py walk_python is the
// reference both are tested against.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace allocscope::format {

class ScopeWalk {
 public:
  using Scope = std::pair<int64_t, bool>;  // name, backward
  using Scopes = std::vector<Scope>;

  static int64_t innermost(const Scopes& open) { return open.empty() ? -1 : open.back().first; }

  // One MODULE_ENTER (enter) or MODULE_EXIT. name_of(name) gives the
  // module's qualified name (a string or string_view). restored: an ENTER a checkpoint wrote to put
  // an open scope back, placed on top as it is. Returns whether the thread's
  // scopes changed (a thread is known from its first change on).
  template <class NameOf>
  bool apply(int64_t thread, bool enter, int64_t name, bool backward, bool restored, const NameOf& name_of) {
    auto found = index_.find(thread);
    Scopes none;
    Scopes& scopes = found == index_.end() ? none : open_[found->second].second;
    if (enter) {
      size_t pos = scopes.size();
      if (backward && !restored) {
        // A module's and its last child's backward begin at the same node,
        // child first: the parent goes under its open descendants.
        std::string prefix(name_of(name));
        prefix += '.';
        while (pos && scopes[pos - 1].second && starts_with(name_of(scopes[pos - 1].first), prefix)) --pos;
      }
      scopes.insert(scopes.begin() + static_cast<std::ptrdiff_t>(pos), Scope{name, backward});
    } else {
      size_t j = scopes.size();
      while (j > 0 && scopes[j - 1] != Scope{name, backward}) --j;
      if (j == 0) return false;  // no such scope open: nothing changes
      scopes.erase(scopes.begin() + static_cast<std::ptrdiff_t>(j - 1));
    }
    if (found == index_.end()) {
      index_[thread] = open_.size();
      open_.emplace_back(thread, std::move(none));
    }
    return true;
  }

  // A PHASE event: backward scopes whose inputs needed no gradient never
  // close, so a phase change closes them all. changed(thread, scopes) for
  // each thread that had some, in the order threads became known.
  template <class Changed>
  void phase(const Changed& changed) {
    for (auto& [thread, scopes] : open_) {
      size_t before = scopes.size();
      Scopes kept;
      for (const Scope& x : scopes)
        if (!x.second) kept.push_back(x);
      if (kept.size() != before) {
        scopes.swap(kept);
        changed(thread, scopes);
      }
    }
  }

  const Scopes& open(int64_t thread) const {
    static const Scopes kNone;
    auto found = index_.find(thread);
    return found == index_.end() ? kNone : open_[found->second].second;
  }

  // (thread, open scopes) of every known thread, in the order they became known.
  const std::vector<std::pair<int64_t, Scopes>>& threads() const { return open_; }

  void clear() {
    index_.clear();
    open_.clear();
  }

 private:
  static bool starts_with(std::string_view s, std::string_view prefix) {
    return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
  }

  std::unordered_map<int64_t, size_t> index_;  // thread -> its entry in open_
  std::vector<std::pair<int64_t, Scopes>> open_;
};

}  // namespace allocscope::format
