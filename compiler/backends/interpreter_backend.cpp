// The interpreter backend: the eager path. The traced graph runs op by op over the bound tensors
// (ir/interpreter.h), materialising every intermediate as PyTorch's eager foreach path does; nothing is
// compiled. It runs on the host only.
#include "compiler/backend.h"
#include "ir/interpreter.h"
#include "runtime/error.h"

#include <algorithm>
#include <optional>

namespace optjit {
namespace {

class InterpretedExecutable final : public Executable {
public:
  explicit InterpretedExecutable(Graph graph) : graph_(std::move(graph)) {}

  void bind(const ListArguments& args) override { args_ = args; }
  void repoint(const std::string& slot, int64_t entry, const Tensor& tensor) override {
    auto it = std::find(args_.slot_names.begin(), args_.slot_names.end(), slot);
    OPTJIT_ASSERT(it != args_.slot_names.end(), "slot '" + slot + "' is not bound");
    args_.slot_tensors[static_cast<std::size_t>(it - args_.slot_names.begin())][static_cast<std::size_t>(entry)] =
        tensor;
  }
  void set_hyper(const std::vector<double>& values_by_group) override { args_.hyper = values_by_group; }
  void start(Pauses pauses) override { run_.emplace(graph_, args_, &carried_, pauses == Pauses::ShardReductionsToo); }
  bool advance(std::vector<ListPartials>& pending) override { return run_->advance(pending); }
  std::vector<double> carried(const std::string& name) const override {
    auto it = carried_.per_tensor.find(name);
    OPTJIT_ASSERT(it != carried_.per_tensor.end(), "carried value '" + name + "' read before a launch wrote it");
    return it->second;
  }

private:
  Graph graph_;
  ListArguments args_;
  CarriedValues carried_;
  std::optional<Interpretation> run_; // the run start() began
};

class InterpreterBackend final : public Backend {
public:
  std::unique_ptr<Executable> load(const PipelineResult& pipeline, const Target& target, const CompileOptions&,
                                   bool& cache_hit) const override {
    if (target.device.kind != DeviceKind::cpu)
      throw Error("the interpreter runs on the CPU; params on " + target.device.to_string() + " need a compiled step");
    cache_hit = false;
    return std::make_unique<InterpretedExecutable>(pipeline.traced);
  }
  bool prepare(const KernelPlan&, const Target&) const override { return false; } // nothing to compile
  // One launch per element op, as eager foreach.
  int kernel_count(const PipelineResult& pipeline) const override { return pipeline.stats.unfused_kernels; }
  // The traced graph pauses at each list reduction, in node order (over shards, after each per-tensor reduction too).
  std::vector<std::vector<PausedCarry>> pauses(const PipelineResult& pipeline,
                                               Executable::Pauses pauses) const override {
    std::vector<std::vector<PausedCarry>> all;
    for (const Node& n : pipeline.traced.nodes)
      if (op_has_trait(n.op, kListReduction))
        all.push_back({{0, list_carry_kind(n.op), ShardCombine::None}});
      else if (pauses == Executable::Pauses::ShardReductionsToo && shard_combine_of(n.op) != ShardCombine::None)
        all.push_back({{0, CarryKind::PerTensor, shard_combine_of(n.op)}});
    return all;
  }
  std::string code(const PipelineResult&, const Target&, Stage) const override {
    throw Error("the interpreter compiles no code: ask for the traced, optimized or fused stage");
  }
};

} // namespace

const Backend& interpreter_backend() {
  static const InterpreterBackend backend;
  return backend;
}

} // namespace optjit
