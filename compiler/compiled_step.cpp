#include "compiler/compiled_step.h"
#include "compiler/backend.h"
#include "compiler/backends/host_scalar_state.h"
#include "compiler/guards.h"
#include "compiler/pipeline.h"
#include "ir/printer.h"
#include "runtime/concurrent_jobs.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/thread_pool.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

namespace optjit {

namespace {

struct BucketProgram {
  ParamBucket bucket; // every param of the bucket, with a grad or not
  Target target;
  PipelineResult pipeline;
  std::unique_ptr<Executable> code; // the pipeline's kernels on the target, bound to the members with grads
  std::string grad_slot;            // the slot of role grad: what a replaced grad buffer repoints
  bool launched = false;            // whether any member had a grad at the last bind
  // The bucket's grad pass (StepSource::trace_grad_pass: clipping's norm, the inf check), run before the update.
  std::optional<PipelineResult> grad_pass_pipeline;
  std::unique_ptr<Executable> grad_pass_code;
};

// The bucket's members whose grads are present now: the list its kernel walks this step.
ParamBucket members_with_grads(const StepSource& source, const ParamBucket& bucket) {
  ParamBucket present = bucket;
  std::erase_if(present.members, [&](const BucketMember& m) { return !source.flat_param(m.flat).grad().defined(); });
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
  // The buckets run in phases (launch_in_phases): the traced program has list reductions and several buckets, each
  // list reduction combined over every bucket's tensors (a list is every param of the step, whatever its dtype or
  // device), or it steps shards and reduces (CompileOptions::shard_reducer).
  bool runs_in_phases = false;
};

// "the f32 params on cpu", and the flags of its structure key that `other`'s lacks ("with normed=1").
std::string describe_bucket(const ParamBucket& bucket, const ParamBucket& other) {
  std::string text = fmt::format("the {} params on {}", dtype_name(bucket.dtype), bucket.device.to_string()), flags;
  const std::string others = "," + other.structure_key + ",";
  std::size_t begin = 0;
  while (begin < bucket.structure_key.size()) {
    std::size_t end = bucket.structure_key.find(',', begin);
    end = end == std::string::npos ? bucket.structure_key.size() : end;
    const std::string flag = bucket.structure_key.substr(begin, end - begin);
    if (others.find("," + flag + ",") == std::string::npos)
      flags += (flags.empty() ? " with " : ", ") + flag;
    begin = end + 1;
  }
  return text + flags;
}

std::string describe_pauses(const std::vector<std::vector<PausedCarry>>& pauses) {
  std::string text;
  for (const std::vector<PausedCarry>& pause : pauses)
    for (const PausedCarry& paused : pause) {
      std::string_view what = is_list_carry(paused.kind)           ? op_name(list_reduction_op(paused.kind))
                              : paused.shards == ShardCombine::Sum ? "reduce_sum"
                                                                   : "reduce_max";
      text += std::string(text.empty() ? "" : ", ") + std::string(what);
    }
  return text.empty() ? "none" : text;
}

// Every bucket of a step whose lists span buckets must reach the same list reductions in the same order, since each
// is combined over all of them, and so must the buckets of a step over shards (every process combines its
// reductions in one call per pause); checked when the program is compiled, before anything runs. Returns whether the
// buckets run in phases.
bool check_pauses_match(const std::string& name, const std::vector<BucketProgram>& buckets, Executable::Pauses kind) {
  std::vector<std::vector<std::vector<PausedCarry>>> pauses;
  bool any = false;
  for (const BucketProgram& bp : buckets) {
    pauses.push_back(backend_for(bp.target).pauses(bp.pipeline, kind));
    any = any || !pauses.back().empty();
  }
  if (!any || (buckets.size() < 2 && kind == Executable::Pauses::ListReductions))
    return false;
  for (std::size_t b = 1; b < buckets.size(); ++b)
    if (pauses[b] != pauses[0])
      throw Error(fmt::format("{}: a list reduction (list_sum, list_max) combines over every param of the step, and "
                              "a step over shards combines its reductions over every process, so every bucket must "
                              "trace the same ones in the same order, but {} reach {} and {} reach {}: give the "
                              "groups the options that change what the step traces alike",
                              name, describe_bucket(buckets[0].bucket, buckets[b].bucket), describe_pauses(pauses[0]),
                              describe_bucket(buckets[b].bucket, buckets[0].bucket), describe_pauses(pauses[b])));
  return true;
}

// A step over shards (CompileOptions::shard_reducer) combines its per-tensor reductions over the processes; a
// tensor's size and its rows and columns span the shards as well, and this process sees its own shard's alone:
// throws optjit::Error naming the first node or slot that reads them.
void check_shardable(const std::string& name, const Graph& graph) {
  const auto refuse = [&](const std::string& what) {
    throw Error(fmt::format("{}: a step over shards (each process steps its part of every tensor, as under FSDP2) "
                            "combines its sums and maxima over the processes, but {} spans the shards too, and "
                            "each process sees its own shard's alone: step such tensors whole",
                            name, what));
  };
  for (const Slot& slot : graph.slots)
    if (slot.kind == SlotKind::Rows || slot.kind == SlotKind::Cols)
      refuse(fmt::format("'{}', a {} state,", slot.name, slot.kind == SlotKind::Rows ? "rows" : "columns"));
  for (ValueId id = 0; id < graph.size(); ++id)
    if (const Op op = graph.node(id).op; op == Op::extent)
      refuse("a tensor's size (numel, size(-1), size(-2))");
    else if (op_has_trait(op, kAxis))
      refuse(fmt::format("{} (a sum along rows or columns)", op_name(op)));
}

// What changed in a step's arguments since the program's binding.
struct ArgumentChanges {
  const char* rebind_reason = nullptr; // non-null: the argument tables must be rebuilt
  std::vector<int64_t> replaced_grads; // otherwise: params whose grad buffer alone was replaced
};

} // namespace

struct CompiledStep::Impl {
  StepSource& source;
  CompileOptions options;
  StepMetrics metrics;
  std::vector<std::unique_ptr<Program>> programs;
  Program* current = nullptr;
  GuardFacts facts;                // reused every step
  uint64_t checked_slot_epoch = 0; // tensor_slot_epoch() when the current program's guards and binding last held
  ArgumentChanges changes;         // reused every step

