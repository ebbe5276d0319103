// Golden trajectories: cases recorded from PyTorch's torch.optim (tests/golden/README.md gives the format),
// replayed through one of optjit's three execution paths.
#pragma once

#include "compiler/metrics.h"
#include "runtime/device.h"

#include <filesystem>
#include <string>
#include <vector>

namespace optjit {

enum class ReplayMode { Forloop, Eager, Compiled };
ReplayMode parse_replay_mode(const std::string& text); // forloop, eager, compiled
std::string replay_mode_name(ReplayMode mode);

struct ReplayResult {
  std::string name;
  bool passed = false;
  std::string failure; // "step 3, param 2 exp_avg, index 5, got 0.1, expected 0.2" or why it could not run
  StepMetrics metrics; // compiled mode
};

// Replays one case with its params and grads on `device` (a CUDA device runs the compiled mode only).
ReplayResult replay_golden_file(const std::filesystem::path& file, ReplayMode mode, Device device = Device::cpu());
// Every *.json under each path (files are taken as given), sorted by name.
std::vector<std::filesystem::path> collect_golden_files(const std::vector<std::string>& paths);

} // namespace optjit
