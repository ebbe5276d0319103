// A JSON value as a short text for error messages, without recursion: a file can nest a value 100,000 levels deep,
// and printing it whole (json::dump recurses) would overflow the stack. Scalars print as themselves, containers as
// their kind and size.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace optjit {

std::string json_value_text(const nlohmann::json& value); // "0.5", "\"adam\"", "an array of 3 values", ...

} // namespace optjit
