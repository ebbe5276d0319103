#include "compiler/compiled_step.h"
#include "compiler/backend.h"
#include "compiler/guards.h"
#include "compiler/program.h"
#include "compiler/program_binding.h"
#include "compiler/program_run.h"
#include "ir/printer.h"
#include "runtime/error.h"
#include "runtime/log.h"

#include <spdlog/fmt/fmt.h>

#include <chrono>
#include <optional>

namespace optjit {

struct CompiledStep::Impl {
  StepSource& source;
  CompileOptions options;
  StepMetrics metrics;
  std::vector<std::unique_ptr<Program>> programs;
  Program* current = nullptr;
  GuardFacts facts;                // reused every step
  uint64_t checked_slot_epoch = 0; // tensor_slot_epoch() when the current program's guards and binding last held
  ArgumentChanges changes;         // reused every step
  LayoutStaging staging;           // the params whose kernels run on contiguous copies, as last bound

  std::weak_ptr<const void> source_alive; // expires with the source
  std::string source_name;                // for the message once it has

  Impl(StepSource& s, CompileOptions opts)
      : source(s), options(std::move(opts)), source_alive(s.lifetime()), source_name(s.name()) {}

  // The state dtypes depend on the state itself, the params' dtypes and the groups' structures only: a step whose
  // grads alone were replaced (the usual case with zero_grad(set_to_none=True)) reuses the last ones.
  uint64_t state_facts_version = 0;
  bool state_facts_read = false;
  bool any_param_on_gpu = false; // at the last read_facts

  void read_facts() {
    // Updated in place, noting whether any fact changed (no copy of the last facts on this per-step path).
    bool changed = !state_facts_read || state_facts_version != source.state_version() ||
                   facts.params.size() != static_cast<std::size_t>(source.param_count()) ||
                   facts.groups.size() != static_cast<std::size_t>(source.group_count());
    facts.params.resize(static_cast<std::size_t>(source.param_count()));
    any_param_on_gpu = false;
    for (int64_t i = 0; i < source.param_count(); ++i) {
      const TensorImpl& param = *source.flat_param(i).impl();
      const uint32_t fact = param_fact(param);
      changed = changed || facts.params[static_cast<std::size_t>(i)] != fact;
      facts.params[static_cast<std::size_t>(i)] = fact;
      any_param_on_gpu = any_param_on_gpu || param.device.kind != DeviceKind::cpu;
    }
    facts.groups.resize(static_cast<std::size_t>(source.group_count()));
    for (int g = 0; g < source.group_count(); ++g)
      if (std::string key = source.group_structure_key(g); key != facts.groups[static_cast<std::size_t>(g)]) {
        facts.groups[static_cast<std::size_t>(g)] = std::move(key);
        changed = true;
      }
    if (std::vector<DeviceHyper> hypers = source.device_hypers(); hypers != facts.device_hypers) {
      facts.device_hypers = std::move(hypers);
      changed = true;
    }
    facts.grad_totals_may_stay_on_device = grad_totals_may_stay_on_device();
    if (changed) {
      facts.state_dtypes = source.state_dtype_facts();
      state_facts_version = source.state_version();
      state_facts_read = true;
    }
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
    // A compile that failed (an error in the trace, say) left no program: the next one is still the first.
    std::optional<std::string> recompile_reason;
    if (!programs.empty()) {
      recompile_reason = explain_guard_failure(current ? current->facts : programs.back()->facts, facts);
      OPTJIT_LOG(recompiles, "{}: recompiling step #{}: {}", source.name(), metrics.steps, *recompile_reason);
    }
    std::unique_ptr<Program> program = build_program(source, options, facts, metrics);
    ++metrics.compiles;
    if (recompile_reason) {
      ++metrics.recompiles;
      metrics.recompile_reasons.push_back(std::move(*recompile_reason));
    }
    metrics.compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (programs.size() >= options.max_variants) {
      OPTJIT_LOG(recompiles, "{}: {} compiled variants kept, dropping the oldest", source.name(), options.max_variants);
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
        current->bound_state_version != source.state_version() ||
        current->facts.params.size() != static_cast<std::size_t>(source.param_count()))
      return false;
    if (static_cast<std::size_t>(source.group_count()) != current->facts.groups.size())
      return false;
    for (int g = 0; g < source.group_count(); ++g)
      if (source.group_structure_key(g) != current->facts.groups[static_cast<std::size_t>(g)])
        return false;
    return source.device_hypers() == current->facts.device_hypers &&
           grad_totals_may_stay_on_device() == current->facts.grad_totals_may_stay_on_device;
  }

