// Running a bound program: every bucket's kernels, or all of them in phases when list reductions combine over the
// buckets or a step over shards combines its reductions over the processes; and the grad pass with its totals.
#pragma once

#include "compiler/program.h"

#include <string>
#include <vector>

namespace optjit {

// Launches every bucket with a grad, in phases when the program runs so; counts CUDA graph captures.
void launch_program(Program& program, const CompileOptions& options, const std::string& name, StepMetrics& metrics);
// Every bucket's grad pass, then the totals over all of them (and over the processes, with a shard reducer): every
// tensor's norm contribution combined in bucket order, then list order, so the result does not depend on the thread
// count. `hyper_addresses`: where the kernels read hyperparameters on the device (Executable::set_hyper_addresses).
StepSource::GradPassTotals run_grad_pass(Program& program, const std::vector<double>& hyper,
                                         const std::vector<const void*>& hyper_addresses,
                                         const CompileOptions& options);

// The same where the totals stay on the device (Program::grad_total): every bucket's grad pass, then the grad total
// over them (clipping's `max_norm`; the total norm also into `norm_copy` when defined; the check's finding into
// `found_inf`), queued, never read back.
void run_grad_pass_on_device(Program& program, const std::vector<double>& hyper,
                             const std::vector<const void*>& hyper_addresses, double max_norm, const Tensor& norm_copy,
                             const Tensor& found_inf);

} // namespace optjit
