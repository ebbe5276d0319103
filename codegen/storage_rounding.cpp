// Conversions between a kernel's compute type and its slots' storage dtypes: bf16 widened and rounded by hand (to
// nearest even, or by the CPU's own conversion where it has one), and stochastic rounding to bf16 with
// runtime/stochastic_rounding.h's bits. KernelBody's members (codegen/kernel_body.h).
#include "codegen/kernel_body.h"
#include "runtime/stochastic_rounding.h"

#include <limits>

namespace optjit::emission {

// A value loaded from `storage` (scalar or vector), in the compute type `type`. bf16 is kept as its 16 bits and
// widened by hand (its bits are a float's upper half), so that no target needs a bf16 conversion routine.
Value* KernelBody::from_storage(IRBuilder<>& b, Value* v, Dtype storage, llvm::Type* type) {
  if (storage == Dtype::bf16) {
    Value* wide = b.CreateShl(b.CreateZExt(v, with_lanes(b.getInt32Ty(), v->getType())), 16);
    v = b.CreateBitCast(wide, with_lanes(b.getFloatTy(), v->getType()));
  }
  return convert(b, v, type);
}

// A computed value (scalar or vector) rounded to `storage`, to nearest with ties to even. bf16 by hand (below), or
// by the CPU's conversion where it has one: that conversion flushes subnormals, so a vector holding one (rare:
// below 2^-126) branches to the exact rounding.
Value* KernelBody::to_storage(IRBuilder<>& b, Value* v, Dtype storage) {
  if (storage != Dtype::bf16)
    return convert(b, v, with_lanes(scalar_type(storage), v->getType()));
  v = convert(b, v, with_lanes(b.getFloatTy(), v->getType()));
  if (!native_bf16_)
    return round_to_bf16_bits(b, v);
  llvm::Type* i16 = with_lanes(b.getInt16Ty(), v->getType());
  Value* native = b.CreateBitCast(b.CreateFPTrunc(v, with_lanes(b.getBFloatTy(), v->getType())), i16);
  Value* magnitude = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, v);
  Value* subnormal =
      b.CreateAnd(b.CreateFCmpOLT(magnitude, llvm::ConstantFP::get(v->getType(), std::numeric_limits<float>::min())),
                  b.CreateFCmpONE(magnitude, llvm::Constant::getNullValue(v->getType())));
  Value* any_subnormal = v->getType()->isVectorTy() ? b.CreateOrReduce(subnormal) : subnormal;
  llvm::BasicBlock* fast = b.GetInsertBlock();
  llvm::Function* fn = fast->getParent();
  auto* exact = llvm::BasicBlock::Create(ctx_, "bf16.subnormal", fn);
  auto* join = llvm::BasicBlock::Create(ctx_, "bf16.rounded", fn);
  b.CreateCondBr(any_subnormal, exact, join);
  b.SetInsertPoint(exact);
  Value* exact_bits = round_to_bf16_bits(b, v);
  b.CreateBr(join);
  b.SetInsertPoint(join);
  llvm::PHINode* bits = b.CreatePHI(i16, 2);
  bits->addIncoming(native, fast);
  bits->addIncoming(exact_bits, exact);
  return bits;
}

// f32 (scalar or vector) to bf16 bits by integer arithmetic: add 0x7fff plus the lowest kept bit and keep the upper
// half; NaNs stay quiet NaNs. Exact for every input, subnormals included.
Value* KernelBody::round_to_bf16_bits(IRBuilder<>& b, Value* v) {
  llvm::Type* i32 = with_lanes(b.getInt32Ty(), v->getType());
  Value* bits = b.CreateBitCast(v, i32);
  Value* upper = b.CreateLShr(bits, 16);
  Value* lowest_kept = b.CreateAnd(upper, llvm::ConstantInt::get(i32, 1));
  Value* rounded = b.CreateLShr(b.CreateAdd(b.CreateAdd(bits, llvm::ConstantInt::get(i32, 0x7fff)), lowest_kept), 16);
  Value* quiet_nan = b.CreateOr(upper, llvm::ConstantInt::get(i32, 0x40));
  Value* result = b.CreateSelect(b.CreateFCmpUNO(v, v), quiet_nan, rounded);
  return b.CreateTrunc(result, with_lanes(b.getInt16Ty(), v->getType()));
}

// runtime/stochastic_rounding.h's rounding_mix, lane by lane.
Value* KernelBody::rounding_mix(IRBuilder<>& b, Value* x) {
  auto constant = [&](uint64_t v) { return llvm::ConstantInt::get(x->getType(), v); };
  x = b.CreateXor(x, b.CreateLShr(x, constant(30)));
  x = b.CreateMul(x, constant(0xbf58476d1ce4e5b9ull));
  x = b.CreateXor(x, b.CreateLShr(x, constant(27)));
  x = b.CreateMul(x, constant(0x94d049bb133111ebull));
  return b.CreateXor(x, b.CreateLShr(x, constant(31)));
}

// sround: in[0] (f32 lanes) rounded to bf16 with runtime/stochastic_rounding.h's bits for counter in[1] and stream
// in[2] (f64 lanes holding whole numbers) at element `index`; the same operations as stochastic_round_bf16.
Value* KernelBody::emit_stochastic_round(IRBuilder<>& b, const std::vector<Value*>& in, Value* index) {
  llvm::Type* i64 = with_lanes(b.getInt64Ty(), in[0]->getType());
  llvm::Type* i32 = with_lanes(b.getInt32Ty(), in[0]->getType());
  auto constant = [&](llvm::Type* type, uint64_t v) { return llvm::ConstantInt::get(type, v); };
  Value* counter = b.CreateFPToUI(in[1], i64);
  Value* stream = b.CreateFPToUI(in[2], i64);
  Value* key = rounding_mix(b, b.CreateXor(counter, rounding_mix(b, stream)));
  Value* draw = rounding_mix(b, b.CreateAdd(key, b.CreateMul(index, constant(i64, kRoundingGolden))));
  Value* bits = b.CreateTrunc(b.CreateLShr(draw, constant(i64, 48)), i32);
  Value* u = b.CreateBitCast(in[0], i32);
  Value* magnitude = b.CreateAnd(u, constant(i32, 0x7fffffff));
  Value* rounded = b.CreateAnd(b.CreateAdd(u, bits), constant(i32, 0xffff0000));
  Value* saturates =
      b.CreateAnd(b.CreateICmpEQ(b.CreateAnd(rounded, constant(i32, 0x7fffffff)), constant(i32, 0x7f800000)),
                  b.CreateICmpULT(magnitude, constant(i32, kBf16NearestOverflow)));
  rounded = b.CreateSelect(
      saturates, b.CreateOr(b.CreateAnd(u, constant(i32, 0x80000000)), constant(i32, kBf16LargestFinite)), rounded);
  Value* quiet_nan = b.CreateAnd(b.CreateOr(u, constant(i32, 0x00400000)), constant(i32, 0xffff0000));
  Value* result = b.CreateSelect(b.CreateICmpUGT(magnitude, constant(i32, 0x7f800000)), quiet_nan,
                                 b.CreateSelect(b.CreateICmpEQ(magnitude, constant(i32, 0x7f800000)), u, rounded));
  return b.CreateBitCast(result, in[0]->getType());
}

} // namespace optjit::emission
