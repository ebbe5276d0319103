// The CPU backend: kernel plans compiled for the host by the ORC JIT (codegen/cpu_jit.cpp), shared through the
// kernel cache, bound in host memory (compiler/binding.h) and launched over the thread pool.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/backends/kernel_sequence.h"
#include "compiler/backends/matrix_products.h"
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
class CpuExecutable final : public KernelSequence<CpuExecutable, BoundCpuKernel> {
public:
  CpuExecutable(std::vector<BoundCpuKernel> kernels, LaunchShape shape, std::vector<ScratchBuffer> scratch)
      : KernelSequence(std::move(kernels)), shape_(shape), products_(std::move(scratch), host_matrix_library()) {}

  void bind(const ListArguments& given) override {
    std::vector<const KernelPlan*> plans;
    for (const BoundCpuKernel& k : kernels_)
      plans.push_back(&k.plan);
    const ListArguments& args = products_.bind(given, std::move(plans)); // with the scratch buffers, if any
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
      const int64_t length = kernels_.front().binding.axis_length(first.carry_kinds[c]);
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
    products_.set_hyper(values_by_group);
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
  friend KernelSequence;
  // KernelSequence's: launch a kernel, and move the carry columns of list reductions out and back in.
  void launch_kernel(const BoundCpuKernel& k) {
    launch_cpu_kernel(k.code->tensor_phase, k.code->element_phase, k.code->finish_phase, k.binding.args(),
                      k.binding.tensor_grain(), k.binding.item_grain());
    products_.run(static_cast<std::size_t>(&k - kernels_.data()));
  }
  void read_columns(const KernelPlan& plan, const std::vector<std::size_t>& columns,
                    std::vector<ListPartials>& into) const {
    for (std::size_t c : columns) {
      ListPartials& p = into.emplace_back(
          ListPartials{plan.carry_kinds[c], std::vector<double>(n_tensors_), &kernels_.front().binding.group_of()});
      for (std::size_t t = 0; t < n_tensors_; ++t)
        p.values[t] = std::bit_cast<double>(carry_[t * plan.carries.size() + c]);
    }
  }
  void write_columns(const std::vector<std::size_t>& columns, const std::vector<ListPartials>& from) {
    const std::size_t n_carry = kernels_.front().plan.carries.size();
    for (std::size_t i = 0; i < columns.size(); ++i)
      for (std::size_t t = 0; t < n_tensors_; ++t)
        carry_[t * n_carry + columns[i]] = std::bit_cast<uint64_t>(from[i].values[t]);
  }

  std::size_t n_tensors_ = 0;
  LaunchShape shape_;
  MatrixProducts products_;
  std::vector<uint64_t> carry_;
  std::vector<std::vector<double>> axis_; // per carry: an axis sum's array (empty for a per-tensor carry)
  std::vector<double*> axis_pointers_;
};

class CpuBackend final : public Backend {
  // `plan`'s kernel from the process-wide cache, compiled into it when it is not there (`hit` says which).
  static std::shared_ptr<CpuKernel> cached_kernel(const KernelPlan& plan, const Target& target, bool& hit) {
    return KernelCache<CpuKernel>::global().get_or_compile(
        kernel_cache_key(plan, target), [&] { return compile_cpu_kernel(plan); }, hit);
  }

public:
  std::unique_ptr<Executable> load(const PipelineResult& pipeline, const Target& target, const CompileOptions& options,
                                   bool& cache_hit) const override {
    OPTJIT_ASSERT(!pipeline.kernels.empty(), "a plan without kernels has nothing to load");
    std::vector<BoundCpuKernel> kernels;
    cache_hit = true;
    for (const KernelPlan& plan : pipeline.kernels) {
      bool hit = false;
      std::shared_ptr<CpuKernel> code = cached_kernel(plan, target, hit);
      cache_hit = cache_hit && hit;
      kernels.push_back({plan, std::move(code), {}});
    }
    return std::make_unique<CpuExecutable>(std::move(kernels), options.launch, pipeline.scratch);
  }

  bool prepare(const KernelPlan& plan, const Target& target) const override {
    bool hit = false;
    cached_kernel(plan, target, hit);
    return hit;
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
