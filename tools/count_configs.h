// The optimizer configurations PyTorch's OptimizerInfo lists (reference section C: CPU rows with a float lr),
// each beside the number of kernels Inductor generates for it on the CPU. `optjit counts` and the tests use them.
#pragma once

#include "frontend/optim/registry.h"

#include <optional>
#include <string>
#include <vector>

namespace optjit {

struct CountConfig {
  std::string optimizer; // torch's class name in lower case
  KeywordOptions options;
  double clip_norm_type = 0;  // 2 or infinity: the step clips its grads (clip_grad_norm_ fused); 0: it does not
  bool matrices_only = false; // steps the model's matrices alone (Muon refuses 1-D params, as torch's does)
};

std::vector<CountConfig> torch_optim_configs();
// The configurations of optjit's own optimizers, which torch.optim does not have (Lion): no Inductor count.
std::vector<CountConfig> own_optimizer_configs();

// Steps with reductions, which plan into several kernels: LAMB, LARS, and optimizers with fused grad-norm clipping
// (Inductor's counts for torch's optimizers with clip_grad_norm_ were measured, tools/inductor_clip_counts.py).
std::vector<CountConfig> reducing_configs();

// Steps that multiply matrices (Muon): kernels and library calls.
std::vector<CountConfig> matrix_configs();

// Inductor's kernels per step for a configuration on the CPU (reference: inductor-kernel-counts.md; clipped steps
// and Adafactor: measured with tools/inductor_clip_counts.py), or nothing where torch has no such step (optjit's own
// optimizers) or Inductor cannot compile it as one graph (single-tensor Adafactor).
std::optional<int> inductor_cpu_kernels(const CountConfig& config, bool foreach);

// "default", or the configuration's option names joined by commas.
std::string config_name(const KeywordOptions& options);

} // namespace optjit
