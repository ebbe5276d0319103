#include "compiler/backends/cuda/gpu_grad_total.h"

#include "codegen/codegen.h"
#include "compiler/kernel_cache.h"
#include "compiler/step_source.h"
#include "runtime/cuda/gpu_module.h"
#include "runtime/cuda/pinned_ring.h"
#include "runtime/kernel_abi.h"

#include <bit>
#include <cstring>
#include <limits>
#include <optional>

namespace optjit {
namespace {

GpuGradRounding rounding_of(Dtype grad_dtype) {
  switch (component_dtype(grad_dtype)) {
  case Dtype::f64:
    return GpuGradRounding::none;
  case Dtype::bf16:
    return GpuGradRounding::bf16;
  case Dtype::f16:
    return GpuGradRounding::f16;
  default:
    return GpuGradRounding::f32;
  }
}

class GpuGradTotal final : public DeviceGradTotal {
public:
  GpuGradTotal(const Target& target, GpuGradTotalForm form)
      : device_(target.device.index), form_(form), total_(Tensor::zeros({1}, Dtype::f64, target.device)),
        coefficient_(Tensor::zeros({1}, Dtype::f64, target.device)) {
    const char* norms[] = {"no norm", "2-norm", "infinity norm"};
    const std::string key =
        target.cache_key() + "|grad total, " + norms[static_cast<int>(form.norm)] + (form.checks ? ", checked" : "");
    bool hit = false;
    module_ = KernelCache<GpuModule>::global().get_or_compile(
        key,
        [&] {
          const GpuKernelCode code = compile_gpu_grad_total(form, target.sm);
          return std::make_shared<GpuModule>(device_, code.ptx, code.entry);
        },
        hit);
  }

  void bind(const std::vector<const Executable*>& grad_passes, const std::vector<Dtype>& grad_dtypes) override {
    OPTJIT_ASSERT(grad_passes.size() == grad_dtypes.size(), "a grad dtype per grad pass");
    buckets_.clear();
    const bool norm = form_.norm != GpuGradTotalForm::Norm::none;
    for (std::size_t b = 0; b < grad_passes.size(); ++b) {
      const Executable::CarryOnDevice carry =
          grad_passes[b]->carried_on_device(norm ? kGradNormCarry : kGradNonfiniteCarry);
      OPTJIT_ASSERT(carry.buffer != 0 || carry.n_tensors == 0, "a grad pass that keeps no carry on the device");
      const int64_t nonfinite =
          form_.checks ? grad_passes[b]->carried_on_device(kGradNonfiniteCarry).column : int64_t{-1};
      buckets_.push_back({carry.buffer, carry.n_tensors, carry.n_carry, norm ? carry.column : int64_t{-1},
                          static_cast<int64_t>(rounding_of(grad_dtypes[b])), nonfinite});
    }
    const std::size_t bytes = sizeof(GpuGradTotalHeader) + buckets_.size() * sizeof(GpuGradTotalBucket);
    if (descriptor_.bytes() < bytes) {
      descriptor_ = DeviceBuffer(device_, bytes);
      staging_ = std::make_unique<PinnedRing>(device_, descriptor_.bytes());
    }
    uploaded_.reset(); // the buckets changed: upload at the next launch
  }

  void launch(double max_norm, const Tensor& norm_copy, const Tensor& found_inf) override {
    OPTJIT_ASSERT(staging_ != nullptr, "a grad total launched before it was bound");
    OPTJIT_ASSERT(found_inf.defined() == form_.checks, "an inf check's found_inf, and only with the check");
    const GpuGradTotalHeader header{static_cast<int64_t>(buckets_.size()),
                                    reinterpret_cast<uint64_t>(total_.data()),
                                    reinterpret_cast<uint64_t>(coefficient_.data()),
                                    max_norm,
                                    reinterpret_cast<uint64_t>(norm_copy.defined() ? norm_copy.data() : nullptr),
                                    reinterpret_cast<uint64_t>(found_inf.defined() ? found_inf.data() : nullptr)};
    const cuda::Stream stream = cuda::stream(device_);
    // The descriptor travels when it changed (a bind, another max_norm or output): asynchronously, in stream order.
    if (!uploaded_ || std::memcmp(&*uploaded_, &header, sizeof header) != 0) {
      std::vector<unsigned char> bytes(sizeof header + buckets_.size() * sizeof(GpuGradTotalBucket));
      std::memcpy(bytes.data(), &header, sizeof header);
      if (!buckets_.empty())
        std::memcpy(bytes.data() + sizeof header, buckets_.data(), buckets_.size() * sizeof(GpuGradTotalBucket));
      staging_->upload(descriptor_.address(), bytes.data(), bytes.size(), stream);
      uploaded_ = header;
    }
    uint64_t descriptor = descriptor_.address();
    void* params[] = {&descriptor};
    cuda::launch(device_, module_->function(), 1, kGpuGradTotalThreads, params, stream);
  }

  const Tensor& total() const override { return total_; }
  const Tensor& coefficient() const override { return coefficient_; }

private:
  int device_;
  GpuGradTotalForm form_;
  Tensor total_, coefficient_; // f64, one element each
  std::shared_ptr<GpuModule> module_;
  std::vector<GpuGradTotalBucket> buckets_;
  DeviceBuffer descriptor_;
  std::unique_ptr<PinnedRing> staging_;
  std::optional<GpuGradTotalHeader> uploaded_; // the header the device's descriptor holds, with buckets_
};

} // namespace

std::unique_ptr<DeviceGradTotal> make_gpu_grad_total(const Target& target, const GradPass& pass) {
  GpuGradTotalForm form;
  form.norm = !pass.clips             ? GpuGradTotalForm::Norm::none
              : pass.norm_type == 2.0 ? GpuGradTotalForm::Norm::l2
                                      : GpuGradTotalForm::Norm::infinity;
  form.checks = pass.checks_finite;
  return std::make_unique<GpuGradTotal>(target, form);
}

} // namespace optjit
