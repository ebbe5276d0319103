#include "tools/torch_anchors.h"

#include <cstdio>
#include <cstdlib>

namespace optjit {

nlohmann::json torch_anchors(const std::string& arguments) {
  const char* python = std::getenv("OPTJIT_TORCH_PYTHON");
  const char* script = std::getenv("OPTJIT_TORCH_BENCH");
  // Quoted (paths may hold spaces); the script's errors go to stderr, where the user sees why anchors were skipped.
  const auto quoted = [](const std::string& text) { return "'" + text + "'"; };
  const std::string command = quoted(python && *python ? python : "python3") + " " +
                              quoted(script && *script ? script : OPTJIT_SOURCE_DIR "/tools/bench_torch.py") + " " +
                              arguments;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe)
    return {{"skipped", "could not run " + command}};
  std::string out;
  char buffer[4096];
  while (std::size_t n = fread(buffer, 1, sizeof buffer, pipe))
    out.append(buffer, n);
  const int status = pclose(pipe);
  nlohmann::json parsed = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (status != 0 || !parsed.is_object())
    return {{"skipped", "no Python with torch (and, for --device cuda, a GPU) ran tools/bench_torch.py; set "
                        "OPTJIT_TORCH_PYTHON to one"}};
  return parsed;
}

} // namespace optjit
