// The one backend interface: a backend turns a bucket's pipeline result into an Executable for a Target, and shows
// its code. The driver (compiler/compiled_step.cpp) calls only this; the CPU (ORC), GPU (PTX + driver) and
// interpreter backends implement it, one file each.
#pragma once

#include "compiler/compile_options.h"
#include "compiler/pipeline.h"
#include "compiler/step_source.h"
#include "compiler/target.h"
#include "ir/arguments.h"
#include "runtime/error.h"

#include <memory>
#include <string>
#include <vector>

namespace optjit {

// A bucket's code on one target, bound to that step's arguments.
class Executable {
public:
  virtual ~Executable() = default;
  // Builds the argument tables from `args` (slots by name, hyperparameters by group).
  virtual void bind(const ListArguments& args) = 0;
  // Points slot `slot` of list entry `entry` at `tensor` (same shape, dtype and device as the one bound).
  virtual void repoint(const std::string& slot, int64_t entry, const Tensor& tensor) = 0;
  // This step's hyperparameters, per group, in the bound ListArguments' hyper_names order.
  virtual void set_hyper(const std::vector<double>& values_by_group) = 0;
  // Where the plan's kernels read hyperparameters on the device (KernelPlan::hypers_on_device): per group, in the
  // same order, each one's device address, null for a number (set_hyper's value then). Only a GPU executable's
  // plans read any; given before set_hyper.
  virtual void set_hyper_addresses(const std::vector<const void*>& addresses_by_group) {
    OPTJIT_ASSERT(addresses_by_group.empty(), "only GPU kernels read hyperparameters on the device");
  }
  // Runs the step's kernels, in order, over the bound arguments; a list reduction combines over this list alone.
  void launch() {
    std::vector<ListPartials> pending;
    start(Pauses::ListReductions);
    while (advance(pending))
      combine_each_over_list(pending);
  }
  // Where a run in phases pauses: at list reductions, or, in a run over shards of tensors that other processes hold
  // the rest of (CompileOptions::shard_reducer), at per-tensor reductions too, whose values are partials then.
  enum class Pauses { ListReductions, ShardReductionsToo };
  // The same run in phases, so that list reductions can combine over several executables' lists (the driver's
  // buckets): start(), then advance() until it returns false. Each advance runs up to the next pause, list
  // reductions (or, over shards, reductions: `pauses`), returning true, with each one's per-entry operands in
  // `pending`, which the caller combines in place before the next advance, which goes on with them; or to the end,
  // returning false.
  virtual void start(Pauses pauses) = 0;
  virtual bool advance(std::vector<ListPartials>& pending) = 0;
  // After a launch: the plan's carried value `name` (a carry store of the traced graph itself), one per list entry.
  virtual std::vector<double> carried(const std::string& name) const = 0;
  // Where a GPU executable keeps carried value `name` in device memory once bound (its carry buffer: n_tensors rows
  // of n_carry f64), for a kernel that reads it there (DeviceGradTotal); buffer 0 on other backends.
  struct CarryOnDevice {
    uint64_t buffer = 0;
    int64_t n_tensors = 0, n_carry = 0, column = 0;
  };
  virtual CarryOnDevice carried_on_device(const std::string& name) const {
    (void)name;
    return {};
  }
  // CUDA graphs captured so far (CompileOptions::cuda_graphs).
  virtual int64_t graph_captures() const { return 0; }
  // The graph the host runs before each launch, once bound (scalar state held on the host:
  // compiler/backends/host_scalar_state.h), or null when the host runs none. CompiledStep::dump shows it.
  virtual const Graph* host_graph() const { return nullptr; }
};

// A grad pass's totals made where its kernels ran (a GPU: codegen's grad total kernel), so that the host never waits
// for them: the total norm of every bucket's grads and the clip coefficient, and the in-step inf check's finding,
// combined from each grad pass's carried values in device memory and written to device memory, in the same stream
// order as the launches around them.
class DeviceGradTotal {
public:
  virtual ~DeviceGradTotal() = default;
  // Each bucket's grad pass (bound; in the order they combine) and its grads' dtype, whose 2-norms round to it.
  virtual void bind(const std::vector<const Executable*>& grad_passes, const std::vector<Dtype>& grad_dtypes) = 0;
  // Queues the combine after the grad passes' launches. With a norm: the total norm into total() (and into
  // `norm_copy` too when it is defined: an f64 1-element tensor on the device) and the coefficient
  // min(max_norm / (total + 1e-6), 1) into coefficient(). With the check: 1 into `found_inf` (f32, on the device)
  // when a grad holds an inf or NaN; nothing otherwise.
  virtual void launch(double max_norm, const Tensor& norm_copy, const Tensor& found_inf) = 0;
  // f64 1-element tensors on the device, as the last launch left them.
  virtual const Tensor& total() const = 0;
  virtual const Tensor& coefficient() const = 0;
};

class Backend {
public:
  virtual ~Backend() = default;
  // The code of `pipeline` for `target`, from the process-wide kernel cache when it holds it (`cache_hit` says).
  virtual std::unique_ptr<Executable> load(const PipelineResult& pipeline, const Target& target,
                                           const CompileOptions& options, bool& cache_hit) const = 0;
  // The part of compiling one kernel that may run beside other kernels' (the driver prepares every kernel of a step
  // at once, then loads): the CPU backend compiles the kernel into the kernel cache, the GPU backend its PTX (loading
  // the module stays with load(), on the thread whose CUDA context it needs). Returns whether the kernel cache held
  // the kernel already; the interpreter has nothing to compile.
  virtual bool prepare(const KernelPlan& plan, const Target& target) const = 0;
  // Kernels launched per step.
  virtual int kernel_count(const PipelineResult& pipeline) const { return pipeline.stats.kernels; }
  // The carries a run of `pipeline` pauses at (Executable::advance), in order: per pause, each one's kind and how it
  // combines over shards (`pauses` as the run's). Buckets whose lists combine together must pause alike.
  virtual std::vector<std::vector<PausedCarry>> pauses(const PipelineResult& pipeline, Executable::Pauses pauses) const;
  // The grad total of `pass` for a step whose buckets all run on `target` (a GPU); null where the backend has none
  // (the host combines the carried values then).
  virtual std::unique_ptr<DeviceGradTotal> grad_total(const Target& target, const GradPass& pass) const {
    (void)target;
    (void)pass;
    return nullptr;
  }
  // The code as text: Stage::LLVM or Stage::PTX (throws optjit::Error for a stage the backend has no code for).
  virtual std::string code(const PipelineResult& pipeline, const Target& target, Stage stage) const = 0;
};

const Backend& backend_for(const Target& target);
// The key of `plan`'s compiled kernel for `target` in the process-wide kernel caches: the target and the plan's text
// (no addresses, sizes or hyperparameter values), so that kernels of the same structure are one.
std::string kernel_cache_key(const KernelPlan& plan, const Target& target);
const Backend& cpu_backend();
const Backend& gpu_backend();
const Backend& interpreter_backend();

} // namespace optjit
