// The optjit CLI's subcommands, callable from C++ (tools/main.cpp parses the command line).
#pragma once

#include "runtime/device.h"
#include "runtime/dtype.h"

#include <string>
#include <vector>

namespace optjit {

// Compiles Adam for a 4-layer MLP and compares it with eager steps: kernels, compile time, step time, GB/s.
int run_demo(Device device = Device::cpu()); // cuda: the compiled step runs on that GPU

struct BenchOptions {
  bool json = false;
  Device device;            // cuda: tools/bench_cuda.cpp
  std::string only = "all"; // "pointwise": the pointwise optimizers, compile and dispatch; "muon": Muon's rows
  int muon_layers = 12;     // Muon's rows: the matrices of this many Transformer layers (d_model 768)
};
// Compiled Adam against a traffic probe, cold compile times and per-step dispatch overhead.
int run_bench(const BenchOptions& options);
// Compiled Adam on a CUDA device against its measured copy bandwidth, with PyTorch's anchors when present.
int run_bench_cuda(const BenchOptions& options);

// Kernels per step for every known optimizer configuration, beside PyTorch Inductor's counts.
int run_counts(bool json);

struct DumpOptions {
  std::string optimizer = "adam";
  std::string set; // "lr=0.01,amsgrad=true,betas=(0.8,0.9)"
  std::string params = "10x10,10,10x10,10";
  Dtype dtype = Dtype::f32;
  std::string stage = "fused";
  Device device; // cuda: LLVM IR and PTX for the GPU (params go there when a GPU is present)
  int sm = 0;    // GPU target 80 or 90; 0: the device's, or 80 without a GPU
};
int run_dump(const DumpOptions& options);

struct ReplayOptions {
  std::string mode = "all"; // forloop, eager, compiled or all
  std::vector<std::string> paths;
  Device device; // cuda: params and grads on the GPU, compiled mode
};
int run_replay(const ReplayOptions& options);

} // namespace optjit
