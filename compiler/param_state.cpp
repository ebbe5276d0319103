#include "compiler/param_state.h"

namespace optjit {

Tensor find_state(const ParamState& state, const std::string& key) {
  for (const auto& [name, tensor] : state)
    if (name == key)
      return tensor;
  return Tensor();
}

} // namespace optjit
