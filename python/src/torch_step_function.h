// @optjit.step_function's C++ side: a step function recorded from Python (torch's calls on symbolic lists,
// python/optjit/_step_recording.py) into a StepRecording, compiled with compile_step over zero-copy views of the
// caller's torch tensors. The recording is replayed into the tracer whenever the step traces a bucket.
#pragma once

#include "frontend/optim/step_function.h"
#include "frontend/trace/step_recording.h"
#include "torch_tensors.h"

#include <nanobind/nanobind.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace optjit::python {

class TorchStepFunction {
public:
  // `lists`: the slot names with their torch tensor lists, "param" and "grad" first, each what the recording read it
  // as (per-tensor scalars, one 1-element tensor per param; rows, [..., m, 1]; columns, [..., 1, n]; or one tensor
  // like each param); `hypers`: every hyperparameter's first value. `shard_reducer`
  // (None, or for tensors that are shards, FSDP2's DTensors) is CompileOptions::shard_reducer in Python:
  // shard_reducer(values, "sum" | "max") returns the list `values` combined over every process.
  TorchStepFunction(const StepRecording& recording, const std::vector<std::pair<std::string, nb::list>>& lists,
                    const std::map<std::string, double>& hypers, nb::object shard_reducer);

  // One step with these hyperparameters, in place on the tensors, without the GIL.
  void call(const std::map<std::string, double>& hypers);
  // New grad tensors (one per param, as after a backward with zero_grad(set_to_none=True)): the params' grads
  // point at them, which the step checks and repoints to without compiling again.
  void set_grads(nb::list grads);
  int kernel_count() { return step_->kernel_count(); }
  int library_call_count() { return step_->library_call_count(); }
  std::string dump(const std::string& stage, int gpu_sm) { return step_->dump(parse_stage(stage), gpu_sm); }
  int64_t compiles() const { return step_->metrics().compiles; }

private:
  TorchTensors torch_;
  // The torch tensors the views point into, but the grads: those are the caller's to free (zero_grad() does, before
  // the next backward). Between calls nothing reads the grads' views, and a call with grads of another address or
  // layout sets them again first (set_grads; the Python side compares address, shape, strides, dtype and device).
  std::vector<nb::object> held_;
  nb::object shard_reducer_; // held here: the step's CompileOptions::shard_reducer calls it
  std::string name_;
  // The views of every list (its params the step's own: their grads are what it reads), checked again with new grads
  // (check_distinct_memory).
  StepLists lists_;
  std::optional<StepFunction> step_;
};

} // namespace optjit::python
