// Fuzzes the state-file loader: the bytes of a file through parse_state_dict_bytes, then load_state_dict into an
// optimizer of the class the file names, then one step. The optimizer's groups have the sizes the file's groups
// have and each param the shape of its first per-element state, so that well-formed files get past the structural
// checks and reach the value checks and the step. A refused load or step must leave the optimizer bit-identical
// (fuzz_support.h).
#include "frontend/optim/registry.h"
#include "frontend/optim/state_file.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_support.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace optjit::fuzz {
namespace {

constexpr std::size_t kMaxGroups = 4, kMaxParamsPerGroup = 4;
constexpr int64_t kMaxParamElements = 1 << 12;

// The shape of param `id` as the file's state implies it, or {3} when the file gives none that is small enough.
Shape param_shape(const StateDict& dict, int64_t id) {
  auto it = dict.state.find(id);
  if (it != dict.state.end())
    for (const auto& [key, tensor] : it->second)
      if (tensor.dim() > 0 && tensor.numel() > 0 && tensor.numel() <= kMaxParamElements && !is_complex(tensor.dtype()))
        return tensor.shape();
  return {3};
}

void run(const StateDict& dict) {
  std::vector<ParamGroupSpec> groups;
  std::vector<Tensor> params;
  int64_t next_id = 0;
  for (std::size_t g = 0; g < dict.param_groups.size() && g < kMaxGroups; ++g) {
    ParamGroupSpec group;
    for (std::size_t i = 0; i < dict.param_groups[g].params.size() && i < kMaxParamsPerGroup; ++i) {
      Tensor p = Tensor::full(param_shape(dict, next_id++), 0.5, Dtype::f32);
      p.set_grad(Tensor::full(p.shape(), 0.25, Dtype::f32));
      group.params.push_back(p);
      params.push_back(p);
    }
    if (!group.params.empty())
      groups.push_back(std::move(group));
  }
  if (groups.empty()) {
    Tensor p = Tensor::full({3}, 0.5, Dtype::f32);
    p.set_grad(Tensor::full({3}, 0.25, Dtype::f32));
    params.push_back(p);
    groups.push_back(ParamGroupSpec{{p}, {}});
  }
  std::unique_ptr<Optimizer> opt;
  try {
    opt = make_optimizer(dict.optimizer, groups, {{"foreach", {1}}});
  } catch (const Error&) {
    opt = make_optimizer("Adam", groups, {{"foreach", {1}}}); // the load then refuses the class
  }
  opt->step(); // state to overwrite

  const Snapshot before = take_snapshot(*opt, params);
  try {
    opt->load_state_dict(dict);
  } catch (const Error& e) {
    require_unchanged(before, *opt, params, "state file", e.what());
    return;
  }
  const Snapshot loaded = take_snapshot(*opt, params);
  try {
    opt->step();
  } catch (const Error& e) {
    require_unchanged(loaded, *opt, params, "step after a load", e.what());
  }
}

} // namespace
} // namespace optjit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  optjit::StateDict dict;
  try {
    dict = optjit::parse_state_dict_bytes(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const optjit::Error&) {
    return 0; // refused before any optimizer saw it
  }
  optjit::fuzz::run(dict);
  return 0;
}
