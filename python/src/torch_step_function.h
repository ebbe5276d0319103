// @optjit.step_function's C++ side: a step function recorded in Python (torch's foreach calls on symbolic lists,
// python/optjit/_step_function.py) as a program of list ops, compiled with compile_step over zero-copy views of the
// caller's torch tensors. The program is replayed into the tracer whenever the step traces a bucket.
#pragma once

#include "frontend/optim/step_function.h"
#include "torch_tensors.h"

#include <nanobind/nanobind.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace optjit::python {

// One instruction of a recorded program: `op` over earlier instructions' results `inputs`; `name` (a slot or a
// hyperparameter) and `number` (a constant) where the op takes them. Ops: tensors, scalar_state, hyper, constant,
// the unary and binary ops of the IR by name (add, sub, mul, div, maximum, minimum, pow, lt, gt, eq, neg, sqrt, abs,
// sign, exp, log), torch's foreach forms add_scaled (self + alpha * other), lerp, addcmul and addcdiv, select, sum,
// max, norm, row_sum and col_sum (sums along dim -1 and -2, broadcast), extent ("numel", "n" for size(-1), "m" for
// size(-2)), and the effects store and store_scalar (their result is the stored value).
struct StepInstruction {
  std::string op;
  std::vector<int> inputs;
  std::string name;
  double number = 0;
};

class TorchStepFunction {
public:
  // `lists`: the slot names with their torch tensor lists, "param" and "grad" first; `scalar_lists`: the names of
  // lists of per-tensor scalars (one 1-element tensor per param); `rows_lists` and `cols_lists`: of lists of rows
  // ([..., m, 1]) and columns ([..., 1, n]) state; `hypers`: every hyperparameter's first value. `shard_reducer`
  // (None, or for tensors that are shards, FSDP2's DTensors) is CompileOptions::shard_reducer in Python:
  // shard_reducer(values, "sum" | "max") returns the list `values` combined over every process.
  TorchStepFunction(const std::string& name, std::vector<StepInstruction> program,
                    const std::vector<std::pair<std::string, nb::list>>& lists,
                    const std::vector<std::string>& scalar_lists, const std::vector<std::string>& rows_lists,
                    const std::vector<std::string>& cols_lists, const std::map<std::string, double>& hypers,
                    nb::object shard_reducer);

  // One step with these hyperparameters, in place on the tensors, without the GIL.
  void call(const std::map<std::string, double>& hypers);
  // New grad tensors (one per param, as after a backward with zero_grad(set_to_none=True)): the params' grads
  // point at them, which the step checks and repoints to without compiling again.
  void set_grads(nb::list grads);
  int kernel_count() { return step_->kernel_count(); }
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
