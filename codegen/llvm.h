// The one header through which codegen sees LLVM (version 19; no version ladder).
#pragma once

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include "runtime/error.h"

#include <string>

namespace optjit {

// Converts an llvm::Error into an optjit::Error naming what was being done: the one place LLVM errors cross.
inline void check_llvm(llvm::Error error, const std::string& doing) {
  if (error)
    throw Error("LLVM failed while " + doing + ": " + llvm::toString(std::move(error)));
}

template <class T> T check_llvm(llvm::Expected<T> value, const std::string& doing) {
  if (!value)
    throw Error("LLVM failed while " + doing + ": " + llvm::toString(value.takeError()));
  return std::move(*value);
}

} // namespace optjit
