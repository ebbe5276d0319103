#include "frontend/optim/json_text.h"

#include <nlohmann/json.hpp>

namespace optjit {

std::string json_value_text(const nlohmann::json& value) {
  if (value.is_array())
    return "an array of " + std::to_string(value.size()) + (value.size() == 1 ? " value" : " values");
  if (value.is_object())
    return "an object of " + std::to_string(value.size()) + (value.size() == 1 ? " entry" : " entries");
  return value.dump(); // a scalar: no recursion
}

} // namespace optjit
