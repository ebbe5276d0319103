// exp, log and pow in double precision as LLVM IR functions, for targets without a libm (NVPTX: the driver has no
// libdevice to link). Each is accurate to a few ulp over the whole range, with IEEE special values (NaN, +-inf,
// zero, subnormals); pow's error grows with |y * log(x)| (about 1e-14 relative at |y * log(x)| = 100).
#pragma once

#include "codegen/llvm.h"

namespace optjit {

struct DeviceMath {
  llvm::Function* exp;
  llvm::Function* log;
  llvm::Function* pow;
};

// Defines the three functions (double -> double, internal linkage) in `module`, once.
DeviceMath define_device_math(llvm::Module& module);

} // namespace optjit
