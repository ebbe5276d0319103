// Compile guards: the facts compiled code depends on. Per parameter: its dtype and device, and the dtypes its
// state is stored in (torch keeps a loaded ASGD eta in the param's dtype, a new one in f32); per param group: its
// structural options (amsgrad, maximize, nesterov, momentum != 0, weight_decay != 0, ...). Hyperparameter values
// are never guard facts: they are arguments. Which grads are present is not one either: a None grad only drops
// its param from the work-item table (a rebind), since the traced list graph does not depend on it.
#pragma once

#include "runtime/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace optjit {

// A hyperparameter a param group holds in a 1-element tensor on a device (a tensor lr, GradScaler's scale there):
// kernels on that device read it where it is (KernelPlan::hypers_on_device), so that the step copies nothing back.
struct DeviceHyper {
  std::string name;
  Dtype dtype = Dtype::f32; // f32 or f64
  Device device;
  bool operator==(const DeviceHyper&) const = default;
};
std::string describe(const DeviceHyper& hyper); // "lr (f32 on cuda:0)"

struct GuardFacts {
  std::vector<uint32_t> params;           // per parameter, packed by param_fact()
  std::vector<uint64_t> state_dtypes;     // per parameter, its state entries' storage dtypes (StepSource's packing)
  std::vector<std::string> groups;        // per group, the structure key ("amsgrad=1,maximize=0,...")
  std::vector<DeviceHyper> device_hypers; // StepSource::device_hypers()
  // Some param is on a GPU, and StepSource::grad_totals_may_stay_on_device() holds (the program's grad pass may then
  // leave its totals there: Program::grad_total). False on the CPU, where nothing depends on it.
  bool grad_totals_may_stay_on_device = false;

  bool operator==(const GuardFacts&) const = default;
};

// A param's packed fact: dtype in the low kParamFactDtypeBits bits, then the device kind (1 bit), then the device
// index. Room for 16 dtypes.
inline constexpr unsigned kParamFactDtypeBits = 4;
inline constexpr uint32_t kParamFactDtypeMask = (1u << kParamFactDtypeBits) - 1;
static_assert(kDtypeCount <= kParamFactDtypeMask + 1, "widen kParamFactDtypeBits for the dtype table");
inline uint32_t param_fact(const TensorImpl& param) {
  return static_cast<uint32_t>(param.dtype) | (static_cast<uint32_t>(param.device.kind) << kParamFactDtypeBits) |
         (static_cast<uint32_t>(param.device.index) << (kParamFactDtypeBits + 1));
}

// The first guard that differs between `before` and `now`, in words: "param 3: dtype changed from f32 to f64".
std::string explain_guard_failure(const GuardFacts& before, const GuardFacts& now);

} // namespace optjit