  // GuardFacts::grad_totals_may_stay_on_device, with the params read last (any_param_on_gpu).
  bool grad_totals_may_stay_on_device() const { return any_param_on_gpu && source.grad_totals_may_stay_on_device(); }

  void step() {
    const StepSource::Stepping exclusive(source);
    // Before any check: a skipped step reads and changes nothing else. A step whose kernels decide is asked on the
    // host too when the program that last ran could not read the flag on its device (the first step's too), or
    // combines its grad pass's totals on the host (whose norm must not see an inf step's grads).
    if (source.step_skipped() ||
        ((!current || !current->reads_hypers_on_device || (current->grad_pass.any() && !current->grad_total)) &&
         source.kernels_would_skip())) {
      ++metrics.steps;
      ++metrics.skipped_steps;
      return;
    }
    auto start = std::chrono::steady_clock::now();
    const int64_t compiles_before = metrics.compiles;
    const uint64_t slot_epoch = tensor_slot_epoch();
    source.check_hyperparameters();
    if (!unchanged_since_last_step(slot_epoch)) {
      read_facts();
      Program& checked = program_for_facts();
      check_arguments(source, checked, staging, changes);
      if (changes.rebind_reason)
        bind(source, checked, staging, changes.rebind_reason, metrics);
      else if (!changes.replaced_grads.empty())
        repoint_grads(source, checked, staging, changes.replaced_grads, metrics);
      checked_slot_epoch = slot_epoch;
    }
    Program& program = *current;
    // Where this step's clipping norm and coefficient will be, when they stay on the device: told before the
    // hyperparameters are read, since the update reads the coefficient there.
    const bool has_grad_pass = program.grad_pass.any();
    const bool totals_on_device = program.grad_total != nullptr; // the facts say the source allows it
    const bool norm_on_device = totals_on_device && program.grad_pass.clips;
    if (has_grad_pass)
      source.take_grad_totals_on_device(norm_on_device ? program.grad_total->total() : Tensor(),
                                        norm_on_device ? program.grad_total->coefficient() : Tensor());
    const Tensor norm_copy = norm_on_device ? source.grad_norm_copy() : Tensor();
    // Hyperparameters in tensors on the device stay there when the kernels read them there (no copy, no wait).
    const std::vector<DeviceHyper>& on_device = program.hypers_left_on_device;
    std::vector<double> hyper = source.hyper_values(on_device);
    const std::vector<const void*> hyper_addresses = source.device_hyper_addresses(on_device);
    if (metrics.compiles == compiles_before)
      metrics.dispatch_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (options.shard_reducer && has_grad_pass && source.reduces_grad_pass_over_processes())
      throw Error(fmt::format("{}: a step over shards (shard_reducer) combines its grad norm and inf check over the "
                              "processes itself, and the optimizer has its own grad norm or inf check reducer too: "
                              "they would combine twice; set one of them",
                              source.name()));
    staging.copy_in(source);
    if (totals_on_device) {
      run_grad_pass_on_device(program, hyper, hyper_addresses, source.clip_max_norm(), norm_copy,
                              source.found_inf_to_fill());
    } else if (has_grad_pass) {
      if (!source.take_grad_pass(
              run_grad_pass(program, hyper, hyper_addresses, options))) { // may throw: nothing is written yet
        ++metrics.steps; // an inf or NaN in the grads: the update does not run (staged copies are left unread)
        ++metrics.skipped_steps;
        return;
      }
      hyper = source.hyper_values(on_device); // with the step's clip coefficient
    }
    for (BucketProgram& bp : program.buckets)
      if (bp.launched) {
        bp.code->set_hyper_addresses(hyper_addresses);
        bp.code->set_hyper(hyper);
      }
    launch_program(program, options, source.name(), metrics);
    staging.copy_out(source, program.writes_grads); // staged params are CPU params: their launches have finished
    source.after_step();
    ++metrics.steps;
  }

