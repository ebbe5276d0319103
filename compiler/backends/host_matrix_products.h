// The matrix products of a plan on the host (the CPU backend's): the scratch buffers its kernels and library calls
// hand each other, made when it binds, and each call (KernelPlan::calls_after) run in the matrix library
// (runtime/gemm.h) after the kernel it follows: one batched product for each set of entries of one shape and one
// param group, whose buffers lie one after another. Buffers of one storage (share_scratch_storage) share memory.
// The library's products are prepared when it binds and again only when a call's beta or alpha changes, so a step
// runs prepared products.
#pragma once

#include "ir/arguments.h"
#include "ir/kernel_plan.h"
#include "runtime/gemm.h"

#include <map>
#include <string>
#include <vector>

namespace optjit {

class HostMatrixProducts {
public:
  explicit HostMatrixProducts(std::vector<ScratchBuffer> scratch) : scratch_(std::move(scratch)) {}

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
  std::vector<const KernelPlan*> plans_;              // the bound plans, whose calls run
  ListArguments bound_;                               // the bound arguments and each entry's scratch matrices
  std::vector<std::vector<std::size_t>> batches_;     // list entries of one shape and param group, in list order
  std::map<std::string, std::vector<Tensor>> blocks_; // per scratch buffer, per batch: its entries' matrices
  std::vector<double> hyper_;
  std::vector<std::vector<std::vector<const Gemm*>>> prepared_; // per plan, per call, per batch
  std::vector<double> coefficients_;                            // coefficients() when prepared
};

} // namespace optjit
