// The CPU backend: kernel plans compiled for the host by the ORC JIT (codegen/cpu_jit.cpp), shared through the
// kernel cache, bound in host memory (compiler/binding.h) and launched over the thread pool.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/binding.h"
#include "compiler/kernel_cache.h"
#include "runtime/error.h"
#include "runtime/launch.h"

#include <algorithm>

namespace optjit {
namespace {

// The index Binding::repoint takes for slot `name`: tensor slots first, then scalar-state slots.
int binding_slot(const KernelPlan& plan, const std::string& name) {
  const auto& tensors = plan.abi.tensor_slots;
  if (auto it = std::find(tensors.begin(), tensors.end(), name); it != tensors.end())
    return static_cast<int>(it - tensors.begin());
  const auto& scalars = plan.abi.scalar_slots;
  auto it = std::find(scalars.begin(), scalars.end(), name);
  OPTJIT_ASSERT(it != scalars.end(), "slot '" + name + "' is not an argument of kernel " + plan.name);
  return static_cast<int>(tensors.size() + static_cast<std::size_t>(it - scalars.begin()));
}

class CpuExecutable final : public Executable {
public:
  CpuExecutable(KernelPlan plan, std::shared_ptr<CpuKernel> kernel, LaunchShape shape)
      : plan_(std::move(plan)), kernel_(std::move(kernel)), shape_(shape) {}

  void bind(const ListArguments& args) override { binding_.bind(plan_, args, shape_); }
  void repoint(const std::string& slot, int64_t entry, const Tensor& tensor) override {
    binding_.repoint(binding_slot(plan_, slot), entry, tensor.data());
  }
  void set_hyper(const std::vector<double>& values_by_group) override { binding_.set_hyper(values_by_group); }
  void launch() override {
    launch_cpu_kernel(kernel_->tensor_phase, kernel_->element_phase, binding_.args(), binding_.tensor_grain(),
                      binding_.item_grain());
  }

private:
  KernelPlan plan_;
  std::shared_ptr<CpuKernel> kernel_;
  LaunchShape shape_;
  Binding binding_;
};

class CpuBackend final : public Backend {
public:
  std::unique_ptr<Executable> load(const PipelineResult& pipeline, const Target& target,
                                   const CompileOptions& options, bool& cache_hit) const override {
    OPTJIT_ASSERT(pipeline.kernels.size() == 1, "a bucket fuses into one kernel");
    const KernelPlan& plan = pipeline.kernels.front();
    std::shared_ptr<CpuKernel> kernel = KernelCache<CpuKernel>::global().get_or_compile(
        target.cache_key() + "|" + print_kernel_plan(plan), [&] { return compile_cpu_kernel(plan); }, cache_hit);
    return std::make_unique<CpuExecutable>(plan, std::move(kernel), options.launch);
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
