// The process-wide ORC LLJIT for the host CPU: each kernel is its own module under its own resource tracker, so a
// kernel evicted from the cache gives its machine code back. Kernels compile concurrently (the driver compiles a
// step's kernels at once): each is emitted and optimized in an LLVMContext of its own, and the JIT, built with
// concurrent compilation support, compiles each module to machine code on the thread that looks it up. Target
// machines come from a pool, one per compile running at once (TargetMachinePool).
#include "codegen/codegen.h"
#include "codegen/cuda/device_math.h"
#include "codegen/cuda/gpu_emulation.h"
#include "codegen/kernel_emitter.h"
#include "codegen/optimization_pipeline.h"
#include "runtime/log.h"

#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/TargetParser/Host.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

namespace optjit {
namespace {

// Host target machines, each used by one thread at a time and kept for the next compile: creating one costs about 4
// ms, a fifth of a kernel's compile, and a kernel needs one to optimize and one to emit code.
class TargetMachinePool {
public:
  explicit TargetMachinePool(llvm::orc::JITTargetMachineBuilder builder) : builder_(std::move(builder)) {}

  // fn(machine) with a machine no other thread uses meanwhile; fn's result (an llvm::Error when none can be made).
  template <class Fn> auto with(Fn&& fn) -> decltype(fn(std::declval<llvm::TargetMachine&>())) {
    std::unique_ptr<llvm::TargetMachine> machine;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        machine = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!machine) {
      auto made = builder_.createTargetMachine();
      if (!made)
        return made.takeError();
      machine = std::move(*made);
    }
    auto result = fn(*machine);
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(machine));
    return result;
  }

private:
  llvm::orc::JITTargetMachineBuilder builder_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<llvm::TargetMachine>> free_;
};

// ORC's compile function (a module to an object file) on the pool's machines, from any thread.
class PooledCompiler : public llvm::orc::IRCompileLayer::IRCompiler {
public:
  PooledCompiler(TargetMachinePool& pool, const llvm::TargetOptions& options)
      : IRCompiler(llvm::orc::irManglingOptionsFromTargetOptions(options)), pool_(pool) {}
  llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> operator()(llvm::Module& module) override {
    return pool_.with([&](llvm::TargetMachine& machine) { return llvm::orc::SimpleCompiler(machine)(module); });
  }

private:
  TargetMachinePool& pool_;
};

class CpuJit {
public:
  static CpuJit& instance() {
    static CpuJit* jit = new CpuJit(); // lives for the process: kernels may be released during static destruction
    return *jit;
  }

  void optimize(llvm::Module& module) {
    check_llvm(machines_.with([&](llvm::TargetMachine& machine) -> llvm::Expected<bool> {
      optimize_with(module, machine);
      return true;
    }),
               "creating the host target machine");
  }

  llvm::orc::LLJIT& jit() { return *jit_; }
  std::string next_symbol_prefix() { return "optjit_kernel_" + std::to_string(counter_++); }
  const std::string& cpu_description() const { return description_; }
  // Whether the CPU converts f32 to bf16 in one instruction (AVX512-BF16; OPTJIT_NATIVE_BF16=0 turns it off).
  bool native_bf16() const { return native_bf16_; }

private:
  // The host's layout and triple, then the pipeline both targets share (codegen/optimization_pipeline.h).
  static void optimize_with(llvm::Module& module, llvm::TargetMachine& machine) {
    module.setDataLayout(machine.createDataLayout());
    module.setTargetTriple(machine.getTargetTriple().str());
    optimize_for_target(module, machine);
  }

  CpuJit() : builder_(detect()), machines_(builder_) {
    jit_ = check_llvm(
        llvm::orc::LLJITBuilder()
            .setJITTargetMachineBuilder(builder_)
            .setSupportConcurrentCompilation(true)
            .setCompileFunctionCreator([this](llvm::orc::JITTargetMachineBuilder builder)
                                           -> llvm::Expected<std::unique_ptr<llvm::orc::IRCompileLayer::IRCompiler>> {
              return std::make_unique<PooledCompiler>(machines_, builder.getOptions());
            })
            .create(),
        "creating the JIT");
    // Kernels call libm (pow, exp, log) from the process.
    jit_->getMainJITDylib().addGenerator(check_llvm(
        llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(jit_->getDataLayout().getGlobalPrefix()),
        "exposing process symbols to the JIT"));
    description_ = describe(builder_);
    const std::vector<std::string>& features = builder_.getFeatures().getFeatures();
    const char* setting = std::getenv("OPTJIT_NATIVE_BF16");
    native_bf16_ = std::find(features.begin(), features.end(), "+avx512bf16") != features.end() &&
                   !(setting && std::string_view(setting) == "0");
  }

