#include "runtime/error.h"

#include <cstdio>
#include <cstdlib>

namespace optjit {

void internal_error(const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "optjit internal error at %s:%d: %s\n", file, line, message.c_str());
  std::abort();
}

} // namespace optjit
