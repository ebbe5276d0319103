#include "codegen/optimization_pipeline.h"

#include <llvm/Passes/PassBuilder.h>
#include <llvm/Target/TargetMachine.h>

namespace optjit {

void optimize_for_target(llvm::Module& module, llvm::TargetMachine& machine) {
  for (llvm::Function& fn : module) {
    if (fn.isDeclaration())
      continue;
    fn.addFnAttr("target-cpu", machine.getTargetCPU());
    fn.addFnAttr("target-features", machine.getTargetFeatureString());
  }
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(&machine);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(module, mam);
}

} // namespace optjit
