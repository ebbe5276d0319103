// Scalar state held on the host: params on a device whose scalar state (step counts, NAdam's mu_product) lives in
// host memory, as torch keeps it for steps that are not capturable. torch updates such state on the host and hands
// the kernels plain numbers; so does this: before each launch the host evaluates the step's scalar-state updates
// (the part of the graph that computes them, which reads only scalar state and hyperparameters) in place on the
// host tensors, and the device kernels read a device copy of the values from before the update (uploaded
// asynchronously on the launch stream, no host wait), compute what they need from them as usual, and write their
// own results to that copy, where nothing reads them.
#pragma once

#include "compiler/backend.h"

#include <memory>

namespace optjit {

// `device_code` (the kernels of `graph` for params on `device`), run with some scalar-state slots of its arguments
// on the host: bind() takes arguments whose scalar-state tensors are host tensors (such a slot is held on the host)
// or device tensors (the kernels update those, as always), and each start() updates the host ones as one step
// does, before the kernels run.
std::unique_ptr<Executable> with_scalar_state_on_host(std::unique_ptr<Executable> device_code, const Graph& graph,
                                                      Device device);

} // namespace optjit
