#include "compiler/program_run.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

namespace optjit {

namespace {

// The partials of a pause that combine over the shards `how`, every bucket's in bucket then pause order, through one
// shard_reducer call (none when there are none, in every process alike: the pauses are the program's), and back.
void combine_over_shards(std::vector<std::vector<ListPartials>>& pending, ShardCombine how, std::vector<double>& all,
                         const CompileOptions& options, const std::string& name) {
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
    throw Error(fmt::format("{}: the shard reducer returned {} values for {}", name, all.size(), count));
  std::size_t at = 0;
  for (std::vector<ListPartials>& bucket : pending)
    for (ListPartials& p : bucket)
      if (p.shards == how)
        for (double& value : p.values)
          value = all[at++];
}

// Every bucket's kernels, phase by phase. At each pause, first the per-tensor reductions of a step over shards:
// every bucket's partials of a kind (sums, then maxima) in one shard_reducer call, combined over the processes;
// then each list reduction, every bucket's tensors' values combined in bucket order, then list order
// (deterministic for any thread count), and each bucket goes on with the total.
void launch_in_phases(Program& program, const CompileOptions& options, const std::string& name, StepMetrics& metrics) {
  std::vector<Executable*> running;
  int64_t captured = 0;
  for (BucketProgram& bp : program.buckets)
    if (bp.launched) {
      running.push_back(bp.code.get());
      captured -= bp.code->graph_captures();
      bp.code->start(pauses_of(options));
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
      combine_over_shards(pending, how, all, options, name);
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

// Every launched bucket's grad pass with this step's hyperparameters.
void launch_grad_passes(Program& program, const std::vector<double>& hyper,
                        const std::vector<const void*>& hyper_addresses) {
  for (BucketProgram& bp : program.buckets)
    if (bp.launched) {
      bp.grad_pass_code->set_hyper_addresses(hyper_addresses);
      bp.grad_pass_code->set_hyper(hyper);
      bp.grad_pass_code->launch();
    }
}

} // namespace

void launch_program(Program& program, const CompileOptions& options, const std::string& name, StepMetrics& metrics) {
  if (program.runs_in_phases) {
    launch_in_phases(program, options, name, metrics);
    return;
  }
  for (BucketProgram& bp : program.buckets)
    if (bp.launched) {
      const int64_t captured = bp.code->graph_captures();
      bp.code->launch();
      metrics.graph_captures += bp.code->graph_captures() - captured;
    }
}

StepSource::GradPassTotals run_grad_pass(Program& program, const std::vector<double>& hyper,
                                         const std::vector<const void*>& hyper_addresses,
                                         const CompileOptions& options) {
  const GradPass& pass = program.grad_pass;
  GradNormTotal norm(pass.norm_type);
  StepSource::GradPassTotals totals;
  launch_grad_passes(program, hyper, hyper_addresses);
  for (BucketProgram& bp : program.buckets) {
    if (!bp.launched)
      continue;
    if (pass.clips)
      for (double contribution : bp.grad_pass_code->carried(kGradNormCarry))
        norm.add(contribution, bp.bucket.dtype);
    if (pass.checks_finite) // 0 for a tensor of finite grads (an empty one too), NaN otherwise
      for (double nonfinite : bp.grad_pass_code->carried(kGradNonfiniteCarry))
        totals.nonfinite = totals.nonfinite || nonfinite != 0;
  }
  totals.norm_partial = norm.partial();
  if (options.shard_reducer) { // each process's shards: the whole tensors' totals (the inf check, then the norm)
    std::vector<double> values;
    if (pass.checks_finite) {
      values = {totals.nonfinite ? 1.0 : 0.0};
      options.shard_reducer(values, ShardCombine::Max);
      totals.nonfinite = values.at(0) != 0;
    }
    if (pass.clips) {
      values = {totals.norm_partial};
      options.shard_reducer(values, pass.norm_type == 2.0 ? ShardCombine::Sum : ShardCombine::Max);
      totals.norm_partial = values.at(0);
    }
  }
  return totals;
}

void run_grad_pass_on_device(Program& program, const std::vector<double>& hyper,
                             const std::vector<const void*>& hyper_addresses, double max_norm, const Tensor& norm_copy,
                             const Tensor& found_inf) {
  OPTJIT_ASSERT(program.grad_total != nullptr, "grad totals on the device without a DeviceGradTotal");
  launch_grad_passes(program, hyper, hyper_addresses);
  program.grad_total->launch(max_norm, norm_copy, found_inf);
}

} // namespace optjit
