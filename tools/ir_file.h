// Optimizers written as IR text (the printer's format, ir/printer.h): `optjit dump --ir FILE` prints a
// stage of the code the pipeline makes of it, and `optjit run FILE` runs it, so that passes and codegen can be
// exercised without C++.
#pragma once

#include "compiler/compile_options.h"
#include "ir/ir.h"

#include <cstdint>
#include <filesystem>
#include <string>

namespace optjit {

// The largest IR file read (it is parsed whole, in memory).
constexpr uintmax_t kMaxIrFileBytes = uintmax_t{64} << 20;

// The graph in `file`, parsed and verified; throws optjit::Error naming the file and the line.
Graph read_ir_file(const std::filesystem::path& file);

// One stage of the code for the graph in `file`: traced (the graph as read), optimized, fused, llvm or ptx (for
// sm_`gpu_sm`, 80 when 0).
std::string dump_ir_file(const std::filesystem::path& file, Stage stage, int gpu_sm = 0, Device device = Device::cpu());

struct RunIrOptions {
  std::string file;
  std::string params = "1000,37"; // the tensors every tensor slot holds, as --params shapes
  std::string set;                // the graph's hyperparameters, "lr=0.01,beta=0.9": every one needs a value
  int steps = 3;
  uint64_t seed = 0;
};
// Runs the graph `steps` times over random params and grads (zero state), compiled for the CPU and through the
// interpreter on copies, and prints the kernel count, the compile time and how far the two results are apart.
// Returns 0 when they agree (|compiled - interpreted| <= 1e-6 + rtol |interpreted|, rtol 1e-5, or one unit of a
// bf16 or f16 slot's precision; NaN where NaN), 1 when not.
int run_ir_file(const RunIrOptions& options);

} // namespace optjit
