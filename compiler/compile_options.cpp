#include "compiler/compile_options.h"
#include "runtime/error.h"

#include <string>

namespace optjit {

Stage parse_stage(std::string_view text) {
  if (text == "traced")
    return Stage::Traced;
  if (text == "optimized")
    return Stage::Optimized;
  if (text == "fused")
    return Stage::Fused;
  if (text == "llvm")
    return Stage::LLVM;
  if (text == "ptx")
    return Stage::PTX;
  throw Error("unknown stage '" + std::string(text) + "': expected traced, optimized, fused, llvm or ptx");
}

Target code_target(const Target& target, Stage stage, int gpu_sm) {
  if (gpu_sm)
    return Target::cuda_code(gpu_sm);
  if (stage == Stage::PTX && target.sm == 0)
    return Target::cuda_code(80);
  return target;
}

} // namespace optjit