  std::weak_ptr<const void> source_alive; // expires with the source
  std::string source_name;                // for the message once it has

  Impl(StepSource& s, CompileOptions opts)
      : source(s), options(std::move(opts)), source_alive(s.lifetime()), source_name(s.name()) {}

  // The state dtypes depend on the state itself, the params' dtypes and the groups' structures only: a step whose
  // grads alone were replaced (the usual case with zero_grad(set_to_none=True)) reuses the last ones.
  uint64_t state_facts_version = 0;
  bool state_facts_read = false;

  void read_facts() {
    // Updated in place, noting whether any fact changed (no copy of the last facts on this per-step path).
    bool changed = !state_facts_read || state_facts_version != source.state_version() ||
                   facts.params.size() != static_cast<std::size_t>(source.param_count()) ||
                   facts.groups.size() != static_cast<std::size_t>(source.group_count());
    facts.params.resize(static_cast<std::size_t>(source.param_count()));
    for (int64_t i = 0; i < source.param_count(); ++i) {
      const uint32_t fact = param_fact(*source.flat_param(i).impl());
      changed = changed || facts.params[static_cast<std::size_t>(i)] != fact;
      facts.params[static_cast<std::size_t>(i)] = fact;
    }
    facts.groups.resize(static_cast<std::size_t>(source.group_count()));
    for (int g = 0; g < source.group_count(); ++g)
      if (std::string key = source.group_structure_key(g); key != facts.groups[static_cast<std::size_t>(g)]) {
        facts.groups[static_cast<std::size_t>(g)] = std::move(key);
        changed = true;
      }
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

  // Compiles every kernel of the buckets' pipelines (update, then grad pass, bucket by bucket) into the kernel cache,
  // several at once (as many as the thread pool's active threads): they are independent LLVM modules. Per kernel, in
  // that order, whether the cache held it already.
  std::vector<bool> prepare_kernels(const std::vector<BucketProgram>& buckets) const {
    struct Job {
      const KernelPlan* plan;
      const Target* target;
    };
    std::vector<Job> jobs;
    for (const BucketProgram& bp : buckets) {
      for (const KernelPlan& plan : bp.pipeline.kernels)
        jobs.push_back({&plan, &bp.target});
      if (bp.grad_pass_pipeline)
        for (const KernelPlan& plan : bp.grad_pass_pipeline->kernels)
          jobs.push_back({&plan, &bp.target});
    }
    // A kernel twice in the step (two buckets of the same plan) compiles once; the second finds it in the cache.
    std::vector<char> hits(jobs.size(), 0); // not vector<bool>: jobs write their own entries concurrently
    std::vector<std::size_t> unique;
    std::set<std::string> keys;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      if (keys.insert(kernel_cache_key(*jobs[i].plan, *jobs[i].target)).second)
        unique.push_back(i);
      else
        hits[i] = 1;
    }
    run_concurrently(unique.size(), ThreadPool::global().active_threads(), [&](std::size_t u) {
      const Job& job = jobs[unique[u]];
      hits[unique[u]] = backend_for(*job.target).prepare(*job.plan, *job.target);
    });
    return {hits.begin(), hits.end()};
  }

