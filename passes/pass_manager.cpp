#include "passes/pass_manager.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/log.h"

#include <chrono>

namespace optjit {

Graph PassManager::run(Graph graph) {
  timings_.clear();
  verify(graph);
  for (const GraphPass& pass : passes_) {
    auto start = std::chrono::steady_clock::now();
    Graph next = pass.run(graph);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    verify(next);
    bool changed = !(next == graph);
    timings_.push_back({pass.name, ms, changed});
    if (log_enabled(LogCategory::passes))
      log_for(LogCategory::passes)
          .info("after {} ({:.3f} ms){}", pass.name, ms, changed ? ":\n" + print_graph(next) : " (unchanged)");
    graph = std::move(next);
  }
  return graph;
}

} // namespace optjit
