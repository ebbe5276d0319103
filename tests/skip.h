// skip_test(): a test case that cannot run on this machine (no GPU, no ptxas, too little memory) says so and returns.
// The runner (tests/test_main.cpp) then does not count it as a case without assertions, and a run of skipped cases
// alone exits with kSkippedExitCode, which ctest reports as skipped with the reason in the output, never as passed.
#pragma once

#include <iostream>
#include <string>

namespace optjit::test {

// The exit code of a run whose every case skipped itself (ctest's SKIP_RETURN_CODE, as automake's 77).
inline constexpr int kSkippedExitCode = 77;

// The reason the current test case skipped itself, or empty.
inline std::string& skipped_reason() {
  static std::string reason;
  return reason;
}

// Prints "skipped: <reason>" and marks the current test case as skipped; the caller returns.
inline void skip_test(const std::string& reason) {
  skipped_reason() = reason;
  std::cout << "skipped: " << reason << std::endl;
}

} // namespace optjit::test
