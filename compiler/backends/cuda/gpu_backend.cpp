// The GPU backend: kernel plans lowered to PTX for the target's sm (codegen/cuda/nvptx.cpp), loaded on the target's
// device through the kernel cache, bound in device memory (compiler/backends/cuda/gpu_binding.h) and launched on the
// device's stream, optionally as a captured CUDA graph. A plan's matrix products run in cuBLAS on the same stream
// after the kernel they follow (compiler/backends/matrix_products.h), on scratch buffers in device memory.
#include "codegen/codegen.h"
#include "compiler/backend.h"
#include "compiler/backends/cuda/gpu_binding.h"
#include "compiler/backends/cuda/gpu_grad_total.h"
#include "compiler/backends/kernel_sequence.h"
#include "compiler/backends/matrix_products.h"
#include "compiler/kernel_cache.h"
#include "runtime/cuda/gpu_module.h"
#include "runtime/error.h"

#include <algorithm>

namespace optjit {
namespace {

// The index of tensor slot `name` in the kernel's table; -1 when the kernel does not use it.
int binding_slot(const KernelPlan& plan, const std::string& name) {
  const auto& tensors = plan.abi.tensor_slots;
  auto it = std::find(tensors.begin(), tensors.end(), name);
  return it == tensors.end() ? -1 : static_cast<int>(it - tensors.begin());
}

struct BoundGpuKernel {
  KernelPlan plan;
  std::shared_ptr<GpuModule> module;
  GpuBinding binding;
};

// The plan's kernels, launched in order on the device's stream; they share one device carry buffer.
class GpuExecutable final : public KernelSequence<GpuExecutable, BoundGpuKernel> {
public:
  GpuExecutable(std::vector<BoundGpuKernel> kernels, int device, bool cuda_graphs, std::vector<ScratchBuffer> scratch)
      : KernelSequence(std::move(kernels)), device_(device), cuda_graphs_(cuda_graphs),
        products_(std::move(scratch), cuda_matrix_library(device)) {}

  void bind(const ListArguments& given) override {
    std::vector<const KernelPlan*> plans;
    for (const BoundGpuKernel& k : kernels_)
      plans.push_back(&k.plan);
    const ListArguments& args = products_.bind(given, std::move(plans)); // with the scratch buffers, if any
    const std::size_t carry_bytes =
        std::max<std::size_t>(8, kernels_.front().plan.carries.size() * static_cast<std::size_t>(args.n_tensors()) * 8);
    if (carry_.bytes() < carry_bytes)
      carry_ = DeviceBuffer(device_, carry_bytes);
    n_tensors_ = static_cast<std::size_t>(args.n_tensors());
    const KernelPlan& first = kernels_.front().plan;
    if (axis_table_.bytes() < std::max<std::size_t>(8, first.carries.size() * 8))
      axis_table_ = DeviceBuffer(device_, std::max<std::size_t>(8, first.carries.size() * 8));
    for (BoundGpuKernel& k : kernels_)
      k.binding.bind(k.plan, args, device_, carry_.address(), axis_table_.address());
    // Axis sums: a device array per carried row or column sum, with every tensor's rows (columns) in it, and the
    // table of their addresses the kernels read.
    axis_.resize(first.carries.size());
    std::vector<uint64_t> addresses(std::max<std::size_t>(1, first.carries.size()), 0);
    for (std::size_t c = 0; c < first.carries.size(); ++c) {
      if (!is_axis_carry(first.carry_kinds[c]))
        continue;
      const int64_t length = kernels_.front().binding.axis_length(first.carry_kinds[c]);
      const std::size_t bytes = (static_cast<std::size_t>(length) + 1) * sizeof(double);
      if (axis_[c].bytes() < bytes)
        axis_[c] = DeviceBuffer(device_, bytes);
      addresses[c] = axis_[c].address();
    }
    cuda::copy_to_device(device_, axis_table_.address(), addresses.data(), addresses.size() * 8);
  }
  void repoint(const std::string& slot, int64_t entry, const Tensor& tensor) override {
    for (BoundGpuKernel& k : kernels_)
      if (const int index = binding_slot(k.plan, slot); index >= 0)
        k.binding.repoint(index, entry, tensor.data());
  }
  void set_hyper(const std::vector<double>& values_by_group) override {
    for (BoundGpuKernel& k : kernels_)
      k.binding.set_hyper(values_by_group);
    products_.set_hyper(values_by_group);
  }
  void set_hyper_addresses(const std::vector<const void*>& addresses_by_group) override {
    for (BoundGpuKernel& k : kernels_)
      k.binding.set_hyper_addresses(addresses_by_group);
  }
  // A synchronous copy to the host, which waits for the launches before it (the launch stream is ordered with the
  // legacy default stream): the one host wait of a clipping step on the GPU.
  std::vector<double> carried(const std::string& name) const override {
    const KernelPlan& plan = kernels_.front().plan;
    const std::size_t k = carry_index(plan, name), n_carry = plan.carries.size();
    std::vector<double> all(std::max<std::size_t>(1, n_carry * n_tensors_));
    cuda::copy_to_host(device_, all.data(), carry_.address(), n_carry * n_tensors_ * 8);
    std::vector<double> values(n_tensors_);
    for (std::size_t t = 0; t < n_tensors_; ++t)
      values[t] = all[t * n_carry + k];
    return values;
  }
  CarryOnDevice carried_on_device(const std::string& name) const override {
    const KernelPlan& plan = kernels_.front().plan;
    return {carry_.address(), static_cast<int64_t>(n_tensors_), static_cast<int64_t>(plan.carries.size()),
            static_cast<int64_t>(carry_index(plan, name))};
  }
  int64_t graph_captures() const override {
    int64_t captures = 0;
    for (const BoundGpuKernel& k : kernels_)
      captures += k.binding.graph_captures();
    return captures;
  }

private:
  friend KernelSequence;
  // KernelSequence's: launch a kernel, and move the carry columns of list reductions out and back in.
  // Then the products that follow it, queued behind it on the same stream.
  void launch_kernel(BoundGpuKernel& k) {
    k.binding.launch(*k.module, cuda_graphs_);
    products_.run(static_cast<std::size_t>(&k - kernels_.data()));
  }
  // The carry buffer comes back with a synchronous copy, which waits for the kernel: a host wait per kernel that
  // ends with list reductions, as clipping's norm.
  void read_columns(const KernelPlan& plan, const std::vector<std::size_t>& columns, std::vector<ListPartials>& into) {
    const std::size_t n_carry = plan.carries.size();
    host_carry_.resize(n_carry * n_tensors_);
    if (n_tensors_ > 0)
      cuda::copy_to_host(device_, host_carry_.data(), carry_.address(), host_carry_.size() * 8);
    for (std::size_t c : columns) {
      ListPartials& p = into.emplace_back(
          ListPartials{plan.carry_kinds[c], std::vector<double>(n_tensors_), &kernels_.front().binding.group_of()});
      for (std::size_t t = 0; t < n_tensors_; ++t)
        p.values[t] = host_carry_[t * n_carry + c];
    }
  }
  // Back into the device's carry buffer with a synchronous copy, so the next launch reads them.
  void write_columns(const std::vector<std::size_t>& columns, const std::vector<ListPartials>& from) {
    const std::size_t n_carry = kernels_.front().plan.carries.size();
    for (std::size_t i = 0; i < columns.size(); ++i)
      for (std::size_t t = 0; t < n_tensors_; ++t)
        host_carry_[t * n_carry + columns[i]] = from[i].values[t];
    if (n_tensors_ > 0)
      cuda::copy_to_device(device_, carry_.address(), host_carry_.data(), host_carry_.size() * 8);
  }

