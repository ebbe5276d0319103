// What the fuzz harnesses share: the check that a refused input changed nothing. A harness takes a snapshot of an
// optimizer (its state dict, which holds copies, and copies of its params), feeds it the input, and when the input
// is refused compares everything bit for bit: any difference aborts, so a missing up-front check is a finding, as
// a crash is.
#pragma once

#include "frontend/optim/optimizer.h"
#include "runtime/tensor.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace optjit::fuzz {

struct Snapshot {
  StateDict state;
  std::vector<Tensor> params;
};

inline Snapshot take_snapshot(Optimizer& opt, const std::vector<Tensor>& params) {
  Snapshot s{opt.state_dict(), {}};
  for (const Tensor& p : params)
    s.params.push_back(p.clone());
  return s;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined())
    return false;
  if (!a.defined())
    return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return false;
  const Tensor ca = a.clone(), cb = b.clone(); // contiguous
  return std::memcmp(ca.data(), cb.data(), ca.nbytes()) == 0;
}

// Options compare by bits: a NaN option that stayed NaN is unchanged.
inline bool same_options(const OptionMap& a, const OptionMap& b) {
  if (a.size() != b.size())
    return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib)
    if (ia->first != ib->first || std::memcmp(&ia->second, &ib->second, sizeof(double)) != 0)
      return false;
  return true;
}

inline bool same_state(const StateDict& a, const StateDict& b) {
  if (a.optimizer != b.optimizer || a.param_groups.size() != b.param_groups.size() || a.state.size() != b.state.size())
    return false;
  for (std::size_t g = 0; g < a.param_groups.size(); ++g)
    if (a.param_groups[g].params != b.param_groups[g].params ||
        !same_options(a.param_groups[g].options, b.param_groups[g].options))
      return false;
  for (auto ia = a.state.begin(), ib = b.state.begin(); ia != a.state.end(); ++ia, ++ib) {
    if (ia->first != ib->first || ia->second.size() != ib->second.size())
      return false;
    for (std::size_t k = 0; k < ia->second.size(); ++k)
      if (ia->second[k].first != ib->second[k].first || !same_bits(ia->second[k].second, ib->second[k].second))
        return false;
  }
  return true;
}

// Aborts (a fuzz finding) when the optimizer or its params differ from `before` after `what` was refused.
inline void require_unchanged(const Snapshot& before, Optimizer& opt, const std::vector<Tensor>& params,
                              const char* what, const std::string& message) {
  bool same = same_state(before.state, opt.state_dict()) && before.params.size() == params.size();
  for (std::size_t i = 0; same && i < params.size(); ++i)
    same = same_bits(before.params[i], params[i]);
  if (!same) {
    std::fprintf(stderr, "refused %s changed the optimizer: %s\n", what, message.c_str());
    std::abort();
  }
}

} // namespace optjit::fuzz
