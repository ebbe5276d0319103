// Reading JSON from files safely, for the state-file loader and the golden-case reader:
// - json_value_text: a value as a short text for error messages, without recursion: a file can nest a value 100,000
//   levels deep, and printing it whole (json::dump recurses) would overflow the stack. Scalars print as themselves,
//   containers as their kind and size.
// - json_integer, json_shape: integers read strictly. nlohmann's get<int64_t>() truncates 2.5 to 2, reads 1e30 as
//   garbage and wraps 2^64 - 1 to -1; a file's shape, offset or index that is not an exact integer in range is an
//   error naming the field and the rule instead.
#pragma once

#include "runtime/tensor.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace optjit {

std::string json_value_text(const nlohmann::json& value); // "0.5", "\"adam\"", "an array of 3 values", ...

// `value` as an integer in [min, max]; throws optjit::Error naming `field` otherwise (floats included: 2.0 too).
int64_t json_integer(const nlohmann::json& value, const std::string& field, int64_t min, int64_t max);
// `value` as a shape: an array of at most kMaxTensorRank integers, each in [0, kMaxTensorBytes]. Whether the
// extents' product fits a tensor is Tensor::empty's check (it names kMaxTensorBytes).
Shape json_shape(const nlohmann::json& value, const std::string& field);

} // namespace optjit