  Program& compile_program() {
    auto start = std::chrono::steady_clock::now();
    // A compile that failed (an error in the trace, say) left no program: the next one is still the first.
    std::optional<std::string> recompile_reason;
    if (!programs.empty()) {
      recompile_reason = explain_guard_failure(current ? current->facts : programs.back()->facts, facts);
      OPTJIT_LOG(recompiles, "{}: recompiling step #{}: {}", source.name(), metrics.steps, *recompile_reason);
    }
    auto program = std::make_unique<Program>();
    program->facts = facts;
    // Traced and planned bucket by bucket (a trace runs the optimizer's own code), then every kernel of the step
    // compiled at once (Backend::prepare), then loaded from the kernel cache bucket by bucket.
    for (ParamBucket& bucket : source.compile_buckets()) {
      BucketProgram bp;
      bp.target = Target::for_device(bucket.device, options.execution);
      bp.pipeline = run_pipeline(source.trace_bucket(bucket));
      if (options.shard_reducer)
        check_shardable(source.name(), bp.pipeline.traced);
      if (bp.pipeline.traced.stores.empty())
        throw Error(fmt::format("{}: the step stores nothing, so there is nothing to run (a step writes its params "
                                "or its state)",
                                source.name()));
      for (const Slot& slot : bp.pipeline.traced.slots)
        if (slot.role == SlotRole::Grad)
          bp.grad_slot = slot.name;
      OPTJIT_ASSERT(!bp.grad_slot.empty(), "the graph of " + source.name() + " declares no grad slot");
      if (source.has_grad_pass())
        bp.grad_pass_pipeline = run_pipeline(source.trace_grad_pass(bucket));
      bp.bucket = std::move(bucket);
      program->buckets.push_back(std::move(bp));
    }
    const std::vector<bool> hits = prepare_kernels(program->buckets);
    std::size_t kernel = 0;
    const auto count = [&](std::size_t kernels) { // the next `kernels` kernels' hits into the metrics; all hits?
      bool all = true;
      for (std::size_t end = kernel + kernels; kernel < end; ++kernel) {
        ++(hits[kernel] ? metrics.cache_hits : metrics.kernels_generated);
        all = all && hits[kernel];
      }
      return all;
    };
    for (BucketProgram& bp : program->buckets) {
      bool unused = false; // prepare_kernels said which kernels the cache held before this compile
      bp.code = backend_for(bp.target).load(bp.pipeline, bp.target, options, unused);
      if (bp.bucket.host_scalar_entries != 0)
        bp.code = with_scalar_state_on_host(std::move(bp.code), bp.pipeline.optimized, bp.bucket.device);
      const bool hit = count(bp.pipeline.kernels.size());
      if (bp.grad_pass_pipeline) {
        bp.grad_pass_code = backend_for(bp.target).load(*bp.grad_pass_pipeline, bp.target, options, unused);
        count(bp.grad_pass_pipeline->kernels.size());
      }
      OPTJIT_LOG(kernels, "{}: kernel {} for {} params ({}, {}, {}, {})", source.name(),
                 hit ? "from cache" : "compiled", bp.bucket.members.size(), bp.bucket.device.to_string(),
                 dtype_name(bp.bucket.dtype), bp.bucket.structure_key, bp.target.isa);
    }
    program->runs_in_phases = check_pauses_match(source.name(), program->buckets, pauses());
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
    return true;
  }