  int device_;
  bool cuda_graphs_;
  MatrixProducts products_;
  DeviceBuffer carry_;
  DeviceBuffer axis_table_;        // u64 per carry: the address of its axis array, 0 for a per-tensor carry
  std::vector<DeviceBuffer> axis_; // per carry: an axis sum's array (empty for a per-tensor carry)
  std::size_t n_tensors_ = 0;
  std::vector<double> host_carry_; // advance(): the carry buffer's host copy while paused
};

class GpuBackend final : public Backend {
  // `plan`'s PTX from the process-wide cache of PTX (which prepare() fills from any thread), compiled when it is not
  // there.
  static std::shared_ptr<GpuKernelCode> ptx(const KernelPlan& plan, const Target& target, const std::string& key) {
    bool hit = false;
    return KernelCache<GpuKernelCode>::global().get_or_compile(
        key, [&] { return std::make_shared<GpuKernelCode>(compile_gpu_kernel(plan, target.sm)); }, hit);
  }

public:
  std::unique_ptr<Executable> load(const PipelineResult& pipeline, const Target& target, const CompileOptions& options,
                                   bool& cache_hit) const override {
    OPTJIT_ASSERT(!pipeline.kernels.empty(), "a plan without kernels has nothing to load");
    std::vector<BoundGpuKernel> kernels;
    cache_hit = true;
    for (const KernelPlan& plan : pipeline.kernels) {
      bool hit = false;
      const std::string key = kernel_cache_key(plan, target);
      std::shared_ptr<GpuModule> module = KernelCache<GpuModule>::global().get_or_compile(
          key,
          [&] {
            const std::shared_ptr<GpuKernelCode> code = ptx(plan, target, key);
            return std::make_shared<GpuModule>(target.device.index, code->ptx, code->entry);
          },
          hit);
      cache_hit = cache_hit && hit;
      kernels.push_back({plan, std::move(module), {}});
    }
    return std::make_unique<GpuExecutable>(std::move(kernels), target.device.index, options.cuda_graphs,
                                           pipeline.scratch);
  }

  bool prepare(const KernelPlan& plan, const Target& target) const override {
    const std::string key = kernel_cache_key(plan, target);
    if (KernelCache<GpuModule>::global().touch(key))
      return true;
    ptx(plan, target, key); // any thread: LLVM alone; the driver loads the module in load()
    return false;
  }

  std::unique_ptr<DeviceGradTotal> grad_total(const Target& target, const GradPass& pass) const override {
    return make_gpu_grad_total(target, pass);
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
