// The interpreter: runs a graph op by op over real tensors, materialising every intermediate, like PyTorch's eager
// foreach path. It is the eager backend and the living definition of the IR's meaning.
#pragma once

#include "ir/arguments.h"
#include "ir/ir.h"
#include "ir/kernel_plan.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace optjit {

// Values handed from one kernel of a plan to the next, by name: one per list entry (per_tensor), or an axis sum as
// the element values it broadcasts to (arrays: one tensor per list entry, of the graph's dtype).
struct CarriedValues {
  std::map<std::string, std::vector<double>> per_tensor;
  std::map<std::string, std::vector<Tensor>> arrays;
};

// Evaluates every value, then performs the stores (so loads see the values from before the step). `carried`
// supplies the graph's `carried` inputs and receives its carry stores; a whole graph needs none.
void interpret(const Graph& graph, const ListArguments& args, CarriedValues* carried = nullptr);

// The same interpretation, pausing at each list reduction so that several lists can combine it together (the eager
// path of a step whose buckets share a list): advance() evaluates up to the next list reduction (true, with its
// operand per list entry in `pending`, which the caller combines in place before the next advance, which goes on
// with it) or to the end, then performs the stores (false). The graph, arguments and carried values must outlive it.
// `over_shards` (a run over shards of tensors other processes hold the rest of): it also pauses after each per-tensor
// reduction (reduce_sum, reduce_max), with its values as this process's partials (ListPartials::shards).
class Interpretation {
public:
  Interpretation(const Graph& graph, const ListArguments& args, CarriedValues* carried = nullptr,
                 bool over_shards = false);
  ~Interpretation();
  bool advance(std::vector<ListPartials>& pending);

private:
  struct State;
  std::unique_ptr<State> state_;
  bool over_shards_;
};
// Runs a plan's kernels in order, each interpreted, handing carried values on: the meaning of a kernel plan.
void interpret_kernels(const std::vector<KernelPlan>& kernels, const ListArguments& args);

} // namespace optjit
