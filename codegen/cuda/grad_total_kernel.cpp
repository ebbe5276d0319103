// The grad total kernel (runtime/kernel_abi.h's GpuGradTotalHeader): a grad pass's totals (a clipping step's total
// grad norm and clip coefficient, the in-step inf check's finding) computed on the GPU from the values its grad pass
// kernels left there, so that the update's kernels read them where they were made and the host never waits. One
// block; each thread combines a strided share of every bucket's values, then a fixed tree in shared memory combines
// the threads' values; thread 0 writes the total and the coefficient, and 1 to found_inf for a finding. A sum for the
// 2-norm (then its square root), the largest value for the infinity norm, NaN-propagating as GradNormTotal
// (compiler/step_source.h) combines on the host.
#include "codegen/codegen.h"
#include "codegen/cuda/gpu_intrinsics.h"
#include "codegen/kernel_body.h"
#include "runtime/kernel_abi.h"

#include <limits>

namespace optjit {
namespace {

using namespace emission;

// a + b for sums; for maxima the larger, NaN when either is NaN (llvm.maximum's meaning, spelled out: NVPTX has no
// f64 maximum instruction).
llvm::Value* combine(llvm::IRBuilder<>& b, bool l2, llvm::Value* a, llvm::Value* v) {
  if (l2)
    return b.CreateFAdd(a, v);
  llvm::Value* larger = b.CreateSelect(b.CreateFCmpOGT(v, a), v, a);
  return b.CreateSelect(b.CreateFCmpUNO(a, v), llvm::ConstantFP::getNaN(b.getDoubleTy()), larger);
}

// A tensor's sum of squares as GradNormTotal::add takes it: its square root rounded to the grad's dtype
// (`rounding`, a GpuGradRounding: f64 -> f32 -> bf16 or f16, as runtime/low_precision.h converts), squared in f64.
llvm::Value* rounded_square_of_root(llvm::IRBuilder<>& b, llvm::Value* sum, llvm::Value* rounding) {
  llvm::Type* f32 = b.getFloatTy();
  llvm::Type* i32 = b.getInt32Ty();
  llvm::Value* norm = b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, sum);
  llvm::Value* single = b.CreateFPTrunc(norm, f32);
  // bf16 by integer arithmetic (bfloat16::round_bits): add 0x7fff plus the lowest kept bit, keep the upper half; a
  // NaN stays a quiet NaN.
  llvm::Value* bits = b.CreateBitCast(single, i32);
  llvm::Value* odd = b.CreateAnd(b.CreateLShr(bits, 16), 1);
  llvm::Value* nearest = b.CreateAnd(b.CreateAdd(bits, b.CreateAdd(b.getInt32(0x7fff), odd)), 0xffff0000u);
  llvm::Value* is_nan = b.CreateICmpUGT(b.CreateAnd(bits, 0x7fffffffu), b.getInt32(0x7f800000u));
  llvm::Value* quiet = b.CreateOr(b.CreateAnd(bits, 0xffff0000u), 0x00400000u);
  llvm::Value* bf16 = b.CreateBitCast(b.CreateSelect(is_nan, quiet, nearest), f32);
  llvm::Value* f16 = b.CreateFPExt(b.CreateFPTrunc(single, b.getHalfTy()), f32);
  const auto is = [&](GpuGradRounding r) { return b.CreateICmpEQ(rounding, b.getInt64(static_cast<int64_t>(r))); };
  llvm::Value* narrow =
      b.CreateSelect(is(GpuGradRounding::bf16), bf16, b.CreateSelect(is(GpuGradRounding::f16), f16, single));
  llvm::Value* rounded = b.CreateSelect(is(GpuGradRounding::none), norm, b.CreateFPExt(narrow, b.getDoubleTy()));
  return b.CreateFMul(rounded, rounded);
}

} // namespace

