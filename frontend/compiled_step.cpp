#include "frontend/compiled_step.h"
#include "codegen/codegen.h"
#include "compiler/gpu_binding.h"
#include "compiler/guards.h"
#include "compiler/kernel_cache.h"
#include "runtime/log.h"
#include "compiler/pipeline.h"
#include "compiler/ir/printer.h"
#include "runtime/error.h"
#include "runtime/gpu_module.h"
#include "runtime/launch.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <chrono>

namespace optjit {

Stage parse_stage(std::string_view text) {
  if (text == "traced")
    return Stage::Traced;
  if (text == "optimized")
    return Stage::Optimized;
  if (text == "fused")
    return Stage::Fused;
  if (text == "llvm")
    return Stage::LLVM;
  if (text == "ptx")
    return Stage::PTX;
  throw Error("unknown stage '" + std::string(text) + "': expected traced, optimized, fused, llvm or ptx");
}

namespace {

struct BucketProgram {
  Optimizer::Bucket bucket; // every param of the bucket, with a grad or not
  PipelineResult pipeline;
  std::shared_ptr<CpuKernel> kernel;        // a bucket on the CPU
  std::shared_ptr<GpuModule> gpu_kernel;    // a bucket on a CUDA device
  Binding binding;          // the members whose grads were present at the last bind (CPU)
  GpuBinding gpu_binding;   // the same, in device memory (CUDA)
  bool launched = false;    // whether any member had a grad then
  int grad_slot = -1;       // the kernel's argument slot of the grads

  bool on_gpu() const { return bucket.device.kind == DeviceKind::cuda; }

  // The binding operations, on whichever table the bucket's device uses.
  void bind(const ListArguments& args, const LaunchShape& shape) {
    if (on_gpu())
      gpu_binding.bind(pipeline.kernels.front(), args, bucket.device.index);
    else
      binding.bind(pipeline.kernels.front(), args, shape);
  }
  void repoint_grad(int64_t entry, void* data) {
    if (on_gpu())
      gpu_binding.repoint(grad_slot, entry, data);
    else
      binding.repoint(grad_slot, entry, data);
  }
  void set_hyper(const std::vector<double>& hyper) {
    if (on_gpu())
      gpu_binding.set_hyper(hyper);
    else
      binding.set_hyper(hyper);
  }
  // Launches this step's kernel; returns the CUDA graphs it captured to do so.
  int64_t launch(bool cuda_graphs) {
    if (!on_gpu()) {
      launch_cpu_kernel(kernel->tensor_phase, kernel->element_phase, binding.args(), binding.tensor_grain(),
                        binding.item_grain());
      return 0;
    }
    const int64_t captured = gpu_binding.graph_captures();
    gpu_binding.launch(*gpu_kernel, cuda_graphs);
    return gpu_binding.graph_captures() - captured;
  }
};

// The PTX target of a CUDA device: its compute capability, as codegen supports it.
int device_sm(int device) {
  const cuda::DeviceProperties& p = cuda::properties(device);
  return gpu_target_sm(p.major, p.minor);
}

// The bucket's members whose grads are present now: the list its kernel walks this step.
Optimizer::Bucket members_with_grads(const Optimizer& opt, const Optimizer::Bucket& bucket) {
  Optimizer::Bucket present = bucket;
  std::erase_if(present.members, [&](const Optimizer::Member& m) { return !opt.flat_param(m.flat).grad().defined(); });
  return present;
}

// Compiled code for one set of guard facts, and the binding it last ran with.
struct Program {
  GuardFacts facts;
  std::vector<BucketProgram> buckets;
  bool bound = false;
  uint64_t bound_state_version = 0;
  std::vector<uint64_t> bound_param_layout; // per flat param: the layouts the binding holds
  std::vector<uint64_t> bound_grad_layout;
  std::vector<std::pair<int, int64_t>> entry_of_flat; // per flat param: (bucket, list entry), bucket -1 if none
};

// What changed in a step's arguments since the program's binding.
struct ArgumentChanges {
  const char* rebind_reason = nullptr; // non-null: the argument tables must be rebuilt
  std::vector<int64_t> replaced_grads; // otherwise: params whose grad buffer alone was replaced
};

std::string kernel_cache_key(const KernelPlan& plan) { return "cpu|" + print_kernel_plan(plan); }

std::string gpu_kernel_cache_key(const KernelPlan& plan, int device, int sm) {
  return fmt::format("cuda:{}|sm_{}|", device, sm) + print_kernel_plan(plan);
}

} // namespace

struct CompiledStep::Impl {
  Optimizer& opt;
  CompileOptions options;
  StepMetrics metrics;
  std::vector<std::unique_ptr<Program>> programs;
  Program* current = nullptr;
  GuardFacts facts; // reused every step
  uint64_t checked_slot_epoch = 0; // tensor_slot_epoch() when the current program's guards and binding last held
  ArgumentChanges changes;         // reused every step

