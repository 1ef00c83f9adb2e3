// Errors raised by kvcache: one exception type whose message is meant for the user.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kvc {

// An error the user can act on; the message names the offending key, offset or value.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kvc