void emit_grad_total_kernel(llvm::Module& module, const std::string& symbol, GpuGradTotalForm form,
                            const GpuEmulationHooks* emulation) {
  const bool norm = form.norm != GpuGradTotalForm::Norm::none, l2 = form.norm == GpuGradTotalForm::Norm::l2;
  llvm::LLVMContext& ctx = module.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Type* f64 = b.getDoubleTy();
  llvm::Type* i64 = b.getInt64Ty();
  auto* global = llvm::PointerType::get(ctx, emulation ? 0 : 1);
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {global}, false),
                                    llvm::Function::ExternalLinkage, symbol, module);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  if (!emulation) {
    fn->setCallingConv(llvm::CallingConv::PTX_Kernel);
    annotate_gpu_kernel(module, fn, 0);
  }
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
  llvm::Value* descriptor = fn->getArg(0);
  const auto word = [&](llvm::Value* base, int64_t index, llvm::Type* type) {
    return b.CreateLoad(type, b.CreateConstGEP1_64(i64, base, index));
  };
  const auto address = [&](llvm::Value* value) { return b.CreateIntToPtr(value, global); };
  llvm::Value* thread = b.CreateZExt(gpu_register(b, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, emulation), i64);
  llvm::Value* threads = b.getInt64(kGpuGradTotalThreads);
  llvm::Value* zero = llvm::ConstantFP::get(f64, 0.0);
  llvm::Value* identity = llvm::ConstantFP::get(f64, l2 ? 0.0 : -std::numeric_limits<double>::infinity());
  // Per thread: the norm's partial, and how many of its tensors' check values are not 0.
  llvm::AllocaInst* acc = b.CreateAlloca(f64);
  llvm::AllocaInst* found = b.CreateAlloca(f64);
  b.CreateStore(identity, acc);
  b.CreateStore(zero, found);
  constexpr int64_t kHeaderWords = sizeof(GpuGradTotalHeader) / 8, kBucketWords = sizeof(GpuGradTotalBucket) / 8;
  emit_loop(b, b.getInt64(0), word(descriptor, 0, i64), b.getInt64(1), "bucket", [&](llvm::Value* k) {
    llvm::Value* entry =
        b.CreateGEP(i64, descriptor, b.CreateAdd(b.getInt64(kHeaderWords), b.CreateMul(k, b.getInt64(kBucketWords))));
    llvm::Value* carry = address(word(entry, 0, i64));
    llvm::Value* n_carry = word(entry, 2, i64);
    llvm::Value* norm_column = word(entry, 3, i64);
    llvm::Value* rounding = word(entry, 4, i64);
    llvm::Value* nonfinite_column = word(entry, 5, i64);
    emit_loop(b, thread, word(entry, 1, i64), threads, "tensor", [&](llvm::Value* t) {
      llvm::Value* row = b.CreateMul(t, n_carry);
      if (norm) {
        llvm::Value* v = b.CreateLoad(f64, b.CreateGEP(f64, carry, b.CreateAdd(row, norm_column)));
        if (l2)
          v = rounded_square_of_root(b, v, rounding);
        b.CreateStore(combine(b, l2, b.CreateLoad(f64, acc), v), acc);
      }
      if (form.checks) { // not 0: NaN, from an inf or NaN among the tensor's grads
        llvm::Value* v = b.CreateLoad(f64, b.CreateGEP(f64, carry, b.CreateAdd(row, nonfinite_column)));
        llvm::Value* one = b.CreateUIToFP(b.CreateFCmpUNE(v, zero), f64);
        b.CreateStore(b.CreateFAdd(b.CreateLoad(f64, found), one), found);
      }
    });
  });
  // The threads' values through a tree of halving strides in shared memory: the same order at every launch.
  auto* array = llvm::ArrayType::get(f64, kGpuGradTotalThreads);
  const auto shared_array = [&](const std::string& name) {
    auto* shared =
        new llvm::GlobalVariable(module, array, false, llvm::GlobalValue::InternalLinkage, llvm::UndefValue::get(array),
                                 symbol + name, nullptr, llvm::GlobalValue::NotThreadLocal, emulation ? 0 : 3);
    shared->setAlignment(llvm::Align(8));
    return shared;
  };
  llvm::GlobalVariable* norms = shared_array(".norms");
  llvm::GlobalVariable* founds = shared_array(".found");
  const auto slot = [&](llvm::GlobalVariable* shared, llvm::Value* index) {
    return b.CreateGEP(array, shared, {b.getInt64(0), index});
  };
  b.CreateStore(b.CreateLoad(f64, acc), slot(norms, thread));
  b.CreateStore(b.CreateLoad(f64, found), slot(founds, thread));
  gpu_barrier(b, emulation);
  for (int64_t stride = kGpuGradTotalThreads / 2; stride >= 1; stride /= 2) {
    emit_if(b, b.CreateICmpULT(thread, b.getInt64(stride)), "tree", [&] {
      llvm::Value* other = b.CreateAdd(thread, b.getInt64(stride));
      b.CreateStore(combine(b, l2, b.CreateLoad(f64, slot(norms, thread)), b.CreateLoad(f64, slot(norms, other))),
                    slot(norms, thread));
      b.CreateStore(b.CreateFAdd(b.CreateLoad(f64, slot(founds, thread)), b.CreateLoad(f64, slot(founds, other))),
                    slot(founds, thread));
    });
    gpu_barrier(b, emulation);
  }
  emit_if(b, b.CreateICmpEQ(thread, b.getInt64(0)), "write", [&] {
    if (norm) {
      llvm::Value* partial = b.CreateLoad(f64, slot(norms, b.getInt64(0)));
      llvm::Value* total = l2 ? b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, partial)
                              : b.CreateSelect(b.CreateFCmpOEQ(partial, identity), zero, partial); // no tensor: 0
      llvm::Value* coefficient =
          b.CreateFDiv(word(descriptor, 3, f64), b.CreateFAdd(total, llvm::ConstantFP::get(f64, 1e-6)));
      llvm::Value* one = llvm::ConstantFP::get(f64, 1.0);
      // torch's clamp(max=1): NaN stays NaN.
      coefficient = b.CreateSelect(b.CreateFCmpOGT(coefficient, one), one, coefficient);
      b.CreateStore(total, address(word(descriptor, 1, i64)));
      b.CreateStore(coefficient, address(word(descriptor, 2, i64)));
      llvm::Value* copy = word(descriptor, 4, i64);
      emit_if(b, b.CreateICmpNE(copy, b.getInt64(0)), "copy", [&] { b.CreateStore(total, address(copy)); });
    }
    if (form.checks) // found_inf is 0 before the step (the caller zeroes it): only a finding writes it
      emit_if(b, b.CreateFCmpOGT(b.CreateLoad(f64, slot(founds, b.getInt64(0))), zero), "found",
              [&] { b.CreateStore(llvm::ConstantFP::get(b.getFloatTy(), 1.0), address(word(descriptor, 5, i64))); });
  });
  b.CreateRetVoid();
}

} // namespace optjit
