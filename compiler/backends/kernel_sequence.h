// KernelSequence: what the CPU and GPU executables share. Both run a plan's kernels in order over one carry buffer
// and pause after each kernel that stores list reductions (in a run over shards, per-tensor reductions too:
// Executable::advance), handing out each one's per-tensor operands and taking the combined values back. The backend
// says how to launch a kernel and how to move carry columns between its buffer and the host: `Derived` has
// launch_kernel(Kernel&), read_columns(const KernelPlan&, const std::vector<std::size_t>& columns,
// std::vector<ListPartials>& into) and write_columns(const std::vector<std::size_t>& columns, const
// std::vector<ListPartials>& from).
#pragma once

#include "compiler/backend.h"
#include "runtime/error.h"

#include <cstddef>
#include <utility>
#include <vector>

namespace optjit {

template <class Derived, class Kernel> class KernelSequence : public Executable {
public:
  void start(Pauses pauses) final {
    next_ = 0;
    paused_.clear();
    over_shards_ = pauses == Pauses::ShardReductionsToo;
    if (over_shards_ && pauses_[1].empty()) // made at the first run over shards (only such steps have them)
      for (const Kernel& k : kernels_)
        pauses_[1].push_back(paused_carries(k.plan, /*over_shards=*/true));
  }

  bool advance(std::vector<ListPartials>& pending) final {
    Derived& self = static_cast<Derived&>(*this);
    if (!paused_.empty()) { // the list reductions of the last pause, combined: where the next kernels read them
      OPTJIT_ASSERT(pending.size() == paused_.size(), "advance() was not handed back the list reductions it paused at");
      self.write_columns(paused_, pending);
      paused_.clear();
    }
    pending.clear();
    while (next_ < kernels_.size()) {
      Kernel& k = kernels_[next_++];
      self.launch_kernel(k);
      const std::vector<PausedCarry>& paused = pauses_[over_shards_][next_ - 1];
      if (!paused.empty()) {
        for (const PausedCarry& p : paused)
          paused_.push_back(p.column);
        self.read_columns(k.plan, paused_, pending);
        for (std::size_t i = 0; i < paused.size(); ++i)
          pending[i].shards = paused[i].shards;
        return true;
      }
    }
    return false;
  }

protected:
  explicit KernelSequence(std::vector<Kernel> kernels) : kernels_(std::move(kernels)) {
    for (const Kernel& k : kernels_)
      pauses_[0].push_back(paused_carries(k.plan, /*over_shards=*/false));
  }

  std::vector<Kernel> kernels_;

private:
  std::size_t next_ = 0;            // the next kernel to launch
  std::vector<std::size_t> paused_; // the carry columns of the current pause
  bool over_shards_ = false;        // pausing at per-tensor reductions too (Pauses::ShardReductionsToo)
  // Per kernel, the carries a run pauses at after it: [0] at list reductions, [1] over shards (paused_carries; a step
  // over shards has no axis sums, whose carries have no such pause).
  std::vector<std::vector<PausedCarry>> pauses_[2];
};

} // namespace optjit
