// Fuzzes the IR text format through everything behind it: parse_graph, verify, the pass pipeline, and codegen for
// the CPU (LLVM IR after O3) and the GPU (PTX for sm_80). Text the parser or verifier refuses ends there with an
// optjit::Error; a verified graph must get through the passes and codegen without an internal error, and printing
// it must give text that parses back to the same graph (the printer and parser agree).
#include "codegen/codegen.h"
#include "compiler/ir/parser.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verifier.h"
#include "compiler/pipeline.h"
#include "runtime/error.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace optjit;
  Graph graph;
  try {
    graph = parse_graph(std::string_view(reinterpret_cast<const char*>(data), size));
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
