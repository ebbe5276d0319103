#include "compiler/guards.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

namespace optjit {
namespace {

// What differs between two packed param facts, e.g. "dtype changed from f32 to f64".
std::string describe_param_change(uint32_t before, uint32_t now) {
  std::vector<std::string> changes;
  const unsigned dtype_before = before & kParamFactDtypeMask, dtype_now = now & kParamFactDtypeMask;
  if (dtype_before != dtype_now)
    changes.push_back(fmt::format("dtype changed from {} to {}", dtype_name(static_cast<Dtype>(dtype_before)),
                                  dtype_name(static_cast<Dtype>(dtype_now))));
  auto device_of = [](uint32_t fact) {
    return Device{static_cast<DeviceKind>((fact >> kParamFactDtypeBits) & 1),
                  static_cast<int>(fact >> (kParamFactDtypeBits + 1))}
        .to_string();
  };
  if ((before >> kParamFactDtypeBits) != (now >> kParamFactDtypeBits))
    changes.push_back(fmt::format("device changed from {} to {}", device_of(before), device_of(now)));
  return fmt::format("{}", fmt::join(changes, ", "));
}

std::string describe_all(const std::vector<DeviceHyper>& hypers) {
  std::vector<std::string> text;
  for (const DeviceHyper& h : hypers)
    text.push_back(describe(h));
  return text.empty() ? "none" : fmt::format("{}", fmt::join(text, ", "));
}

} // namespace

std::string describe(const DeviceHyper& hyper) {
  return hyper.name + " (" + std::string(dtype_name(hyper.dtype)) + " on " + hyper.device.to_string() + ")";
}

std::string explain_guard_failure(const GuardFacts& before, const GuardFacts& now) {
  if (before.groups.size() != now.groups.size())
    return "number of param groups changed from " + std::to_string(before.groups.size()) + " to " +
           std::to_string(now.groups.size());
  if (before.params.size() != now.params.size())
    return "number of params changed from " + std::to_string(before.params.size()) + " to " +
           std::to_string(now.params.size());
  for (std::size_t g = 0; g < now.groups.size(); ++g)
    if (before.groups[g] != now.groups[g])
      return "group " + std::to_string(g) + ": structure changed from {" + before.groups[g] + "} to {" + now.groups[g] +
             "}";
  for (std::size_t i = 0; i < now.params.size(); ++i) {
    const uint32_t a = before.params[i], b = now.params[i];
    if (a != b)
      return fmt::format("param {}: {}", i, describe_param_change(a, b));
    if (before.state_dtypes[i] != now.state_dtypes[i])
      return fmt::format("param {}: the dtypes its state is stored in changed (state loaded or replaced)", i);
  }
  if (before.device_hypers != now.device_hypers)
    return "hyperparameters held in tensors on a device changed from " + describe_all(before.device_hypers) + " to " +
           describe_all(now.device_hypers);
  if (before.grad_totals_may_stay_on_device != now.grad_totals_may_stay_on_device)
    return now.grad_totals_may_stay_on_device
               ? "the grad pass's totals may now stay on the device (no error_if_nonfinite, no reducer)"
               : "the grad pass's totals are now needed on the host (error_if_nonfinite, a reducer)";
  return "no difference";
}

} // namespace optjit
