// The matrix products of a plan on the host (the CPU backend's): the scratch buffers its kernels and library calls
// hand each other, made when it binds, and each call (KernelPlan::calls_after) run in the matrix library
// (runtime/gemm.h) after the kernel it follows: one batched product for each set of entries of one shape and one
// param group, whose buffers lie one after another.
#pragma once

#include "ir/arguments.h"
#include "ir/kernel_plan.h"

#include <map>
#include <string>
#include <vector>

namespace optjit {

class HostMatrixProducts {
public:
  explicit HostMatrixProducts(std::vector<ScratchBuffer> scratch) : scratch_(std::move(scratch)) {}

  // `args` with each scratch buffer's tensors added as slots (one per list entry, shaped from the entry's param:
  // args.shapes, or `plan`'s first tensor slot); `args` itself when the plan has no products. Throws optjit::Error
  // for a param that is not a matrix.
  const ListArguments& bind(const ListArguments& args, const KernelPlan& plan);
  void set_hyper(const std::vector<double>& values_by_group) { hyper_ = values_by_group; }
  // Runs `calls` in order, each for every list entry.
  void run(const std::vector<LibraryCall>& calls) const;

private:
  double scalar(const LibraryCall::Scalar& s, std::size_t entry) const;

  std::vector<ScratchBuffer> scratch_;
  ListArguments bound_;                               // the bound arguments and each entry's scratch matrices
  std::vector<std::vector<std::size_t>> batches_;     // list entries of one shape and param group, in list order
  std::map<std::string, std::vector<Tensor>> blocks_; // per scratch buffer, per batch: its entries' matrices
  std::vector<double> hyper_;
};

} // namespace optjit
