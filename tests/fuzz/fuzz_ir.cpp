// Fuzzes the IR text format through everything behind it: parse_graph, verify, the pass pipeline, and codegen for
// the CPU (LLVM IR after O3) and the GPU (PTX for sm_80); and the same text as kernel plans (parse_kernel_plans,
// which must round-trip through the printer too). Text the parser or verifier refuses ends there with an
// optjit::Error; a verified graph must get through the passes and codegen without an internal error, and printing
// it must give text that parses back to the same graph (the printer and parser agree).
#include "codegen/codegen.h"
#include "compiler/pipeline.h"
#include "ir/kernel_plan.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/error.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

// The same text as kernel plans (the fused stage's format): what parses must print back to itself.
void check_kernel_plans(std::string_view text) {
  using namespace optjit;
  std::vector<KernelPlan> plans;
  try {
    plans = parse_kernel_plans(text);
  } catch (const Error&) {
    return;
  }
  for (const KernelPlan& plan : plans) {
    const std::string printed = print_kernel_plan(plan);
    std::string again;
    try {
      again = print_kernel_plan(parse_kernel_plan(printed));
    } catch (const Error& e) {
      again = std::string("(refused: ") + e.what() + ")";
    }
    if (again != printed) {
      std::fprintf(stderr, "the printed kernel plan does not parse back to itself:\n%s\nbut to\n%s\n", printed.c_str(),
                   again.c_str());
      std::abort();
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace optjit;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_kernel_plans(text);
  Graph graph;
  try {
    graph = parse_graph(text);
    verify(graph);
  } catch (const Error&) {
    return 0;
  }
  const std::string printed = print_graph(graph);
  if (print_graph(parse_graph(printed)) != printed) {
    std::fprintf(stderr, "the printed graph does not parse back to itself:\n%s", printed.c_str());
    std::abort();
  }
  try {
    PipelineResult result = run_pipeline(std::move(graph));
    (void)print_fused(result);
    for (const KernelPlan& plan : result.kernels) {
      (void)cpu_kernel_llvm_ir(plan);
      (void)compile_gpu_kernel(plan, 80);
    }
  } catch (const Error&) {
    // A graph the verifier accepts that a later stage refuses, with a message: allowed, as from the API.
  }
  return 0;
}
