// The host side of GPU emulation (codegen.h's EmulatedGpuKernel): the hooks an emulated kernel calls for its
// thread and block registers and its barrier, answered per host thread.
#pragma once

#include "codegen/kernel_emitter.h"

namespace optjit {

const GpuEmulationHooks& gpu_emulation_hooks();

} // namespace optjit
