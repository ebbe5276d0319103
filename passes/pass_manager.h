// PassManager: runs graph passes in the order given, verifies the graph after each, times each, and with
// OPTJIT_LOG=passes prints the graph after each pass (or "(unchanged)").
#pragma once

#include "ir/ir.h"

#include <functional>
#include <string>
#include <vector>

namespace optjit {

struct GraphPass {
  const char* name;
  std::function<Graph(const Graph&)> run;
};

struct PassTiming {
  std::string name;
  double ms = 0;
  bool changed = false;
};

class PassManager {
public:
  explicit PassManager(std::vector<GraphPass> passes) : passes_(std::move(passes)) {}
  Graph run(Graph graph);
  const std::vector<PassTiming>& timings() const { return timings_; }

private:
  std::vector<GraphPass> passes_;
  std::vector<PassTiming> timings_;
};

} // namespace optjit