  Program& program_now() {
    read_facts();
    return program_for_facts();
  }
};

CompiledStep::CompiledStep(StepSource& source, CompileOptions options)
    : impl_(std::make_unique<Impl>(source, std::move(options))) {}
CompiledStep::~CompiledStep() = default;
CompiledStep::CompiledStep(CompiledStep&&) noexcept = default;
CompiledStep& CompiledStep::operator=(CompiledStep&&) noexcept = default;

CompiledStep::Impl& CompiledStep::live() const {
  if (!impl_)
    throw Error("this compiled step was moved from: call the CompiledStep it was moved to");
  if (impl_->source_alive.expired())
    throw Error("the optimizer this step was compiled from (" + impl_->source_name +
                ") has been destroyed: compile a step from a live optimizer");
  return *impl_;
}

void CompiledStep::operator()() {
  Impl& impl = live();
  impl.source.run_with_step_hooks([&impl] { impl.step(); });
}

double CompiledStep::operator()(const std::function<double()>& closure) {
  Impl& impl = live();
  return impl.source.run_with_step_hooks([&impl] { impl.step(); }, closure);
}

void CompiledStep::update() { live().step(); }

int CompiledStep::kernel_count() {
  int count = 0;
  Impl& impl = live();
  const Program& program = impl.program_now();
  for (const BucketProgram& bp : program.buckets)
    if (!members_with_grads(impl.source, bp.bucket).members.empty()) {
      count += backend_for(bp.target).kernel_count(bp.pipeline);
      if (bp.grad_pass_pipeline)
        count += backend_for(bp.target).kernel_count(*bp.grad_pass_pipeline);
    }
  if (program.grad_total)
    ++count; // the grad total's, launched whether or not any bucket is
  return count;
}

int CompiledStep::library_call_count() {
  int count = 0;
  Impl& impl = live();
  for (const BucketProgram& bp : impl.program_now().buckets)
    if (!members_with_grads(impl.source, bp.bucket).members.empty())
      count += bp.pipeline.stats.library_calls;
  return count;
}

std::string CompiledStep::dump(Stage stage, int gpu_sm) {
  std::string text;
  for (const BucketProgram& bp : live().program_now().buckets) {
    switch (stage) {
    case Stage::Traced:
      text += print_graph(bp.pipeline.traced);
      break;
    case Stage::Optimized:
      text += print_graph(bp.pipeline.optimized);
      if (const Graph* host = bp.code ? bp.code->host_graph() : nullptr)
        text += "; run on the host before each launch (its scalar state is held there):\n" + print_graph(*host);
      break;
    case Stage::Fused:
      if (bp.grad_pass_pipeline)
        text += print_fused(*bp.grad_pass_pipeline);
      text += print_fused(bp.pipeline);
      break;
    case Stage::LLVM:
    case Stage::PTX: {
      const Target target = code_target(bp.target, stage, gpu_sm);
      if (bp.grad_pass_pipeline)
        text += backend_for(target).code(*bp.grad_pass_pipeline, target, stage);
      text += backend_for(target).code(bp.pipeline, target, stage);
      break;
    }
    }
  }
  return text;
}

const StepMetrics& CompiledStep::metrics() const {
  if (!impl_)
    throw Error("this compiled step was moved from: call the CompiledStep it was moved to");
  return impl_->metrics; // a record of what happened: readable after the optimizer is gone
}

CompiledStep compile(StepSource& source, CompileOptions options) { return CompiledStep(source, std::move(options)); }

} // namespace optjit
