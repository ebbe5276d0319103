// optjit::Error: the one exception type users see. It names the offending value and the rule it broke.
// It lives in runtime/ (the lowest layer) because every layer raises it.
#pragma once

#include <stdexcept>
#include <string>

namespace optjit {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Internal invariant: a bug in optjit, never a user error.
[[noreturn]] void internal_error(const char* file, int line, const std::string& message);

} // namespace optjit

#define OPTJIT_ASSERT(cond, msg)                                                                                       \
  do {                                                                                                                 \
    if (!(cond))                                                                                                       \
      ::optjit::internal_error(__FILE__, __LINE__, std::string("assertion `" #cond "` failed: ") + (msg));             \
  } while (0)
