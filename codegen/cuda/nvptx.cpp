// The NVPTX target: a kernel plan -> LLVM IR (codegen/kernel_emitter.h's GPU split) -> O3 -> PTX text for one
// compute capability, through LLVM's NVPTX backend. Loading the PTX is the runtime's job (cuModuleLoadDataEx).
#include "codegen/codegen.h"
#include "codegen/kernel_emitter.h"
#include "codegen/optimization_pipeline.h"
#include "runtime/log.h"

#include <llvm/IR/LegacyPassManager.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/TargetSelect.h>

#include <chrono>
#include <functional>
#include <mutex>

namespace optjit {
namespace {

constexpr const char* kTriple = "nvptx64-nvidia-cuda";
// PTX ISA 7.8 (CUDA 11.8 drivers and newer) is the lowest LLVM 19 accepts for sm_90; sm_80 uses the same.
constexpr const char* kPtxFeatures = "+ptx78";

std::unique_ptr<llvm::TargetMachine> nvptx_target_machine(int sm) {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
  std::string error;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(kTriple, error);
  if (!target)
    throw Error("LLVM has no NVPTX backend (" + error + "): this LLVM build cannot emit GPU code");
  llvm::TargetOptions options;
  auto* tm = target->createTargetMachine(kTriple, "sm_" + std::to_string(sm), kPtxFeatures, options, std::nullopt,
                                         std::nullopt, llvm::CodeGenOptLevel::Aggressive);
  if (!tm)
    throw Error("LLVM could not create an NVPTX target machine for sm_" + std::to_string(sm));
  return std::unique_ptr<llvm::TargetMachine>(tm);
}

void check_sm(int sm) {
  if (sm != 80 && sm != 90)
    throw Error("unsupported GPU target sm_" + std::to_string(sm) + ": optjit emits PTX for sm_80 and sm_90");
}

// A fresh module named `name`, `emit` run on it, then the O3 pipeline for the target.
std::unique_ptr<llvm::Module> build_gpu_module(const std::string& name, llvm::LLVMContext& ctx, llvm::TargetMachine& tm,
                                               const std::function<void(llvm::Module&)>& emit) {
  auto module = std::make_unique<llvm::Module>(name, ctx);
  module->setDataLayout(tm.createDataLayout());
  module->setTargetTriple(kTriple);
  emit(*module);
  optimize_for_target(*module, tm);
  return module;
}

std::unique_ptr<llvm::Module> build_gpu_module(const KernelPlan& plan, llvm::LLVMContext& ctx,
                                               llvm::TargetMachine& tm) {
  return build_gpu_module(plan.name, ctx, tm, [&](llvm::Module& m) { emit_gpu_kernel(plan, m, plan.name); });
}

// The module's PTX from the target's backend.
std::string emit_ptx(llvm::Module& module, llvm::TargetMachine& tm, int sm) {
  llvm::SmallString<0> ptx;
  llvm::raw_svector_ostream os(ptx);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw Error("LLVM's NVPTX backend cannot emit assembly for sm_" + std::to_string(sm));
  pm.run(module);
  return std::string(ptx.str());
}

} // namespace

int gpu_target_sm(int major, int minor) {
  (void)minor;
  if (major >= 9)
    return 90;
  if (major == 8)
    return 80;
  throw Error("CUDA device of compute capability " + std::to_string(major) + "." + std::to_string(minor) +
              " is too old: optjit's GPU kernels need 8.0 (Ampere) or newer");
}

GpuKernelCode compile_gpu_kernel(const KernelPlan& plan, int sm) {
  check_sm(sm);
  auto start = std::chrono::steady_clock::now();
  auto tm = nvptx_target_machine(sm);
  llvm::LLVMContext ctx;
  auto module = build_gpu_module(plan, ctx, *tm);
  GpuKernelCode code{emit_ptx(*module, *tm, sm), plan.name, sm, 0};
  code.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  OPTJIT_LOG(codegen, "compiled {} to PTX for sm_{} in {:.2f} ms ({} bytes)", plan.name, sm, code.compile_ms,
             code.ptx.size());
  return code;
}

GpuKernelCode compile_gpu_grad_total(GpuGradTotalForm form, int sm) {
  check_sm(sm);
  auto start = std::chrono::steady_clock::now();
  auto tm = nvptx_target_machine(sm);
  llvm::LLVMContext ctx;
  const char* norms[] = {"", "_l2", "_max"};
  const std::string entry =
      std::string("optjit_grad_total") + norms[static_cast<int>(form.norm)] + (form.checks ? "_checked" : "");
  auto module = build_gpu_module(entry, ctx, *tm, [&](llvm::Module& m) { emit_grad_total_kernel(m, entry, form); });
  GpuKernelCode code{emit_ptx(*module, *tm, sm), entry, sm, 0};
  code.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return code;
}

std::string gpu_kernel_llvm_ir(const KernelPlan& plan, int sm) {
  check_sm(sm);
  auto tm = nvptx_target_machine(sm);
  llvm::LLVMContext ctx;
  auto module = build_gpu_module(plan, ctx, *tm);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, nullptr);
  return text;
}

} // namespace optjit
