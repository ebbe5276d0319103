// The driver: compile(source) makes a step source's step (an optimizer's) a callable. Each call checks the compile
// guards (dtypes, devices, each group's structure), traces and compiles on a miss (logging why with
// OPTJIT_LOG=recompiles), rebinds when a grad appeared or became None or a grad, param or state buffer was
// replaced, writes this step's hyperparameters and launches each bucket's kernels on the backend its Target picks
// (compiler/backend.h). Hyperparameter values are arguments: changing lr never recompiles. Eager steps run through
// the same driver with Execution::Interpreted.
//
// Lifetime: a compiled step refers to its source (the optimizer) without owning it, and holds neither its params nor
// its state alive (the kernel cache holds code only). Once the optimizer is destroyed, every call throws
// optjit::Error saying so; so does every call on a moved-from step.
#pragma once

#include "compiler/compile_options.h"
#include "compiler/metrics.h"
#include "compiler/step_source.h"

#include <functional>
#include <memory>
#include <string>

namespace optjit {

class CompiledStep {
public:
  CompiledStep(StepSource& source, CompileOptions options = {});
  ~CompiledStep();
  CompiledStep(CompiledStep&&) noexcept;
  CompiledStep& operator=(CompiledStep&&) noexcept;

  // One step, between the source's step hooks. Throws before anything changes when a grad or hyperparameter is
  // invalid.
  void operator()();
  // torch's step(closure): the closure runs eagerly after the pre hooks (it sets the grads), then the compiled
  // step; returns the closure's loss.
  double operator()(const std::function<double()>& closure);
  // The update alone, without the step hooks (the source runs them itself around it).
  void update();
  // Kernels launched per step with the grads present now (compiles for them if needed; runs nothing).
  int kernel_count();
  // The matrix products one step runs in the matrix library (runtime/gemm.h) between its kernels, counted once per
  // product of a bucket's graph (each runs for every param of the bucket, params of one shape and group batched).
  int library_call_count();
  // A stage of the code of every bucket, as text. LLVM IR and PTX are for the bucket's target (a CUDA device's
  // compute capability), or for the GPU target sm_`gpu_sm` (80 or 90) when it is given: PTX needs no GPU.
  // Stage::PTX of a CPU bucket without gpu_sm is for sm_80.
  std::string dump(Stage stage, int gpu_sm = 0);
  const StepMetrics& metrics() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Impl& live() const; // throws when moved from or when the source is gone
};

CompiledStep compile(StepSource& source, CompileOptions options = {});

} // namespace optjit
