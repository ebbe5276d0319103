// What a compiled step did, for users and tests: how often it traced and compiled, why it recompiled, how often
// it rebound arguments and how often the kernel cache answered.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace optjit {

struct StepMetrics {
  int64_t steps = 0;
  int64_t compiles = 0;          // traces + pipeline runs (guard misses, the first included)
  int64_t recompiles = 0;        // compiles after the first, each with a reason
  int64_t kernels_generated = 0; // kernels LLVM compiled for this step
  int64_t cache_hits = 0;        // kernels found in the process-wide kernel cache instead
  int64_t rebinds = 0;           // steps that rebuilt or repointed argument tables (a grad, param or state
                                 // buffer replaced, state created)
  int64_t guard_cache_hits = 0;  // guard misses answered by an earlier compiled variant
  int64_t skipped_steps = 0;     // steps a gradient scaler's found_inf skipped (they count in `steps` too)
  int64_t graph_captures = 0;    // CUDA graphs captured (CompileOptions::cuda_graphs): one per staging slot per bind
  int64_t staged_params = 0;     // params the last binding staged: their kernels run on contiguous copies
  double compile_ms = 0;         // total time spent tracing and compiling
  double dispatch_ms = 0;        // host time of steps that did not compile, before their launches: guards,
                                 // argument checks, binding and hyperparameters
  std::vector<std::string> recompile_reasons;

  std::string summary() const; // "compiles=1 recompiles=0 rebinds=1 kernels=1"
};

} // namespace optjit
