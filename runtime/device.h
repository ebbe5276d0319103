// Where a tensor lives: the host CPU or a CUDA device.
#pragma once

#include <string>
#include <string_view>

namespace optjit {

enum class DeviceKind { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;
};

// Accepts "cpu", "cuda", "cuda:N"; throws optjit::Error otherwise.
Device parse_device(std::string_view text);

} // namespace optjit
