// Named log categories, switched on with OPTJIT_LOG (comma-separated names, or "all"). Messages are built only
// when their category is on.
#pragma once

#include <spdlog/spdlog.h>

namespace optjit {

enum class LogCategory { recompiles, guards, kernels, codegen, passes, fusion, count };

bool log_enabled(LogCategory category);
spdlog::logger& log_for(LogCategory category);
// Re-reads OPTJIT_LOG (tests change it).
void reload_log_settings();

} // namespace optjit

#define OPTJIT_LOG(category, ...)                                                                                      \
  do {                                                                                                                 \
    if (::optjit::log_enabled(::optjit::LogCategory::category))                                                        \
      ::optjit::log_for(::optjit::LogCategory::category).info(__VA_ARGS__);                                            \
  } while (0)
