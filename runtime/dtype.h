// Element types of tensors. Scalar (per-tensor) arithmetic is always done in f64, as torch does on the host.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace optjit {

enum class Dtype { f32, f64 };

constexpr std::size_t dtype_size(Dtype d) { return d == Dtype::f32 ? 4 : 8; }
constexpr std::string_view dtype_name(Dtype d) { return d == Dtype::f32 ? "f32" : "f64"; }
// Accepts "f32", "float32", "f64", "float64"; throws optjit::Error otherwise.
Dtype parse_dtype(std::string_view text);

} // namespace optjit