  // "znver2 (avx2, fma)": the CPU name and the vector features that decide the kernels' width.
  static std::string describe(const llvm::orc::JITTargetMachineBuilder& host) {
    std::string features;
    for (const std::string& f : host.getFeatures().getFeatures())
      for (const char* wanted : {"+avx2", "+fma", "+avx512f", "+avx512bf16"})
        if (f == wanted)
          features += (features.empty() ? "" : ", ") + f.substr(1);
    return host.getCPU() + " (" + (features.empty() ? "no AVX2" : features) + ")";
  }

  static llvm::orc::JITTargetMachineBuilder detect() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::orc::JITTargetMachineBuilder host =
        check_llvm(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host CPU");
    host.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    return host;
  }

  llvm::orc::JITTargetMachineBuilder builder_;
  TargetMachinePool machines_; // after builder_: made from it
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  std::atomic<uint64_t> counter_{0};
  std::string description_;
  bool native_bf16_ = false;
};

// A module's machine code in the JIT, under a resource tracker of its own, given back when this is destroyed. ORC's
// session is thread-safe: modules are added, compiled (at their first lookup) and removed from any thread.
class JitCode {
public:
  JitCode(std::unique_ptr<llvm::Module> module, std::unique_ptr<llvm::LLVMContext> context, const std::string& what)
      : tracker_(CpuJit::instance().jit().getMainJITDylib().createResourceTracker()) {
    check_llvm(CpuJit::instance().jit().addIRModule(tracker_,
                                                    llvm::orc::ThreadSafeModule(std::move(module), std::move(context))),
               "adding " + what + " to the JIT");
  }
  ~JitCode() { llvm::consumeError(tracker_->remove()); }
  JitCode(const JitCode&) = delete;
  JitCode& operator=(const JitCode&) = delete;

  template <class Fn> Fn lookup(const std::string& symbol) const {
    return check_llvm(CpuJit::instance().jit().lookup(symbol), "materialising " + symbol).template toPtr<Fn>();
  }

private:
  llvm::orc::ResourceTrackerSP tracker_;
};

class JitCpuKernel : public CpuKernel {
public:
  std::unique_ptr<JitCode> code;
};

std::unique_ptr<llvm::Module> build_module(const KernelPlan& plan, llvm::LLVMContext& ctx, const std::string& prefix,
                                           EmittedKernel& names) {
  auto module = std::make_unique<llvm::Module>(plan.name, ctx);
  names = emit_cpu_kernel(plan, *module, prefix, cpu_vector_lanes(plan.graph.dtype), CpuJit::instance().native_bf16());
  CpuJit::instance().optimize(*module);
  return module;
}

} // namespace

int cpu_vector_lanes(Dtype dtype) { return static_cast<int>(64 / dtype_size(dtype)); }

std::string host_cpu_description() { return CpuJit::instance().cpu_description(); }

std::shared_ptr<CpuKernel> compile_cpu_kernel(const KernelPlan& plan) {
  auto start = std::chrono::steady_clock::now();
  CpuJit& jit = CpuJit::instance();
  auto context = std::make_unique<llvm::LLVMContext>();
  EmittedKernel names;
  auto module = build_module(plan, *context, jit.next_symbol_prefix(), names);
  auto kernel = std::make_shared<JitCpuKernel>();
  kernel->code = std::make_unique<JitCode>(std::move(module), std::move(context), "kernel " + plan.name);
  kernel->tensor_phase = kernel->code->lookup<KernelPhaseFn>(names.tensor_phase);
  kernel->element_phase = kernel->code->lookup<KernelPhaseFn>(names.element_phase);
  if (!names.finish_phase.empty())
    kernel->finish_phase = kernel->code->lookup<KernelPhaseFn>(names.finish_phase);
  kernel->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  OPTJIT_LOG(codegen, "compiled {} for {} in {:.2f} ms", plan.name, jit.cpu_description(), kernel->compile_ms);
  return kernel;
}

