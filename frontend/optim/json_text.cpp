#include "frontend/optim/json_text.h"
#include "runtime/error.h"

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

namespace optjit {

std::string json_value_text(const nlohmann::json& value) {
  if (value.is_array())
    return "an array of " + std::to_string(value.size()) + (value.size() == 1 ? " value" : " values");
  if (value.is_object())
    return "an object of " + std::to_string(value.size()) + (value.size() == 1 ? " entry" : " entries");
  return value.dump(); // a scalar: no recursion
}

int64_t json_integer(const nlohmann::json& value, const std::string& field, int64_t min, int64_t max) {
  bool in_range = false;
  int64_t n = 0;
  if (value.is_number_unsigned()) { // a non-negative integer literal, up to 2^64 - 1
    const uint64_t u = value.get<uint64_t>();
    in_range = max >= 0 && u <= static_cast<uint64_t>(max);
    n = in_range ? static_cast<int64_t>(u) : 0;
  } else if (value.is_number_integer()) { // a negative integer literal
    n = value.get<int64_t>();
    in_range = true;
  }
  if (!in_range || n < min || n > max)
    throw Error(fmt::format("{} is {}: expected an integer from {} to {}", field, json_value_text(value), min, max));
  return n;
}

Shape json_shape(const nlohmann::json& value, const std::string& field) {
  if (!value.is_array() || value.size() > kMaxTensorRank)
    throw Error(fmt::format("{} is {}: expected a shape, an array of at most {} extents (kMaxTensorRank)", field,
                            json_value_text(value), kMaxTensorRank));
  Shape shape;
  for (std::size_t d = 0; d < value.size(); ++d)
    shape.push_back(json_integer(value[d], fmt::format("{}[{}]", field, d), 0, kMaxTensorBytes));
  return shape;
}

} // namespace optjit
