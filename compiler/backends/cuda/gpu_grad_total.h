// The GPU backend's DeviceGradTotal (compiler/backend.h): codegen's grad total kernel, loaded on the target's device
// and launched on its stream after the grad passes, over a descriptor of their carry buffers in device memory.
#pragma once

#include "compiler/backend.h"

#include <memory>

namespace optjit {

std::unique_ptr<DeviceGradTotal> make_gpu_grad_total(const Target& target, const GradPass& pass);

} // namespace optjit
