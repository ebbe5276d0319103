// Codegen's public face: kernel plans in, callable kernels or text out. No LLVM type appears here.
#pragma once

#include "ir/kernel_plan.h"
#include "runtime/kernel_abi.h"

#include <memory>
#include <string>

namespace optjit {

// A kernel compiled for the host CPU. Its code stays in the JIT as long as this object lives.
class CpuKernel {
public:
  virtual ~CpuKernel() = default;
  KernelPhaseFn tensor_phase = nullptr;  // per-tensor prologue over a tensor range
  KernelPhaseFn element_phase = nullptr; // element body over a work-item range
  KernelPhaseFn finish_phase = nullptr;  // reductions' partials combined over a tensor range; null without reductions
  double compile_ms = 0;                 // LLVM time: emit, optimize, machine code
};

// Compiles a kernel plan for the host CPU through the process-wide ORC LLJIT. Throws optjit::Error when LLVM
// rejects the module (an internal error: plans are verified).
std::shared_ptr<CpuKernel> compile_cpu_kernel(const KernelPlan& plan);

// The kernel's LLVM IR for the host CPU, after the O3 pipeline: what compile_cpu_kernel runs.
std::string cpu_kernel_llvm_ir(const KernelPlan& plan);

// "znver3 (+avx2,+fma,...)": the CPU name and the features the JIT targets.
std::string host_cpu_description();

// Elements per vector step of the element loop for `dtype` (64 bytes: one AVX-512 register, two AVX2).
int cpu_vector_lanes(Dtype dtype);

// A kernel for NVIDIA GPUs as PTX text (runtime/kernel_abi.h's GPU calling convention), entry point `entry`.
struct GpuKernelCode {
  std::string ptx;
  std::string entry;
  int sm = 0;            // the compute capability it targets: 80 or 90
  double compile_ms = 0; // LLVM time: emit, optimize, PTX
};

// Compiles a kernel plan to PTX for sm_80 or sm_90 through LLVM's NVPTX backend; needs no GPU.
GpuKernelCode compile_gpu_kernel(const KernelPlan& plan, int sm);
// The GPU's exp, log and pow (codegen/cuda/device_math.h) compiled for the host, so tests can hold them against libm.
struct HostDeviceMath {
  double (*exp)(double);
  double (*log)(double);
  double (*pow)(double, double);
};
HostDeviceMath device_math_on_host();

// How an emulated block's threads run (codegen/cuda/gpu_emulation.cpp): concurrently, meeting at a real barrier; or in
// turns, one thread at a time between barriers, in thread order and in reverse order alternately, so that a missing
// barrier shows as a wrong value every time (slower: a thread switch per thread and barrier). Blocks run one after
// another: in block order concurrently, in reverse block order in turns, so that a block that writes what a later
// block of the same tensor still reads shows in one of the two.
enum class EmulatedSchedule { Concurrent, InTurns };

// A GPU kernel compiled for the host CPU (the same emitted kernel, its thread registers and barrier answered by the
// host): its blocks run one after another, each on `threads` host threads. The GPU kernels' logic (work items,
// 128-bit paths, block reductions, the last block of each tensor, carried values, rows and columns) is checked this
// way without a GPU. For tests; slow (threads are made per launch).
class EmulatedGpuKernel {
public:
  virtual ~EmulatedGpuKernel() = default;
  // Runs blocks [0, grid) on `params`, whose global fields hold host addresses.
  void launch(unsigned grid, unsigned threads, const GpuKernelParams& params,
              EmulatedSchedule schedule = EmulatedSchedule::Concurrent) const {
    launch_with(grid, threads, &params, schedule);
  }
  // The same with the kernel's one argument, for a kernel of another signature (the grad total kernel's descriptor).
  void launch_with(unsigned grid, unsigned threads, const void* argument,
                   EmulatedSchedule schedule = EmulatedSchedule::Concurrent) const;

protected:
  void (*entry_)(const void*) = nullptr;
};
std::shared_ptr<EmulatedGpuKernel> compile_gpu_kernel_for_host(const KernelPlan& plan);

// The grad total kernel of `form` (runtime/kernel_abi.h's GpuGradTotalHeader: a grad pass's totals from its kernels'
// values, on the GPU) as PTX for `sm`, and for the host (launched with one block of kGpuGradTotalThreads threads and
// the descriptor's host address).
GpuKernelCode compile_gpu_grad_total(GpuGradTotalForm form, int sm);
std::shared_ptr<EmulatedGpuKernel> compile_gpu_grad_total_for_host(GpuGradTotalForm form);

// The kernel's LLVM IR for the GPU after the O3 pipeline.
std::string gpu_kernel_llvm_ir(const KernelPlan& plan, int sm);
// The PTX target for a device of compute capability major.minor: 90 from Hopper on, 80 for Ampere and Ada (PTX
// for sm_80 runs on every later GPU); throws for older devices.
int gpu_target_sm(int major, int minor);

} // namespace optjit
