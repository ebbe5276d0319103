#include "runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <array>
#include <cstdlib>
#include <memory>
#include <string>

namespace optjit {
namespace {

constexpr std::array<const char*, static_cast<int>(LogCategory::count)> kNames = {"recompiles", "guards", "kernels",
                                                                                  "codegen",    "passes", "fusion"};

struct LogState {
  std::array<bool, kNames.size()> enabled{};
  std::array<std::shared_ptr<spdlog::logger>, kNames.size()> loggers;

  LogState() {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    for (std::size_t i = 0; i < kNames.size(); ++i) {
      loggers[i] = std::make_shared<spdlog::logger>(std::string("optjit.") + kNames[i], sink);
      loggers[i]->set_pattern("[%n] %v");
    }
    reload();
  }
  void reload() {
    const char* env = std::getenv("OPTJIT_LOG");
    std::string value = env ? env : "";
    for (std::size_t i = 0; i < kNames.size(); ++i) {
      std::string name = kNames[i];
      enabled[i] = value == "all" || ("," + value + ",").find("," + name + ",") != std::string::npos;
    }
  }
};

LogState& state() {
  static LogState s;
  return s;
}

} // namespace

bool log_enabled(LogCategory category) { return state().enabled[static_cast<std::size_t>(category)]; }
spdlog::logger& log_for(LogCategory category) { return *state().loggers[static_cast<std::size_t>(category)]; }
void reload_log_settings() { state().reload(); }

} // namespace optjit
