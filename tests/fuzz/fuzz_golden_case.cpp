// Fuzzes the golden-case reader: a case's JSON text replayed in the forloop and eager modes (the compiled mode
// shares the reader and the eager mode's graph; compiling every input would slow the fuzzer a hundredfold). Replay
// never throws: a malformed case is a failed result. What the fuzzer looks for is a crash, a sanitizer report, an
// internal error, or an allocation beyond its limit.
#include "tools/golden.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (optjit::ReplayMode mode : {optjit::ReplayMode::Forloop, optjit::ReplayMode::Eager})
    (void)optjit::replay_golden_text(text, "fuzz", mode);
  return 0;
}
