// Golden trajectories: cases recorded from PyTorch's torch.optim (tests/golden/README.md gives the format),
// replayed through one of optjit's three execution paths.
#pragma once

#include "compiler/metrics.h"
#include "runtime/device.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
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

// The largest golden case file replay reads (it is parsed whole, in memory); the largest recorded case is ~50 KB.
constexpr uintmax_t kMaxGoldenCaseBytes = uintmax_t{256} << 20;

// Replays one case with its params and grads on `device` (a CUDA device runs the compiled mode only).
ReplayResult replay_golden_file(const std::filesystem::path& file, ReplayMode mode, Device device = Device::cpu());
// The same from the case's JSON text; `name` names the case until its own "name" is read. Never throws: what is
// wrong with the case, or where it differs from optjit, is the result's failure.
ReplayResult replay_golden_text(std::string_view text, const std::string& name, ReplayMode mode,
                                Device device = Device::cpu());
// Every *.json under each path (files are taken as given), sorted by name.
std::vector<std::filesystem::path> collect_golden_files(const std::vector<std::string>& paths);

} // namespace optjit
