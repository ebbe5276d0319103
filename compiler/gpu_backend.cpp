// The GPU backend: kernel plans lowered to PTX for the target's sm (codegen/nvptx.cpp), loaded on the target's
// device through the kernel cache, bound in device memory (compiler/gpu_binding.h) and launched on the device's
// stream, optionally as a captured CUDA graph.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/gpu_binding.h"
#include "compiler/kernel_cache.h"
#include "runtime/error.h"
#include "runtime/gpu_module.h"

#include <algorithm>

namespace optjit {
namespace {

int binding_slot(const KernelPlan& plan, const std::string& name) {
  const auto& tensors = plan.abi.tensor_slots;
  auto it = std::find(tensors.begin(), tensors.end(), name);
  OPTJIT_ASSERT(it != tensors.end(), "slot '" + name + "' is not a tensor argument of kernel " + plan.name);
  return static_cast<int>(it - tensors.begin());
}

class GpuExecutable final : public Executable {
public:
  GpuExecutable(KernelPlan plan, std::shared_ptr<GpuModule> module, bool cuda_graphs)
      : plan_(std::move(plan)), module_(std::move(module)), cuda_graphs_(cuda_graphs) {}

  void bind(const ListArguments& args) override { binding_.bind(plan_, args, module_->device()); }
  void repoint(const std::string& slot, int64_t entry, const Tensor& tensor) override {
    binding_.repoint(binding_slot(plan_, slot), entry, tensor.data());
  }
  void set_hyper(const std::vector<double>& values_by_group) override { binding_.set_hyper(values_by_group); }
  void launch() override { binding_.launch(*module_, cuda_graphs_); }
  int64_t graph_captures() const override { return binding_.graph_captures(); }

private:
  KernelPlan plan_;
  std::shared_ptr<GpuModule> module_;
  bool cuda_graphs_;
  GpuBinding binding_;
};

class GpuBackend final : public Backend {
public:
  std::unique_ptr<Executable> load(const PipelineResult& pipeline, const Target& target,
                                   const CompileOptions& options, bool& cache_hit) const override {
    OPTJIT_ASSERT(pipeline.kernels.size() == 1, "a bucket fuses into one kernel");
    const KernelPlan& plan = pipeline.kernels.front();
    std::shared_ptr<GpuModule> module = KernelCache<GpuModule>::global().get_or_compile(
        target.cache_key() + "|" + print_kernel_plan(plan),
        [&] {
          const GpuKernelCode code = compile_gpu_kernel(plan, target.sm);
          return std::make_shared<GpuModule>(target.device.index, code.ptx, code.entry);
        },
        cache_hit);
    return std::make_unique<GpuExecutable>(plan, std::move(module), options.cuda_graphs);
  }

  std::string code(const PipelineResult& pipeline, const Target& target, Stage stage) const override {
    std::string text;
    for (const KernelPlan& plan : pipeline.kernels)
      text += stage == Stage::PTX ? compile_gpu_kernel(plan, target.sm).ptx : gpu_kernel_llvm_ir(plan, target.sm);
    return text;
  }
};

} // namespace

const Backend& gpu_backend() {
  static const GpuBackend backend;
  return backend;
}

} // namespace optjit