  Impl(Optimizer& o, CompileOptions opts) : opt(o), options(std::move(opts)) {}

  void read_facts() {
    facts.params.resize(static_cast<std::size_t>(opt.param_count()));
    for (int64_t i = 0; i < opt.param_count(); ++i)
      facts.params[static_cast<std::size_t>(i)] = param_fact(*opt.flat_param(i).impl());
    const auto& groups = opt.param_groups();
    facts.groups.resize(groups.size());
    for (std::size_t g = 0; g < groups.size(); ++g)
      facts.groups[g] = opt.structure(groups[g]).key();
  }

  Program& program_for_facts() {
    if (current && current->facts == facts)
      return *current;
    for (auto& p : programs)
      if (p->facts == facts) {
        ++metrics.guard_cache_hits;
        return *(current = p.get());
      }
    return compile_program();
  }

  Program& compile_program() {
    auto start = std::chrono::steady_clock::now();
    if (metrics.compiles > 0) {
      const GuardFacts& before = current ? current->facts : programs.back()->facts;
      std::string reason = explain_guard_failure(before, facts);
      ++metrics.recompiles;
      metrics.recompile_reasons.push_back(reason);
      OPTJIT_LOG(recompiles, "{}: recompiling step #{}: {}", opt.name(), metrics.steps, reason);
    }
    ++metrics.compiles;
    auto program = std::make_unique<Program>();
    program->facts = facts;
    for (Optimizer::Bucket& bucket : opt.make_buckets(Optimizer::BucketMembers::All)) {
      BucketProgram bp;
      bp.pipeline = run_pipeline(opt.trace_bucket(bucket));
      OPTJIT_ASSERT(bp.pipeline.kernels.size() == 1, "a bucket fuses into one kernel");
      bool hit = false;
      const KernelPlan& plan = bp.pipeline.kernels.front();
      if (bucket.device.kind == DeviceKind::cuda) {
        const int device = bucket.device.index, sm = device_sm(device);
        bp.gpu_kernel = KernelCache<GpuModule>::global().get_or_compile(
            gpu_kernel_cache_key(plan, device, sm),
            [&] {
              const GpuKernelCode code = compile_gpu_kernel(plan, sm);
              return std::make_shared<GpuModule>(device, code.ptx, code.entry);
            },
            hit);
      } else {
        bp.kernel = KernelCache<CpuKernel>::global().get_or_compile(
            kernel_cache_key(plan), [&] { return compile_cpu_kernel(plan); }, hit);
      }
      ++(hit ? metrics.cache_hits : metrics.kernels_generated);
      OPTJIT_LOG(kernels, "{}: kernel {} for {} params ({}, {}, {})", opt.name(), hit ? "from cache" : "compiled",
                 bucket.members.size(), bucket.device.to_string(), dtype_name(bucket.dtype), bucket.structure_key);
      bp.bucket = std::move(bucket);
      program->buckets.push_back(std::move(bp));
    }
    metrics.compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (programs.size() >= options.max_variants) {
      OPTJIT_LOG(recompiles, "{}: {} compiled variants kept, dropping the oldest", opt.name(), options.max_variants);
      programs.erase(programs.begin());
    }
    programs.push_back(std::move(program));
    return *(current = programs.back().get());
  }

