// matrix_products.h's library on a GPU: cuBLAS (runtime/cuda/cublas.h), one handle per executable (a handle serves
// one thread at a time, and a compiled step runs on one thread at a time), made on the first product so that a plan
// without products never loads the library. Everything is queued on the device's current stream, in order with the
// kernels launched there: no host wait.
#include "compiler/backends/matrix_products.h"
#include "runtime/cuda/cublas.h"
#include "runtime/cuda/cuda_driver.h"

namespace optjit {
namespace {

class CudaMatrixLibrary final : public MatrixLibrary {
public:
  explicit CudaMatrixLibrary(int device) : device_(device) {}

  Device device() const override { return Device::cuda(device_); }

  Product prepare(const GemmShape& shape) override {
    check_gemm_shape(shape); // refused when the plan binds, not in a step
    if (!handle_) {
      cuda::make_current(device_); // cuBLAS ties the handle to the current context
      handle_ = std::make_shared<cuda::BlasHandle>(device_);
    }
    return [handle = handle_, shape, device = device_](const void* a, const void* b, void* c) {
      handle->gemm(shape, reinterpret_cast<uint64_t>(a), reinterpret_cast<uint64_t>(b), reinterpret_cast<uint64_t>(c),
                   cuda::stream(device));
    };
  }

  void copy(void* dst, const void* src, std::size_t bytes) override {
    cuda::copy_on_device_async(device_, reinterpret_cast<uint64_t>(dst), reinterpret_cast<uint64_t>(src), bytes,
                               cuda::stream(device_));
  }

private:
  int device_;
  std::shared_ptr<cuda::BlasHandle> handle_; // shared with the prepared products, which may outlive a rebind
};

} // namespace

std::unique_ptr<MatrixLibrary> cuda_matrix_library(int device) { return std::make_unique<CudaMatrixLibrary>(device); }

} // namespace optjit
