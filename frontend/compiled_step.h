// compile(optimizer): the optimizer's step as a callable. Each call checks the compile guards (dtypes, devices,
// each group's structure), traces and compiles on a miss (logging why with OPTJIT_LOG=recompiles), rebinds when a
// grad appeared or became None or a grad, param or state buffer was replaced, writes this step's
// hyperparameters and launches one kernel per (device, dtype, structure) bucket. Hyperparameter values are
// arguments: changing lr never recompiles.
#pragma once

#include "compiler/binding.h"
#include "compiler/metrics.h"
#include "frontend/optim/optimizer.h"

#include <memory>
#include <string>
#include <string_view>

namespace optjit {

enum class Stage { Traced, Optimized, Fused, LLVM, PTX };
// "traced", "optimized", "fused", "llvm", "ptx"; throws optjit::Error otherwise.
Stage parse_stage(std::string_view text);

struct CompileOptions {
  LaunchShape launch;
  std::size_t max_variants = 8; // compiled variants kept per step (guard sets seen); the oldest goes first
  bool cuda_graphs = false;      // GPU buckets: replay a captured CUDA graph of the step, re-captured on rebind
};

class CompiledStep {
public:
  CompiledStep(Optimizer& optimizer, CompileOptions options = {});
  ~CompiledStep();
  CompiledStep(CompiledStep&&) noexcept;
  CompiledStep& operator=(CompiledStep&&) noexcept;

  // One optimizer step, between the optimizer's step hooks. Throws before anything changes when a grad or
  // hyperparameter is invalid.
  void operator()();
  // torch's step(closure): the closure runs eagerly after the pre hooks (it sets the grads), then the compiled
  // step; returns the closure's loss.
  double operator()(const Closure& closure);
  // Kernels launched per step with the grads present now (compiles for them if needed; runs nothing).
  int kernel_count();
  // A stage of the code of every bucket, as text. LLVM IR and PTX are for where the bucket's params live (a CUDA
  // device's compute capability), or for the GPU target sm_`gpu_sm` (80 or 90) when it is given: PTX needs no
  // GPU. Stage::PTX of a CPU bucket without gpu_sm is for sm_80.
  std::string dump(Stage stage, int gpu_sm = 0);
  const StepMetrics& metrics() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

CompiledStep compile(Optimizer& optimizer, CompileOptions options = {});

} // namespace optjit
