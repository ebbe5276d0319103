// GemmShape's rules and its text: the same for every matrix library (oneDNN on the CPU, cuBLAS on the GPU).
#include "runtime/error.h"
#include "runtime/gemm.h"

#include <spdlog/fmt/fmt.h>

namespace optjit {

std::string GemmShape::to_string() const {
  const auto dims = [](int64_t rows, int64_t cols, bool transposed) {
    return transposed ? fmt::format("({}x{})^T", cols, rows) : fmt::format("{}x{}", rows, cols);
  };
  return fmt::format("{} [{}] {}x{} = {}{} @ {}{} -> {}", dtype_name(operands), batch, m, n,
                     alpha == 1.0 ? "" : fmt::format("{} ", alpha), dims(m, k, transpose_a), dims(k, n, transpose_b),
                     beta == 0.0 ? "" : fmt::format(" + {} C", beta), dtype_name(result));
}

void check_gemm_shape(const GemmShape& shape) {
  if (shape.batch < 0 || shape.m < 0 || shape.n < 0 || shape.k < 0)
    throw Error("the matrix product " + shape.to_string() + " has a negative size");
  if (shape.operands != Dtype::bf16 && shape.operands != Dtype::f32)
    throw Error("the matrix product " + shape.to_string() + " takes bf16 or f32 operands, not " +
                std::string(dtype_name(shape.operands)));
  if (shape.result != Dtype::f32 && !(shape.result == Dtype::bf16 && shape.operands == Dtype::bf16))
    throw Error("the matrix product " + shape.to_string() + " gives f32, or bf16 from bf16 operands, not " +
                std::string(dtype_name(shape.result)));
}

} // namespace optjit
