// Element types of tensors, from the one dtype table (runtime/dtypes.def). Scalar (per-tensor) arithmetic is
// always done in f64, as torch does on the host. Code that depends on a dtype either visits it (visit_dtype: one
// template for every C++ storage type; visit_compute_dtype: one for each dtype optjit computes in) or switches over
// it without a default, so adding a dtype to the table is a compile error (-Wswitch) at every switch that still has
// to handle it.
#pragma once

#include "runtime/complex_storage.h"
#include "runtime/error.h"
#include "runtime/low_precision.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace optjit {

enum class Dtype : uint8_t {
#define OPTJIT_DTYPE(name, type, torch_name, safetensors_code) name,
#include "runtime/dtypes.def"
#undef OPTJIT_DTYPE
};

inline constexpr unsigned kDtypeCount = 0
#define OPTJIT_DTYPE(name, type, torch_name, safetensors_code) +1
#include "runtime/dtypes.def"
#undef OPTJIT_DTYPE
    ;

// Calls body.template operator()<T>() with T the C++ type that stores one element of `dtype`.
template <class Body> decltype(auto) visit_dtype(Dtype dtype, Body&& body) {
  switch (dtype) {
#define OPTJIT_DTYPE(name, type, torch_name, safetensors_code)                                                         \
  case Dtype::name:                                                                                                    \
    return body.template operator()<type>();
#include "runtime/dtypes.def"
#undef OPTJIT_DTYPE
  }
  __builtin_unreachable();
}

// The real dtype of one component of `dtype`: f32 and f64 for c64 and c128 (a complex element is two of them, its
// real view's last dimension), the dtype itself for the real dtypes.
constexpr Dtype component_dtype(Dtype dtype) {
  switch (dtype) {
  case Dtype::f32:
  case Dtype::f64:
  case Dtype::bf16:
  case Dtype::f16:
  case Dtype::u8:
  case Dtype::e4m3:
    return dtype;
  case Dtype::c64:
    return Dtype::f32;
  case Dtype::c128:
    return Dtype::f64;
  }
  __builtin_unreachable();
}

constexpr bool is_complex(Dtype dtype) { return component_dtype(dtype) != dtype; }

// The codes of block-quantized state (u8: 8-bit and packed 4-bit map indexes; e4m3: FP8 values): stored and
// converted, never computed on, never a param's dtype.
constexpr bool is_code_dtype(Dtype dtype) { return dtype == Dtype::u8 || dtype == Dtype::e4m3; }

// The dtype element math runs in for tensors stored in `dtype`: f32 for the 16-bit storage types (torch's opmath:
// load, compute in f32, round once when storing), the component dtype for complex ones (stepped on their real view),
// the dtype itself otherwise.
constexpr Dtype compute_dtype(Dtype dtype) {
  switch (dtype) {
  case Dtype::f32:
  case Dtype::f64:
    return dtype;
  case Dtype::bf16:
  case Dtype::f16:
  case Dtype::u8: // a code converts to f32 exactly (u8 as its integer); nothing computes on codes
  case Dtype::e4m3:
    return Dtype::f32;
  case Dtype::c64:
  case Dtype::c128:
    return component_dtype(dtype);
  }
  __builtin_unreachable();
}

// Stored in fewer bits than it is computed in (bf16, f16).
constexpr bool is_low_precision(Dtype dtype) {
  return !is_code_dtype(dtype) && compute_dtype(dtype) != component_dtype(dtype);
}

// Calls body.template operator()<T>() with T the C++ type optjit computes in for `dtype`: that of
// compute_dtype(dtype), float or double.
template <class Body> decltype(auto) visit_compute_dtype(Dtype dtype, Body&& body) {
  if (compute_dtype(dtype) == Dtype::f64)
    return body.template operator()<double>();
  return body.template operator()<float>();
}

constexpr std::size_t dtype_size(Dtype dtype) {
  switch (dtype) {
#define OPTJIT_DTYPE(name, type, torch_name, safetensors_code)                                                         \
  case Dtype::name:                                                                                                    \
    return sizeof(type);
#include "runtime/dtypes.def"
#undef OPTJIT_DTYPE
  }
  __builtin_unreachable();
}

// "f32", "f64", "bf16", "f16": the names optjit prints and parses.
constexpr std::string_view dtype_name(Dtype dtype) {
  switch (dtype) {
#define OPTJIT_DTYPE(name, type, torch_name, safetensors_code)                                                         \
  case Dtype::name:                                                                                                    \
    return #name;
#include "runtime/dtypes.def"
#undef OPTJIT_DTYPE
  }
  __builtin_unreachable();
}

// The safetensors code ("F32") of a dtype, and the dtype of a code (none for a code outside the table).
std::string_view dtype_safetensors_code(Dtype dtype);
std::optional<Dtype> dtype_from_safetensors_code(std::string_view code);
// Every safetensors code of the table, for messages: "F32 or F64".
std::string dtype_safetensors_codes();

// Calls body.template operator()<T>() with T the C++ type of one element of real `dtype`; a complex dtype is an
// optjit::Error naming `what` (complex tensors are read and written through their real view).
template <class Body> decltype(auto) visit_real_dtype(Dtype dtype, std::string_view what, Body&& body) {
  return visit_dtype(dtype, [&]<class T>() -> decltype(body.template operator()<float>()) {
    if constexpr (is_complex_storage_v<T>)
      throw Error(std::string(what) + " of a complex tensor: use its real view (view_as_real)");
    else
      return body.template operator()<T>();
  });
}

// `value` rounded to the precision of `dtype`'s components (and back to double).
inline double round_to_dtype(Dtype dtype, double value) {
  return visit_real_dtype(component_dtype(dtype), "round_to_dtype",
                          [&]<class T>() { return static_cast<double>(static_cast<T>(value)); });
}

// Accepts optjit's and torch's names ("f32", "float32", ...); throws optjit::Error otherwise.
Dtype parse_dtype(std::string_view text);

} // namespace optjit
