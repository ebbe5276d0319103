// A step's compiled program: for one set of guard facts, each bucket's pipeline (and grad pass), its code on the
// bucket's target, and the binding the code last ran with. build_program traces, plans and compiles every bucket of
// a step source (every kernel of the step compiled at once, then loaded from the kernel cache); compiler/
// program_binding.h binds it to a step's arguments and compiler/program_run.h runs it. The driver
// (compiler/compiled_step.cpp) keeps one per guard facts it met.
#pragma once

#include "compiler/backend.h"
#include "compiler/compile_options.h"
#include "compiler/guards.h"
#include "compiler/metrics.h"
#include "compiler/step_source.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace optjit {

// One bucket of a program: its params, target, pipeline and code (and its grad pass's).
struct BucketProgram {
  ParamBucket bucket; // every param of the bucket, with a grad or not
  Target target;
  PipelineResult pipeline;
  std::unique_ptr<Executable> code; // the pipeline's kernels on the target, bound to the members with grads
  std::string grad_slot;            // the slot of role grad: what a replaced grad buffer repoints
  bool launched = false;            // whether any member had a grad at the last bind
  // The bucket's grad pass (compiler/grad_pass.h: clipping's norm, the inf check), run before the update.
  std::optional<PipelineResult> grad_pass_pipeline;
  std::unique_ptr<Executable> grad_pass_code;
};

// The bucket's members whose grads are present now: the list its kernel walks this step.
ParamBucket members_with_grads(const StepSource& source, const ParamBucket& bucket);

// Compiled code for one set of guard facts, and the binding it last ran with.
struct Program {
  GuardFacts facts;
  std::vector<BucketProgram> buckets;
  bool bound = false;
  uint64_t bound_state_version = 0;
  std::vector<uint64_t> bound_param_layout; // per flat param: the layouts the binding holds
  std::vector<uint64_t> bound_grad_layout;
  std::vector<std::pair<int, int64_t>> entry_of_flat; // per flat param: (bucket, list entry), bucket -1 if none
  // The buckets run in phases (launch_in_phases): the traced program has list reductions and several buckets, each
  // list reduction combined over every bucket's tensors (a list is every param of the step, whatever its dtype or
  // device), or it steps shards and reduces (CompileOptions::shard_reducer).
  bool runs_in_phases = false;
  // The kernels read facts.device_hypers on the device (KernelPlan::hypers_on_device): every bucket runs on their
  // device in GPU kernels, with no scalar state on the host and no matrix product taking one as alpha or beta.
  // Otherwise, or with none, each step copies their values to the host.
  bool reads_hypers_on_device = false;
  // The hyperparameters the kernels read on the device, which a step leaves there (StepSource::hyper_values'
  // `left_on_device`): facts.device_hypers when reads_hypers_on_device, and the clip coefficient with grad_total.
  std::vector<DeviceHyper> hypers_left_on_device;
  // The grad pass's totals made on the device, where they may stay there (a step on one GPU whose source decides
  // nothing from them on the host): the update reads the clip coefficient and found_inf there, and the host never
  // waits for the norm or the in-step check. Null where the host combines the carried values.
  std::unique_ptr<DeviceGradTotal> grad_total;
  // What the step described beside its buckets (StepDescription): its grad pass, and what layout staging reads.
  GradPass grad_pass;
  std::vector<bool> walks_rows_and_columns;
  bool writes_grads = false;
};

// How the buckets' runs pause: at per-tensor reductions too when the step is over shards (options.shard_reducer).
Executable::Pauses pauses_of(const CompileOptions& options);

// Traces and plans every bucket of `source` for `facts`, compiles every kernel of the step (several at once), and
// loads each bucket's code; counts kernels compiled and found in the cache into `metrics`. Throws optjit::Error
// before anything runs when the step cannot be compiled (it stores nothing, its buckets would pause differently, it
// reads what shards cannot give).
std::unique_ptr<Program> build_program(StepSource& source, const CompileOptions& options, const GuardFacts& facts,
                                       StepMetrics& metrics);

} // namespace optjit