  // Validates the grads that changed since the program's last binding (before anything is mutated) and says what
  // the binding needs.
  void check_arguments(const Program& program, ArgumentChanges& changes) const {
    changes.replaced_grads.clear();
    const char* reason = !program.bound                                          ? "first step of this variant"
                         : program.bound_state_version != source.state_version() ? "optimizer state created or replaced"
                                                                                 : nullptr;
    bool params_replaced = reason != nullptr; // first bound, or the state was replaced
    for (int64_t i = 0; i < source.param_count(); ++i) {
      const TensorImpl& p = *source.flat_param(i).impl();
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
      source.check_grad(i);
      if (!same_param)
        source.check_state(i);
      params_replaced |= !same_param || !was_bound_with_grad;
      if (program.bound && !was_bound_with_grad && !reason)
        reason = "a grad appeared";
      if (!same_param && !reason)
        reason = "a param's data was replaced";
      // A new contiguous grad of an unstaged contiguous param (the usual zero_grad(set_to_none=True) step) leaves the
      // staging decision as the bind made it: it depends on the grad only through the grad's layout.
      const bool still_flat = same_param && !source.is_staged(i) && p.contiguous && g->contiguous;
      if (!still_flat && source.needs_staging(i) != source.is_staged(i) && !reason)
        reason = "a param's tensors stopped or started sharing one memory layout";
      changes.replaced_grads.push_back(i);
    }
    if (params_replaced)
      source.check_params_distinct();
    changes.rebind_reason = reason;
  }

  // Points the binding at grad buffers that replaced the bound ones (same shape, dtype and device: checked).
  void repoint_grads(Program& program, const std::vector<int64_t>& replaced) {
    OPTJIT_LOG(guards, "{}: {} grad buffer(s) replaced at step #{}, repointing them", source.name(), replaced.size(),
               metrics.steps);
    for (int64_t i : replaced) {
      const Tensor grad = source.flat_param(i).grad();
      const auto [bucket, entry] = program.entry_of_flat[static_cast<std::size_t>(i)];
      BucketProgram& bp = program.buckets[static_cast<std::size_t>(bucket)];
      bp.code->repoint(bp.grad_slot, entry, source.kernel_grad(i)); // a staging copy, or the grad's real view
      if (bp.grad_pass_code)
        bp.grad_pass_code->repoint(bp.grad_slot, entry, source.kernel_grad(i));
      program.bound_grad_layout[static_cast<std::size_t>(i)] = grad.impl()->layout_id;
    }
    ++metrics.rebinds;
  }

