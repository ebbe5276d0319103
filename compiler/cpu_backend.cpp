// The CPU backend: kernel plans compiled for the host by the ORC JIT (codegen/cpu_jit.cpp), shared through the
// kernel cache, bound in host memory (compiler/binding.h) and launched over the thread pool.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/binding.h"
#include "compiler/kernel_cache.h"
#include "runtime/error.h"
#include "runtime/launch.h"

#include <algorithm>
#include <bit>

namespace optjit {
namespace {

// The index Binding::repoint takes for slot `name` (tensor slots first, then scalar-state slots); -1 when the
// kernel does not use the slot.
int binding_slot(const KernelPlan& plan, const std::string& name) {
  const auto& tensors = plan.abi.tensor_slots;
  if (auto it = std::find(tensors.begin(), tensors.end(), name); it != tensors.end())
    return static_cast<int>(it - tensors.begin());
  const auto& scalars = plan.abi.scalar_slots;
  if (auto it = std::find(scalars.begin(), scalars.end(), name); it != scalars.end())
    return static_cast<int>(tensors.size() + static_cast<std::size_t>(it - scalars.begin()));
  return -1;
}

// One compiled kernel of the plan and its argument block.
struct BoundCpuKernel {
  KernelPlan plan;
  std::shared_ptr<CpuKernel> code;
  Binding binding;
};

// The plan's kernels, launched in order; they share one carry buffer.
class CpuExecutable final : public Executable {
public:
  CpuExecutable(std::vector<BoundCpuKernel> kernels, LaunchShape shape) : kernels_(std::move(kernels)), shape_(shape) {}

  void bind(const ListArguments& args) override {
    const std::size_t n_carry = kernels_.front().plan.carries.size();
    n_tensors_ = static_cast<std::size_t>(args.n_tensors());
    carry_.assign(std::max<std::size_t>(1, n_carry * n_tensors_), 0);
    for (BoundCpuKernel& k : kernels_) {
      k.binding.bind(k.plan, args, shape_);
      k.binding.set_carry(carry_.data(), static_cast<int64_t>(n_carry));
    }
    // Axis sums: one array per carried row or column sum, with every tensor's rows (columns) in it.
    const KernelPlan& first = kernels_.front().plan;
    axis_.assign(first.carries.size(), {});
    axis_pointers_.assign(std::max<std::size_t>(1, first.carries.size()), nullptr);
    for (std::size_t c = 0; c < first.carries.size(); ++c) {
      if (!is_axis_carry(first.carry_kinds[c]))
        continue;
      const Binding& b = kernels_.front().binding;
      const int64_t length = first.carry_kinds[c] == CarryKind::Rows ? b.total_rows() : b.total_cols();
      axis_[c].assign(static_cast<std::size_t>(length) + 1, 0.0);
      axis_pointers_[c] = axis_[c].data();
    }
    for (BoundCpuKernel& k : kernels_)
      k.binding.set_axis(axis_pointers_.data());
  }
  void repoint(const std::string& slot, int64_t entry, const Tensor& tensor) override {
    for (BoundCpuKernel& k : kernels_)
      if (const int index = binding_slot(k.plan, slot); index >= 0)
        k.binding.repoint(index, entry, tensor.data());
  }
  void set_hyper(const std::vector<double>& values_by_group) override {
    for (BoundCpuKernel& k : kernels_)
      k.binding.set_hyper(values_by_group);
  }
  void start() override {
    next_kernel_ = 0;
    paused_columns_.clear();
  }
  bool advance(std::vector<ListPartials>& pending) override {
    write_back(pending);
    while (next_kernel_ < kernels_.size()) {
      const BoundCpuKernel& k = kernels_[next_kernel_++];
      launch_cpu_kernel(k.code->tensor_phase, k.code->element_phase, k.code->finish_phase, k.binding.args(),
                        k.binding.tensor_grain(), k.binding.item_grain());
      if (read_list_carries(k.plan, pending))
        return true;
    }
    return false;
  }

  std::vector<double> carried(const std::string& name) const override {
    const KernelPlan& plan = kernels_.front().plan;
    const std::size_t k = carry_index(plan, name);
    std::vector<double> values(n_tensors_);
    for (std::size_t t = 0; t < n_tensors_; ++t)
      values[t] = std::bit_cast<double>(carry_[t * plan.carries.size() + k]);
    return values;
  }

private:
  // The list reductions a kernel stored, each tensor's operand, into `pending`: false when it stored none.
  bool read_list_carries(const KernelPlan& plan, std::vector<ListPartials>& pending) {
    pending.clear();
    const std::size_t n_carry = plan.carries.size();
    for (const std::string& name : plan.abi.carried_out) {
      const std::size_t c = carry_index(plan, name);
      if (!is_list_carry(plan.carry_kinds[c]))
        continue;
      ListPartials& p = pending.emplace_back(ListPartials{plan.carry_kinds[c], std::vector<double>(n_tensors_)});
      for (std::size_t t = 0; t < n_tensors_; ++t)
        p.values[t] = std::bit_cast<double>(carry_[t * n_carry + c]);
      paused_columns_.push_back(c);
    }
    return !pending.empty();
  }
  // The combined list reductions back into the carry buffer, where the next kernels read them.
  void write_back(const std::vector<ListPartials>& combined) {
    if (paused_columns_.empty())
      return;
    const std::size_t n_carry = kernels_.front().plan.carries.size();
    OPTJIT_ASSERT(combined.size() == paused_columns_.size(),
                  "advance() was not handed back the list reductions it paused at");
    for (std::size_t i = 0; i < paused_columns_.size(); ++i)
      for (std::size_t t = 0; t < n_tensors_; ++t)
        carry_[t * n_carry + paused_columns_[i]] = std::bit_cast<uint64_t>(combined[i].values[t]);
    paused_columns_.clear();
  }

  std::vector<BoundCpuKernel> kernels_;
  std::size_t n_tensors_ = 0;
  LaunchShape shape_;
  std::vector<uint64_t> carry_;
  std::size_t next_kernel_ = 0;             // advance(): the next kernel to launch
  std::vector<std::size_t> paused_columns_; // advance(): the carries of the list reductions it paused at
  std::vector<std::vector<double>> axis_;   // per carry: an axis sum's array (empty for a per-tensor carry)
  std::vector<double*> axis_pointers_;
};

class CpuBackend final : public Backend {
public:
  std::unique_ptr<Executable> load(const PipelineResult& pipeline, const Target& target, const CompileOptions& options,
                                   bool& cache_hit) const override {
    OPTJIT_ASSERT(!pipeline.kernels.empty(), "a plan without kernels has nothing to load");
    std::vector<BoundCpuKernel> kernels;
    cache_hit = true;
    for (const KernelPlan& plan : pipeline.kernels) {
      bool hit = false;
      std::shared_ptr<CpuKernel> code = KernelCache<CpuKernel>::global().get_or_compile(
          target.cache_key() + "|" + print_kernel_plan(plan), [&] { return compile_cpu_kernel(plan); }, hit);
      cache_hit = cache_hit && hit;
      kernels.push_back({plan, std::move(code), {}});
    }
    return std::make_unique<CpuExecutable>(std::move(kernels), options.launch);
  }

  std::string code(const PipelineResult& pipeline, const Target&, Stage stage) const override {
    if (stage != Stage::LLVM)
      throw Error("the CPU backend has LLVM IR, not PTX: ask for a CUDA target's PTX");
    std::string text;
    for (const KernelPlan& plan : pipeline.kernels)
      text += cpu_kernel_llvm_ir(plan);
    return text;
  }
};

} // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

} // namespace optjit
