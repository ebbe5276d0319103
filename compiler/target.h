// Target: where and how a bucket's code runs. The driver picks a backend by it and never branches on a device kind
// itself: compiled for the host CPU (ORC JIT), compiled for a CUDA device (PTX for the device's sm), or interpreted
// op by op on the host (the eager path).
#pragma once

#include "runtime/device.h"

#include <string>

namespace optjit {

enum class Execution { Compiled, Interpreted };

struct Target {
  Execution execution = Execution::Compiled;
  Device device;   // where the tensors live and the code runs
  int sm = 0;      // CUDA: the PTX target (80 or 90)
  std::string isa; // the instruction set the code is for: "znver2 (+avx2,...)", "sm_90", "interpreter"

  // The target of a bucket on `device`. A CUDA device's sm comes from its compute capability (needs the driver).
  static Target for_device(const Device& device, Execution execution);
  // The PTX target sm_`sm` without a GPU, for dumping code.
  static Target cuda_code(int sm);
  // What kernels compiled for this target may be shared under: "cpu|znver2 (...)", "cuda:0|sm_90".
  std::string cache_key() const;
};

} // namespace optjit