  void bind(Program& program, const char* reason) {
    OPTJIT_LOG(guards, "{}: rebinding arguments at step #{}: {}", source.name(), metrics.steps, reason);
    source.ensure_state();
    source.prepare_staging();
    program.entry_of_flat.assign(static_cast<std::size_t>(source.param_count()), {-1, 0});
    for (std::size_t b = 0; b < program.buckets.size(); ++b) {
      BucketProgram& bp = program.buckets[b];
      const ParamBucket present = members_with_grads(source, bp.bucket);
      bp.launched = !present.members.empty();
      if (!bp.launched)
        continue;
      bp.code->bind(source.list_arguments(present));
      if (bp.grad_pass_code)
        bp.grad_pass_code->bind(source.grad_arguments(present));
      for (std::size_t t = 0; t < present.members.size(); ++t)
        program.entry_of_flat[static_cast<std::size_t>(present.members[t].flat)] = {static_cast<int>(b),
                                                                                    static_cast<int64_t>(t)};
    }
    program.bound_param_layout.assign(static_cast<std::size_t>(source.param_count()), 0);
    program.bound_grad_layout.assign(static_cast<std::size_t>(source.param_count()), 0);
    for (int64_t i = 0; i < source.param_count(); ++i) {
      const TensorImpl& p = *source.flat_param(i).impl();
      program.bound_param_layout[static_cast<std::size_t>(i)] = p.layout_id;
      program.bound_grad_layout[static_cast<std::size_t>(i)] = p.grad ? p.grad->layout_id : 0;
    }
    program.bound_state_version = source.state_version();
    program.bound = true;
    ++metrics.rebinds;
  }

  void step() {
    const StepSource::Stepping exclusive(source);
    if (source.step_skipped()) { // before any check: a skipped step reads and changes nothing else
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
      check_arguments(checked, changes);
      if (changes.rebind_reason)
        bind(checked, changes.rebind_reason);
      else if (!changes.replaced_grads.empty())
        repoint_grads(checked, changes.replaced_grads);
      checked_slot_epoch = slot_epoch;
    }
    Program& program = *current;
    std::vector<double> hyper = source.hyper_values();
    if (metrics.compiles == compiles_before)
      metrics.dispatch_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (options.shard_reducer && source.has_grad_pass() && source.reduces_grad_pass_over_processes())
      throw Error(fmt::format("{}: a step over shards (shard_reducer) combines its grad norm and inf check over the "
                              "processes itself, and the optimizer has its own grad norm or inf check reducer too: "
                              "they would combine twice; set one of them",
                              source.name()));
    source.stage_in();
    if (source.has_grad_pass()) {
      if (!source.take_grad_pass(run_grad_pass(program, hyper))) { // may throw: nothing is written yet
        ++metrics.steps; // an inf or NaN in the grads: the update does not run (staged copies are left unread)
        ++metrics.skipped_steps;
        return;
      }
      hyper = source.hyper_values(); // with the step's clip coefficient
    }
    for (BucketProgram& bp : program.buckets)
      if (bp.launched)
        bp.code->set_hyper(hyper);
    if (program.runs_in_phases)
      launch_in_phases(program);
    else
      for (BucketProgram& bp : program.buckets)
        if (bp.launched) {
          const int64_t captured = bp.code->graph_captures();
          bp.code->launch();
          metrics.graph_captures += bp.code->graph_captures() - captured;
        }
    source.stage_out(); // staged params are CPU params: their launches have finished
    source.after_step();
    ++metrics.steps;
  }

  // How the buckets' runs pause: at per-tensor reductions too when the step is over shards.
  Executable::Pauses pauses() const {
    return options.shard_reducer ? Executable::Pauses::ShardReductionsToo : Executable::Pauses::ListReductions;
  }

  // Every bucket's kernels, phase by phase. At each pause, first the per-tensor reductions of a step over shards:
  // every bucket's partials of a kind (sums, then maxima) in one shard_reducer call, combined over the processes;
  // then each list reduction, every bucket's tensors' values combined in bucket order, then list order
  // (deterministic for any thread count), and each bucket goes on with the total.
  void launch_in_phases(Program& program) {
    std::vector<Executable*> running;
    int64_t captured = 0;
    for (BucketProgram& bp : program.buckets)
      if (bp.launched) {
        running.push_back(bp.code.get());
        captured -= bp.code->graph_captures();
        bp.code->start(pauses());
      }
    std::vector<std::vector<ListPartials>> pending(running.size());
    std::vector<double> all;
    std::vector<int64_t> groups;
    for (;;) {
      bool paused = false;
      for (std::size_t b = 0; b < running.size(); ++b) {
        const bool p = running[b]->advance(pending[b]);
        OPTJIT_ASSERT((b == 0 || p == paused) && pending[b].size() == pending[0].size(),
                      "buckets paused at different reductions");
        paused = p;
      }
      if (!paused)
        break;
      for (ShardCombine how : {ShardCombine::Sum, ShardCombine::Max})
        combine_over_shards(pending, how, all);
      for (std::size_t r = 0; r < pending[0].size(); ++r) {
        if (!is_list_carry(pending[0][r].kind))
          continue;
        all.clear();
        groups.clear();
        for (const std::vector<ListPartials>& bucket : pending) {
          all.insert(all.end(), bucket[r].values.begin(), bucket[r].values.end());
          if (bucket[r].groups)
            groups.insert(groups.end(), bucket[r].groups->begin(), bucket[r].groups->end());
        }
        combine_over_list(pending[0][r].kind, all.data(), all.size(), groups.data());
        std::size_t at = 0; // each bucket's entries back, each with its list's or group's value
        for (std::vector<ListPartials>& bucket : pending)
          for (double& value : bucket[r].values)
            value = all[at++];
      }
    }
    for (Executable* code : running)
      captured += code->graph_captures();
    metrics.graph_captures += captured;
  }

