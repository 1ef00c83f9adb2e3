// Turns a stream of token pieces into text deltas, stopping at stop strings that may span
// token boundaries: no delta ever contains a stop string or the start of one that might
// still complete, and no delta ends inside a UTF-8 character.
//
// Thread-safety: none; one matcher belongs to one sequence, used by one thread at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvc::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds a token's bytes; returns the text now safe to emit. After a stop string is seen,
  // stopped() is true and the text up to (not including) it has been returned.
  std::string push(std::string_view piece);
  // Returns whatever is held back (at the end of generation, when no stop string came).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace kvc::engine
