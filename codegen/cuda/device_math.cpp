#include "codegen/cuda/device_math.h"

#include <cmath>
#include <vector>

namespace optjit {
namespace {

using llvm::IRBuilder;
using llvm::Value;

constexpr double kLn2Hi = 6.93147180369123816490e-01; // ln 2 split so that k * kLn2Hi is exact for |k| < 2^11
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kInvLn2 = 1.44269504088896338700e+00;

Value* constant(IRBuilder<>& b, double value) { return llvm::ConstantFP::get(b.getDoubleTy(), value); }

Value* fma(IRBuilder<>& b, Value* x, Value* y, Value* z) {
  return b.CreateIntrinsic(llvm::Intrinsic::fma, {b.getDoubleTy()}, {x, y, z});
}

// Horner's scheme with fused multiply-adds: coefficients from the highest power down.
Value* polynomial(IRBuilder<>& b, Value* x, const std::vector<double>& coefficients) {
  Value* acc = nullptr;
  for (double c : coefficients)
    acc = acc ? fma(b, acc, x, constant(b, c)) : constant(b, c);
  return acc;
}

// 2^k for an integer-valued double k in [-1022, 1023], built from its exponent bits.
Value* power_of_two(IRBuilder<>& b, Value* k) {
  Value* biased = b.CreateAdd(b.CreateFPToSI(k, b.getInt64Ty()), b.getInt64(1023));
  return b.CreateBitCast(b.CreateShl(biased, 52), b.getDoubleTy());
}

llvm::Function* declare(llvm::Module& module, const char* name, unsigned params) {
  llvm::LLVMContext& ctx = module.getContext();
  std::vector<llvm::Type*> types(params, llvm::Type::getDoubleTy(ctx));
  auto* type = llvm::FunctionType::get(llvm::Type::getDoubleTy(ctx), types, false);
  auto* fn = llvm::Function::Create(type, llvm::Function::InternalLinkage, name, module);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  fn->setDoesNotAccessMemory();
  return fn;
}

// exp(x) = 2^k * e^r with k = rint(x / ln 2) and |r| <= ln(2) / 2; e^r by its Taylor series to r^13 (the first
// term left out is below 2^-60 relative). 2^k is applied in two halves so that results near the subnormal and
// overflow limits are exact scalings.
void define_exp(llvm::Function* fn) {
  IRBuilder<> b(llvm::BasicBlock::Create(fn->getContext(), "entry", fn));
  Value* x = fn->getArg(0);
  Value* k = b.CreateIntrinsic(llvm::Intrinsic::rint, {b.getDoubleTy()}, {b.CreateFMul(x, constant(b, kInvLn2))});
  k = b.CreateIntrinsic(llvm::Intrinsic::maxnum, {b.getDoubleTy()}, {k, constant(b, -1100)});
  k = b.CreateIntrinsic(llvm::Intrinsic::minnum, {b.getDoubleTy()}, {k, constant(b, 1100)});
  Value* r = fma(b, b.CreateFNeg(k), constant(b, kLn2Hi), x);
  r = fma(b, b.CreateFNeg(k), constant(b, kLn2Lo), r);
  std::vector<double> taylor(14); // 1/13!, 1/12!, ..., 1/1!, 1/0! (the factorials are exact doubles)
  double factorial = 1;
  for (int n = 0; n <= 13; ++n) {
    factorial *= n > 0 ? n : 1;
    taylor[static_cast<std::size_t>(13 - n)] = 1.0 / factorial;
  }
  Value* acc = polynomial(b, r, taylor);
  Value* half = b.CreateIntrinsic(llvm::Intrinsic::trunc, {b.getDoubleTy()}, {b.CreateFMul(k, constant(b, 0.5))});
  Value* scaled = b.CreateFMul(b.CreateFMul(acc, power_of_two(b, half)), power_of_two(b, b.CreateFSub(k, half)));
  Value* result = b.CreateSelect(b.CreateFCmpOGT(x, constant(b, 709.782712893384)), constant(b, INFINITY), scaled);
  result = b.CreateSelect(b.CreateFCmpOLT(x, constant(b, -745.1332191019412)), constant(b, 0.0), result);
  result = b.CreateSelect(b.CreateFCmpUNO(x, x), x, result);
  b.CreateRet(result);
}

// log(x) = e * ln 2 + log(m) with x = m * 2^e, m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m-1)/(m+1),
// |s| <= 0.1716, by its odd series to s^23.
void define_log(llvm::Function* fn) {
  IRBuilder<> b(llvm::BasicBlock::Create(fn->getContext(), "entry", fn));
  Value* x = fn->getArg(0);
  // Subnormals are scaled into the normal range first.
  Value* subnormal = b.CreateFCmpOLT(x, constant(b, 0x1p-1022));
  Value* xs = b.CreateSelect(subnormal, b.CreateFMul(x, constant(b, 0x1p54)), x);
  Value* bits = b.CreateBitCast(xs, b.getInt64Ty());
  Value* exponent = b.CreateSub(b.CreateAnd(b.CreateLShr(bits, 52), b.getInt64(0x7ff)), b.getInt64(1023));
  Value* m = b.CreateBitCast(
      b.CreateOr(b.CreateAnd(bits, b.getInt64((int64_t{1} << 52) - 1)), b.getInt64(int64_t{1023} << 52)),
      b.getDoubleTy());
  Value* high = b.CreateFCmpOGT(m, constant(b, M_SQRT2));
  m = b.CreateSelect(high, b.CreateFMul(m, constant(b, 0.5)), m);
  Value* e = b.CreateSIToFP(exponent, b.getDoubleTy());
  e = b.CreateFAdd(e, b.CreateSelect(high, constant(b, 1.0), constant(b, 0.0)));
  e = b.CreateFSub(e, b.CreateSelect(subnormal, constant(b, 54.0), constant(b, 0.0)));
  Value* f = b.CreateFSub(m, constant(b, 1.0));
  Value* s = b.CreateFDiv(f, b.CreateFAdd(f, constant(b, 2.0)));
  Value* z = b.CreateFMul(s, s);
  Value* series = polynomial(
      b, z, {1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3});
  Value* two_s = b.CreateFMul(s, constant(b, 2.0));
  Value* log_m = fma(b, b.CreateFMul(two_s, z), series, two_s);
  Value* result = fma(b, e, constant(b, kLn2Hi), fma(b, e, constant(b, kLn2Lo), log_m));
  result = b.CreateSelect(b.CreateFCmpOEQ(x, constant(b, INFINITY)), x, result);
  result = b.CreateSelect(b.CreateFCmpOEQ(x, constant(b, 0.0)), constant(b, -INFINITY), result);
  result = b.CreateSelect(b.CreateFCmpULT(x, constant(b, 0.0)), constant(b, NAN), result); // negative or NaN
  b.CreateRet(result);
}

// pow(x, y) = exp(y * log|x|), with C's special cases: pow(x, 0) = pow(1, y) = 1, a negative base needs an
// integer exponent (odd ones keep the sign), NaN otherwise.
void define_pow(llvm::Function* fn, llvm::Function* exp, llvm::Function* log) {
  IRBuilder<> b(llvm::BasicBlock::Create(fn->getContext(), "entry", fn));
  Value* x = fn->getArg(0);
  Value* y = fn->getArg(1);
  Value* ax = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  Value* magnitude = b.CreateCall(exp, {b.CreateFMul(y, b.CreateCall(log, {ax}))});
  auto is_integer = [&](Value* v) {
    return b.CreateFCmpOEQ(b.CreateIntrinsic(llvm::Intrinsic::rint, {b.getDoubleTy()}, {v}), v);
  };
  Value* y_integer = is_integer(y);
  Value* y_odd = b.CreateAnd(y_integer, b.CreateNot(is_integer(b.CreateFMul(y, constant(b, 0.5)))));
  Value* negative = b.CreateFCmpOLT(x, constant(b, 0.0));
  Value* result = b.CreateSelect(b.CreateAnd(negative, y_odd), b.CreateFNeg(magnitude), magnitude);
  result = b.CreateSelect(b.CreateAnd(negative, b.CreateNot(y_integer)), constant(b, NAN), result);
  Value* trivial = b.CreateOr(b.CreateFCmpOEQ(y, constant(b, 0.0)), b.CreateFCmpOEQ(x, constant(b, 1.0)));
  result = b.CreateSelect(trivial, constant(b, 1.0), result);
  b.CreateRet(result);
}

} // namespace

DeviceMath define_device_math(llvm::Module& module) {
  if (llvm::Function* existing = module.getFunction("optjit.exp"))
    return {existing, module.getFunction("optjit.log"), module.getFunction("optjit.pow")};
  DeviceMath math{declare(module, "optjit.exp", 1), declare(module, "optjit.log", 1), declare(module, "optjit.pow", 2)};
  define_exp(math.exp);
  define_log(math.log);
  define_pow(math.pow, math.exp, math.log);
  return math;
}

} // namespace optjit