  // The partials of a pause that combine over the shards `how`, every bucket's in bucket then pause order, through one
  // shard_reducer call (none when there are none, in every process alike: the pauses are the program's), and back.
  void combine_over_shards(std::vector<std::vector<ListPartials>>& pending, ShardCombine how,
                           std::vector<double>& all) const {
    all.clear();
    for (const std::vector<ListPartials>& bucket : pending)
      for (const ListPartials& p : bucket)
        if (p.shards == how)
          all.insert(all.end(), p.values.begin(), p.values.end());
    if (all.empty())
      return;
    const std::size_t count = all.size();
    options.shard_reducer(all, how);
    if (all.size() != count)
      throw Error(fmt::format("{}: the shard reducer returned {} values for {}", source.name(), all.size(), count));
    std::size_t at = 0;
    for (std::vector<ListPartials>& bucket : pending)
      for (ListPartials& p : bucket)
        if (p.shards == how)
          for (double& value : p.values)
            value = all[at++];
  }

  // Every bucket's grad pass, then the totals over all of them: every tensor's norm contribution combined in bucket
  // order, then list order, so the result does not depend on the thread count.
  StepSource::GradPassTotals run_grad_pass(Program& program, const std::vector<double>& hyper) {
    GradNormTotal norm(source.clip_norm_type());
    StepSource::GradPassTotals totals;
    for (BucketProgram& bp : program.buckets) {
      if (!bp.launched)
        continue;
      bp.grad_pass_code->set_hyper(hyper);
      bp.grad_pass_code->launch();
      if (source.clips_grads())
        for (double contribution : bp.grad_pass_code->carried(kGradNormCarry))
          norm.add(contribution, bp.bucket.dtype);
      if (source.checks_grads_finite()) // 0 for a tensor of finite grads (an empty one too), NaN otherwise
        for (double nonfinite : bp.grad_pass_code->carried(kGradNonfiniteCarry))
          totals.nonfinite = totals.nonfinite || nonfinite != 0;
    }
    totals.norm_partial = norm.partial();
    if (options.shard_reducer) { // each process's shards: the whole tensors' totals (the inf check, then the norm)
      std::vector<double> values;
      if (source.checks_grads_finite()) {
        values = {totals.nonfinite ? 1.0 : 0.0};
        options.shard_reducer(values, ShardCombine::Max);
        totals.nonfinite = values.at(0) != 0;
      }
      if (source.clips_grads()) {
        values = {totals.norm_partial};
        options.shard_reducer(values, source.clip_norm_type() == 2.0 ? ShardCombine::Sum : ShardCombine::Max);
        totals.norm_partial = values.at(0);
      }
    }
    return totals;
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
  for (const BucketProgram& bp : impl.program_now().buckets)
    if (!members_with_grads(impl.source, bp.bucket).members.empty()) {
      count += backend_for(bp.target).kernel_count(bp.pipeline);
      if (bp.grad_pass_pipeline)
        count += backend_for(bp.target).kernel_count(*bp.grad_pass_pipeline);
    }
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
