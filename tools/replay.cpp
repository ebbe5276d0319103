// optjit replay: golden trajectories through the forloop, eager or compiled path (or all three).
#include "runtime/error.h"
#include "tools/commands.h"
#include "tools/golden.h"

#include <cstdio>

namespace optjit {

int run_replay(const ReplayOptions& options) {
  std::vector<ReplayMode> modes;
  const bool gpu = options.device.kind == DeviceKind::cuda;
  if (gpu && options.mode != "all" && options.mode != "compiled")
    throw Error("--device " + options.device.to_string() +
                " replays the compiled mode only (eager and forloop steps "
                "run on the CPU)");
  if (gpu || options.mode == "compiled")
    modes = {ReplayMode::Compiled};
  else if (options.mode == "all")
    modes = {ReplayMode::Forloop, ReplayMode::Eager, ReplayMode::Compiled};
  else
    modes = {parse_replay_mode(options.mode)};
  int passed = 0, failed = 0;
  const std::vector<std::filesystem::path> files = collect_golden_files(options.paths);
  if (files.empty())
    throw Error("no golden case (*.json) in the paths given: nothing to replay");
  for (const auto& file : files) {
    for (ReplayMode mode : modes) {
      ReplayResult r = replay_golden_file(file, mode, options.device);
      std::string name = r.name;
      if (modes.size() > 1)
        name += " [" + replay_mode_name(mode) + "]";
      if (r.passed) {
        ++passed;
        if (mode == ReplayMode::Compiled)
          std::printf("PASS %s  %s\n", name.c_str(), r.metrics.summary().c_str());
        else
          std::printf("PASS %s\n", name.c_str());
      } else {
        ++failed;
        std::printf("FAIL %s: %s\n", name.c_str(), r.failure.c_str());
      }
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

} // namespace optjit