  // True when nothing a guard or the binding depends on changed since the last step: no grad or param buffer
  // anywhere was replaced, no state was created or replaced, and every group still has the structure the current
  // program was compiled for. O(groups): a steady-state step does not visit every param.
  bool unchanged_since_last_step(uint64_t slot_epoch) const {
    if (!current || !current->bound || checked_slot_epoch != slot_epoch ||
        current->bound_state_version != opt.state_version() ||
        current->facts.params.size() != static_cast<std::size_t>(opt.param_count()))
      return false;
    const auto& groups = opt.param_groups();
    if (groups.size() != current->facts.groups.size())
      return false;
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (opt.structure(groups[g]).key() != current->facts.groups[g])
        return false;
    return true;
  }

  // Validates the grads that changed since the program's last binding (before anything is mutated) and says what
  // the binding needs.
  void check_arguments(const Program& program, ArgumentChanges& changes) const {
    changes.replaced_grads.clear();
    const char* reason = !program.bound ? "first step of this variant"
                         : program.bound_state_version != opt.state_version() ? "optimizer state created or replaced"
                                                                               : nullptr;
    for (int64_t i = 0; i < opt.param_count(); ++i) {
      const TensorImpl& p = *opt.flat_param(i).impl();
      const TensorImpl* g = p.grad.get();
      const std::size_t at = static_cast<std::size_t>(i);
      // Layout ids are never 0, so a bound layout of 0 means the param was bound without a grad.
      const bool was_bound_with_grad = program.bound && program.bound_grad_layout[at] != 0;
      if (!g) {
        if (was_bound_with_grad && !reason)
          reason = "a grad became None";
        continue;
      }
      const bool same_param = program.bound && p.layout_id == program.bound_param_layout[at];
      if (same_param && g->layout_id == program.bound_grad_layout[at])
        continue;
      opt.check_grad(i);
      if (program.bound && !was_bound_with_grad && !reason)
        reason = "a grad appeared";
      if (!same_param && !reason)
        reason = "a param's data was replaced";
      changes.replaced_grads.push_back(i);
    }
    changes.rebind_reason = reason;
  }

  // Points the binding at grad buffers that replaced the bound ones (same shape, dtype and device: checked).
  void repoint_grads(Program& program, const std::vector<int64_t>& replaced) {
    OPTJIT_LOG(guards, "{}: {} grad buffer(s) replaced at step #{}, repointing them", opt.name(), replaced.size(),
               metrics.steps);
    for (int64_t i : replaced) {
      const TensorImpl& grad = *opt.flat_param(i).impl()->grad;
      const auto [bucket, entry] = program.entry_of_flat[static_cast<std::size_t>(i)];
      program.buckets[static_cast<std::size_t>(bucket)].repoint_grad(entry, grad.data);
      program.bound_grad_layout[static_cast<std::size_t>(i)] = grad.layout_id;
    }
    ++metrics.rebinds;
  }

  void bind(Program& program, const char* reason) {
    OPTJIT_LOG(guards, "{}: rebinding arguments at step #{}: {}", opt.name(), metrics.steps, reason);
    opt.ensure_state();
    program.entry_of_flat.assign(static_cast<std::size_t>(opt.param_count()), {-1, 0});
    for (std::size_t b = 0; b < program.buckets.size(); ++b) {
      BucketProgram& bp = program.buckets[b];
      const Optimizer::Bucket present = members_with_grads(opt, bp.bucket);
      bp.launched = !present.members.empty();
      if (!bp.launched)
        continue;
      bp.bind(opt.list_arguments(present), options.launch);
      const auto& slots = bp.pipeline.kernels.front().abi.tensor_slots;
      bp.grad_slot = static_cast<int>(std::find(slots.begin(), slots.end(), "grad") - slots.begin());
      OPTJIT_ASSERT(bp.grad_slot < static_cast<int>(slots.size()), "every optimizer kernel reads the grads");
      for (std::size_t t = 0; t < present.members.size(); ++t)
        program.entry_of_flat[static_cast<std::size_t>(present.members[t].flat)] = {static_cast<int>(b),
                                                                                   static_cast<int64_t>(t)};
    }
    program.bound_param_layout.assign(static_cast<std::size_t>(opt.param_count()), 0);
    program.bound_grad_layout.assign(static_cast<std::size_t>(opt.param_count()), 0);
    for (int64_t i = 0; i < opt.param_count(); ++i) {
      const TensorImpl& p = *opt.flat_param(i).impl();
      program.bound_param_layout[static_cast<std::size_t>(i)] = p.layout_id;
      program.bound_grad_layout[static_cast<std::size_t>(i)] = p.grad ? p.grad->layout_id : 0;
    }
    program.bound_state_version = opt.state_version();
    program.bound = true;
    ++metrics.rebinds;
  }

