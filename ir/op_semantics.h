// What each pointwise op computes on one value of type T (float or double): the interpreter's definition of the
// ops, which the LLVM codegen reproduces instruction for instruction.
#pragma once

#include "ir/ir.h"
#include "runtime/error.h"
#include "runtime/low_precision.h"

#include <cmath>
#include <limits>

namespace optjit {

template <class T> T max_propagating_nan(T a, T b) {
  if (std::isnan(a) || std::isnan(b))
    return std::numeric_limits<T>::quiet_NaN();
  if (a == b) // orders -0 below +0, as llvm.maximum does
    return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

template <class T> T min_propagating_nan(T a, T b) {
  if (std::isnan(a) || std::isnan(b))
    return std::numeric_limits<T>::quiet_NaN();
  if (a == b)
    return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

// 1, -1 or 0; 0 for NaN.
template <class T> T sign_of(T x) { return static_cast<T>((x > T(0)) - (x < T(0))); }

template <class T> T apply_unary(Op op, T x) {
  switch (op) {
  case Op::cast:
    return x;
  case Op::neg:
    return -x;
  case Op::sqrt:
    return std::sqrt(x);
  case Op::abs:
    return std::fabs(x);
  case Op::sign:
    return sign_of(x);
  case Op::round_bf16: // a double is rounded to float first, as torch's c10::BFloat16 does
    return static_cast<T>(static_cast<float>(bfloat16(static_cast<float>(x))));
  case Op::exp:
    return std::exp(x);
  case Op::log:
    return std::log(x);
  default:
    OPTJIT_ASSERT(false, "not a unary op: " + std::string(op_name(op)));
  }
}

template <class T> T apply_binary(Op op, T a, T b) {
  switch (op) {
  case Op::add:
    return a + b;
  case Op::sub:
    return a - b;
  case Op::mul:
    return a * b;
  case Op::div:
    return a / b;
  case Op::maximum:
    return max_propagating_nan(a, b);
  case Op::minimum:
    return min_propagating_nan(a, b);
  case Op::pow:
    return std::pow(a, b);
  case Op::lt:
    return a < b ? T(1) : T(0);
  case Op::gt:
    return a > b ? T(1) : T(0);
  case Op::eq:
    return a == b ? T(1) : T(0);
  default:
    OPTJIT_ASSERT(false, "not a binary op: " + std::string(op_name(op)));
  }
}

} // namespace optjit
