#include "compiler/program.h"
#include "compiler/backends/host_scalar_state.h"
#include "compiler/grad_pass.h"
#include "compiler/pipeline.h"
#include "runtime/concurrent_jobs.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/thread_pool.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <optional>
#include <set>

namespace optjit {

ParamBucket members_with_grads(const StepSource& source, const ParamBucket& bucket) {
  ParamBucket present = bucket;
  std::erase_if(present.members, [&](const BucketMember& m) { return !source.flat_param(m.flat).grad().defined(); });
  return present;
}

Executable::Pauses pauses_of(const CompileOptions& options) {
  return options.shard_reducer ? Executable::Pauses::ShardReductionsToo : Executable::Pauses::ListReductions;
}

namespace {

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
    else if (op_has_trait(op, kMatrix))
      refuse(fmt::format("a matrix product ({}: it multiplies whole matrices; torch.optim.Muon over shards gathers "
                         "each matrix to one process)",
                         op_name(op)));
}

// Why the buckets' kernels cannot read `hypers` on their device, or empty when they can.
std::string why_hypers_not_on_device(const std::vector<DeviceHyper>& hypers,
                                     const std::vector<BucketProgram>& buckets) {
  for (const BucketProgram& bp : buckets) {
    for (const DeviceHyper& h : hypers)
      if (bp.target.device != h.device)
        return "a bucket's kernels run on " + bp.target.device.to_string() + ", and " + describe(h) + " is not there";
      else if (bp.target.execution != Execution::Compiled)
        return "a bucket's step is interpreted on the host, which reads values, not device memory";
    if (bp.bucket.host_scalar_entries != 0)
      return "a bucket holds scalar state on the host, which the host updates from the hyperparameters";
    for (const KernelPlan& plan : bp.pipeline.kernels)
      for (const LibraryCall& call : plan.calls_after)
        for (const DeviceHyper& h : hypers)
          if (call.alpha.hyper == h.name || call.beta.hyper == h.name)
            return "a matrix product takes " + h.name + " as a number";
  }
  return {};
}

// Marks every kernel plan's hyperparameters of `hypers` as read on the device (KernelPlan::hypers_on_device), beside
// those marked already, in the ABI's order, as a parsed plan lists them.
void mark_read_on_device(std::vector<BucketProgram>& buckets, const std::vector<DeviceHyper>& hypers) {
  for (BucketProgram& bp : buckets) {
    std::vector<KernelPlan*> plans;
    for (KernelPlan& plan : bp.pipeline.kernels)
      plans.push_back(&plan);
    if (bp.grad_pass_pipeline)
      for (KernelPlan& plan : bp.grad_pass_pipeline->kernels)
        plans.push_back(&plan);
    for (KernelPlan* plan : plans) {
      std::vector<HyperOnDevice> marked;
      for (const std::string& name : plan->abi.hypers) {
        if (const auto it = std::find_if(plan->hypers_on_device.begin(), plan->hypers_on_device.end(),
                                         [&](const HyperOnDevice& h) { return h.name == name; });
            it != plan->hypers_on_device.end())
          marked.push_back(*it);
        else if (const auto at =
                     std::find_if(hypers.begin(), hypers.end(), [&](const DeviceHyper& h) { return h.name == name; });
                 at != hypers.end())
          marked.push_back({at->name, at->dtype});
      }
      plan->hypers_on_device = std::move(marked);
    }
  }
}

// Marks every kernel plan's hyperparameters of `hypers` as read on the device, when all buckets can; returns whether
// they do. Otherwise each step reads them back to the host (a copy and a wait), and the log says why.
bool mark_hypers_on_device(const std::string& name, const std::vector<DeviceHyper>& hypers,
                           std::vector<BucketProgram>& buckets) {
  if (hypers.empty())
    return false;
  if (const std::string why = why_hypers_not_on_device(hypers, buckets); !why.empty()) {
    OPTJIT_LOG(kernels, "{}: hyperparameters in tensors on a device are copied to the host each step: {}", name, why);
    return false;
  }
  mark_read_on_device(buckets, hypers);
  return true;
}

// The device the grad pass's totals may stay on (DeviceGradTotal): the one every bucket runs on in GPU kernels (as
// for hyperparameters in tensors there), where the source decides nothing from the totals on the host
// (StepSource::grad_totals_may_stay_on_device: its update reads the clip coefficient and found_inf there) and the
// step does not step shards (the host combines their norms over the processes). nullopt otherwise, and the log says
// why.
std::optional<Device> grad_totals_device(const StepSource& source, const CompileOptions& options,
                                         const Program& program) {
  const GradPass& pass = program.grad_pass;
  if (!pass.any() || (pass.clips && pass.coefficient.empty()) || !program.facts.grad_totals_may_stay_on_device ||
      program.buckets.empty() || program.buckets.front().target.device.kind != DeviceKind::cuda)
    return std::nullopt;
  const Device device = program.buckets.front().target.device;
  std::string why;
  if (options.shard_reducer)
    why = "the step is over shards, whose totals the host combines over the processes";
  else if (!program.facts.device_hypers.empty() && !program.reads_hypers_on_device)
    why = "its hyperparameters in device tensors are read on the host";
  else
    why = why_hypers_not_on_device({{pass.clips ? pass.coefficient : "the grad pass", Dtype::f64, device}},
                                   program.buckets);
  if (!why.empty()) {
    OPTJIT_LOG(kernels, "{}: the grad pass's totals are copied to the host each step: {}", source.name(), why);
    return std::nullopt;
  }
  return device;
}

// Compiles every kernel of the buckets' pipelines (update, then grad pass, bucket by bucket) into the kernel cache,
// several at once (as many as the thread pool's active threads): they are independent LLVM modules. Per kernel, in
// that order, whether the cache held it already.
std::vector<bool> prepare_kernels(const std::vector<BucketProgram>& buckets) {
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

} // namespace

std::unique_ptr<Program> build_program(StepSource& source, const CompileOptions& options, const GuardFacts& facts,
                                       StepMetrics& metrics) {
  auto program = std::make_unique<Program>();
  program->facts = facts;
  // Traced and planned bucket by bucket (a trace runs the optimizer's own code), then every kernel of the step
  // compiled at once (Backend::prepare), then loaded from the kernel cache bucket by bucket.
  StepDescription step = source.describe();
  program->grad_pass = step.grad_pass;
  program->walks_rows_and_columns = std::move(step.walks_rows_and_columns);
  program->writes_grads = step.writes_grads;
  for (auto& [bucket, graph] : step.buckets) {
    BucketProgram bp;
    bp.target = Target::for_device(bucket.device, options.execution);
    bp.pipeline = run_pipeline(std::move(graph));
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
    if (step.grad_pass.any())
      bp.grad_pass_pipeline = run_pipeline(
          build_grad_pass(step.grad_pass, *bp.pipeline.traced.slot(bp.grad_slot), compute_dtype(bucket.dtype)));
    bp.bucket = std::move(bucket);
    program->buckets.push_back(std::move(bp));
  }
  program->reads_hypers_on_device = mark_hypers_on_device(source.name(), facts.device_hypers, program->buckets);
  if (program->reads_hypers_on_device)
    program->hypers_left_on_device = facts.device_hypers;
  const std::optional<Device> totals_device = grad_totals_device(source, options, *program);
  std::optional<DeviceHyper> coefficient; // the clip coefficient, read by the update where the grad total writes it
  if (totals_device && program->grad_pass.clips) {
    coefficient = DeviceHyper{program->grad_pass.coefficient, Dtype::f64, *totals_device};
    mark_read_on_device(program->buckets, {*coefficient});
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
    OPTJIT_LOG(kernels, "{}: kernel {} for {} params ({}, {}, {}, {})", source.name(), hit ? "from cache" : "compiled",
               bp.bucket.members.size(), bp.bucket.device.to_string(), dtype_name(bp.bucket.dtype),
               bp.bucket.structure_key, bp.target.isa);
  }
  program->runs_in_phases = check_pauses_match(source.name(), program->buckets, pauses_of(options));
  if (totals_device) {
    const Target& target = program->buckets.front().target;
    program->grad_total = backend_for(target).grad_total(target, program->grad_pass);
    OPTJIT_ASSERT(program->grad_total != nullptr, "a GPU backend without a grad total");
    if (coefficient)
      program->hypers_left_on_device.push_back(*coefficient);
  }
  return program;
}

} // namespace optjit
