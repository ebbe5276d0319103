// The matrix products of a plan (the CPU and GPU backends'): the scratch buffers its kernels and library calls hand
// each other, made when it binds in the memory of the library's device, and each call (KernelPlan::calls_after) run
// in the matrix library after the kernel it follows: one batched product for each set of entries of one shape and
// one param group, whose buffers lie one after another. Buffers of one storage (share_scratch_storage) share memory.
// The library's products are prepared when it binds and again only when a call's beta or alpha changes, so a step
// runs prepared products.
#pragma once

#include "ir/arguments.h"
#include "ir/kernel_plan.h"
#include "runtime/device.h"
#include "runtime/gemm.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace optjit {

// Where a plan's products run: a well-kept library on one device's memory.
class MatrixLibrary {
public:
  virtual ~MatrixLibrary() = default;
  // The device whose memory the products read and write: scratch buffers are made there.
  virtual Device device() const = 0;
  // C = beta C + alpha op(A) op(B) as `shape` says (runtime/gemm.h), on addresses of the device's memory.
  using Product = std::function<void(const void* a, const void* b, void* c)>;
  // `shape`'s product, ready to run many times (the CPU's library chooses and compiles its kernel here).
  virtual Product prepare(const GemmShape& shape) = 0;
  // dst = src, `bytes` of the device's memory, in order with the products and the kernels before them.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
};

// oneDNN on the host (runtime/gemm.h): products run on the calling thread and return when done.
std::unique_ptr<MatrixLibrary> host_matrix_library();
// cuBLAS on cuda:`device` (runtime/cuda/cublas.h), loaded and given a handle on the first product: products and
// copies are queued on the device's current stream (cuda::stream), after the kernel launched there before them, and
// the host does not wait.
std::unique_ptr<MatrixLibrary> cuda_matrix_library(int device);

class MatrixProducts {
public:
  MatrixProducts(std::vector<ScratchBuffer> scratch, std::unique_ptr<MatrixLibrary> library)
      : scratch_(std::move(scratch)), library_(std::move(library)) {}

  // `args` with each scratch buffer's tensors added as slots (one per list entry, shaped from the entry's param:
  // args.shapes, or the first plan's first tensor slot); `args` itself when the plan has no products. Prepares every
  // call of `plans` (the plan's kernels, which outlive the binding) for args.hyper. Throws optjit::Error for a param
  // that is not a matrix.
  const ListArguments& bind(const ListArguments& args, std::vector<const KernelPlan*> plans);
  // This step's hyperparameters (per group, bind's order): prepares the products whose beta or alpha they change.
  void set_hyper(const std::vector<double>& values_by_group);
  // Runs the calls after bound plan `kernel` (its calls_after) in order, each for every list entry.
  void run(std::size_t kernel) const;

private:
  double scalar(const LibraryCall::Scalar& s, std::size_t entry) const;
  void prepare();
  std::vector<double> coefficients() const; // every call's beta and alpha per batch, as prepared

  std::vector<ScratchBuffer> scratch_;
  std::unique_ptr<MatrixLibrary> library_;
  std::vector<const KernelPlan*> plans_;              // the bound plans, whose calls run
  ListArguments bound_;                               // the bound arguments and each entry's scratch matrices
  std::vector<std::vector<std::size_t>> batches_;     // list entries of one shape and param group, in list order
  std::map<std::string, std::vector<Tensor>> blocks_; // per scratch buffer, per batch: its entries' matrices
  std::vector<double> hyper_;
  std::vector<std::vector<std::vector<MatrixLibrary::Product>>> prepared_; // per plan, per call, per batch
  std::vector<double> coefficients_;                                       // coefficients() when prepared
};

} // namespace optjit