  void step() {
    auto start = std::chrono::steady_clock::now();
    const int64_t compiles_before = metrics.compiles;
    const uint64_t slot_epoch = tensor_slot_epoch();
    opt.check_hyperparameters();
    if (!unchanged_since_last_step(slot_epoch)) {
      read_facts();
      Program& checked = program_for_facts();
      check_arguments(checked, changes);
      if (changes.rebind_reason)
        bind(checked, changes.rebind_reason);
      else if (!changes.replaced_grads.empty())
        repoint_grads(checked, changes.replaced_grads);
      checked_slot_epoch = slot_epoch;
    }
    Program& program = *current;
    const std::vector<double> hyper = opt.hyper_values();
    for (BucketProgram& bp : program.buckets)
      if (bp.launched)
        bp.set_hyper(hyper);
    if (metrics.compiles == compiles_before)
      metrics.dispatch_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    for (BucketProgram& bp : program.buckets)
      if (bp.launched)
        metrics.graph_captures += bp.launch(options.cuda_graphs);
    ++metrics.steps;
  }

  Program& program_now() {
    read_facts();
    return program_for_facts();
  }
};

CompiledStep::CompiledStep(Optimizer& optimizer, CompileOptions options)
    : impl_(std::make_unique<Impl>(optimizer, std::move(options))) {}
CompiledStep::~CompiledStep() = default;
CompiledStep::CompiledStep(CompiledStep&&) noexcept = default;
CompiledStep& CompiledStep::operator=(CompiledStep&&) noexcept = default;

void CompiledStep::operator()() { impl_->opt.run_with_step_hooks([this] { impl_->step(); }); }

double CompiledStep::operator()(const Closure& closure) {
  return impl_->opt.run_with_step_hooks([this] { impl_->step(); }, closure);
}

int CompiledStep::kernel_count() {
  int count = 0;
  for (const BucketProgram& bp : impl_->program_now().buckets)
    if (!members_with_grads(impl_->opt, bp.bucket).members.empty())
      count += bp.pipeline.stats.kernels;
  return count;
}

std::string CompiledStep::dump(Stage stage, int gpu_sm) {
  std::string text;
  for (const BucketProgram& bp : impl_->program_now().buckets) {
    const int sm = gpu_sm ? gpu_sm : bp.on_gpu() ? device_sm(bp.bucket.device.index) : 80;
    const bool gpu_code = gpu_sm || bp.on_gpu();
    switch (stage) {
    case Stage::Traced:
      text += print_graph(bp.pipeline.traced);
      break;
    case Stage::Optimized:
      text += print_graph(bp.pipeline.optimized);
      break;
    case Stage::Fused:
      text += print_fused(bp.pipeline);
      break;
    case Stage::LLVM:
      text += gpu_code ? gpu_kernel_llvm_ir(bp.pipeline.kernels.front(), sm)
                       : cpu_kernel_llvm_ir(bp.pipeline.kernels.front());
      break;
    case Stage::PTX:
      text += compile_gpu_kernel(bp.pipeline.kernels.front(), sm).ptx;
      break;
    }
  }
  return text;
}

const StepMetrics& CompiledStep::metrics() const { return impl_->metrics; }

CompiledStep compile(Optimizer& optimizer, CompileOptions options) { return CompiledStep(optimizer, std::move(options)); }

} // namespace optjit
