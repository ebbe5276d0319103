#include "compiler/guards.h"

#include <spdlog/fmt/ranges.h>
#include <spdlog/fmt/fmt.h>

namespace optjit {
namespace {

const char* device_kind_name(unsigned kind) { return kind ? "cuda" : "cpu"; }

// What differs between two packed param facts, e.g. "dtype changed from f32 to f64".
std::string describe_param_change(uint8_t before, uint8_t now) {
  std::vector<std::string> changes;
  const unsigned dtype_before = before & 3, dtype_now = now & 3;
  if (dtype_before != dtype_now)
    changes.push_back(fmt::format("dtype changed from {} to {}", dtype_name(static_cast<Dtype>(dtype_before)),
                                  dtype_name(static_cast<Dtype>(dtype_now))));
  const unsigned device_before = (before >> 2) & 1, device_now = (now >> 2) & 1;
  if (device_before != device_now)
    changes.push_back(fmt::format("device changed from {} to {}", device_kind_name(device_before),
                                  device_kind_name(device_now)));
  return fmt::format("{}", fmt::join(changes, ", "));
}

} // namespace

std::string explain_guard_failure(const GuardFacts& before, const GuardFacts& now) {
  if (before.groups.size() != now.groups.size())
    return "number of param groups changed from " + std::to_string(before.groups.size()) + " to " +
           std::to_string(now.groups.size());
  if (before.params.size() != now.params.size())
    return "number of params changed from " + std::to_string(before.params.size()) + " to " +
           std::to_string(now.params.size());
  for (std::size_t g = 0; g < now.groups.size(); ++g)
    if (before.groups[g] != now.groups[g])
      return "group " + std::to_string(g) + ": structure changed from {" + before.groups[g] + "} to {" +
             now.groups[g] + "}";
  for (std::size_t i = 0; i < now.params.size(); ++i) {
    uint8_t a = before.params[i], b = now.params[i];
    if (a == b)
      continue;
    return fmt::format("param {}: {}", i, describe_param_change(a, b));
  }
  return "no difference";
}

} // namespace optjit