namespace {

class JitEmulatedGpuKernel : public EmulatedGpuKernel {
public:
  std::unique_ptr<JitCode> code;
  void set_entry(void (*entry)(const void*)) { entry_ = entry; }
};

// `kernel` (the GPU kernel emitted for the host) called from `name`(const GpuKernelParams*): the fields loaded in
// the ABI's order, global ones as pointers.
void define_emulation_entry(llvm::Module& module, llvm::Function* kernel, const std::string& name) {
  llvm::LLVMContext& ctx = module.getContext();
  auto* ptr = llvm::PointerType::getUnqual(ctx);
  auto* i64 = llvm::Type::getInt64Ty(ctx);
  auto* entry = llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {ptr}, false),
                                       llvm::Function::ExternalLinkage, name, module);
  llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", entry));
  std::vector<llvm::Value*> args;
  unsigned index = 0;
#define OPTJIT_GPU_PARAM(name, type, kind)                                                                             \
  {                                                                                                                    \
    llvm::Value* field = b.CreateLoad(i64, b.CreateConstGEP1_64(i64, entry->getArg(0), index++));                      \
    args.push_back(std::string_view(#kind) == "global" ? b.CreateIntToPtr(field, ptr) : field);                        \
  }
#include "runtime/kernel_abi.def"
#undef OPTJIT_GPU_PARAM
  b.CreateCall(kernel, args);
  b.CreateRetVoid();
}

} // namespace

std::shared_ptr<EmulatedGpuKernel> compile_gpu_kernel_for_host(const KernelPlan& plan) {
  CpuJit& jit = CpuJit::instance();
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = std::make_unique<llvm::Module>(plan.name, *context);
  const std::string prefix = jit.next_symbol_prefix();
  emit_gpu_kernel(plan, *module, prefix + "_gpu", &gpu_emulation_hooks());
  define_emulation_entry(*module, module->getFunction(prefix + "_gpu"), prefix + "_entry");
  jit.optimize(*module);
  auto kernel = std::make_shared<JitEmulatedGpuKernel>();
  kernel->code = std::make_unique<JitCode>(std::move(module), std::move(context), "emulated GPU kernel " + plan.name);
  kernel->set_entry(kernel->code->lookup<void (*)(const void*)>(prefix + "_entry"));
  return kernel;
}

std::shared_ptr<EmulatedGpuKernel> compile_gpu_grad_total_for_host(GpuGradTotalForm form) {
  CpuJit& jit = CpuJit::instance();
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = std::make_unique<llvm::Module>("grad_total", *context);
  const std::string symbol = jit.next_symbol_prefix() + "_grad_total";
  emit_grad_total_kernel(*module, symbol, form, &gpu_emulation_hooks());
  jit.optimize(*module);
  auto kernel = std::make_shared<JitEmulatedGpuKernel>();
  kernel->code = std::make_unique<JitCode>(std::move(module), std::move(context), "emulated grad total kernel");
  kernel->set_entry(kernel->code->lookup<void (*)(const void*)>(symbol));
  return kernel;
}

HostDeviceMath device_math_on_host() {
  static const HostDeviceMath math = [] {
    CpuJit& jit = CpuJit::instance();
    auto context = std::make_unique<llvm::LLVMContext>();
    auto module = std::make_unique<llvm::Module>("device_math", *context);
    const DeviceMath defined = define_device_math(*module);
    // External wrappers: the definitions are internal to the module.
    for (llvm::Function* fn : {defined.exp, defined.log, defined.pow}) {
      auto* wrapper = llvm::Function::Create(fn->getFunctionType(), llvm::Function::ExternalLinkage,
                                             "host_" + fn->getName().str().substr(7), *module);
      llvm::IRBuilder<> b(llvm::BasicBlock::Create(*context, "entry", wrapper));
      std::vector<llvm::Value*> args;
      for (llvm::Argument& a : wrapper->args())
        args.push_back(&a);
      b.CreateRet(b.CreateCall(fn, args));
    }
    jit.optimize(*module);
    check_llvm(jit.jit().addIRModule(llvm::orc::ThreadSafeModule(std::move(module), std::move(context))),
               "adding the device math module to the JIT");
    auto find = [&](const char* name) {
      return check_llvm(jit.jit().lookup(name), std::string("materialising ") + name);
    };
    return HostDeviceMath{find("host_exp").toPtr<double (*)(double)>(), find("host_log").toPtr<double (*)(double)>(),
                          find("host_pow").toPtr<double (*)(double, double)>()};
  }();
  return math;
}

std::string cpu_kernel_llvm_ir(const KernelPlan& plan) {
  llvm::LLVMContext context;
  EmittedKernel names;
  auto module = build_module(plan, context, plan.name, names);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, nullptr);
  return text;
}

} // namespace optjit
