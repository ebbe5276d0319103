// torch's lerp of one element, as its CPU kernels compute it (their vectorized fmadd) and foreach_lerp traces it:
// self + w (end - self) for |w| < 0.5, end + (w - 1)(end - self) otherwise, each product and sum rounded once. The
// forloop references of the optimizers whose torch step uses lerp_ (the first moments of Adam, AdamW, NAdam, RAdam and
// Adamax, RMSprop's grad_avg, Adafactor's variances) call it, so that they round, and carry an inf into a NaN, as torch
// does.
#pragma once

#include <cmath>

namespace optjit {

template <class T> T torch_lerp(T self, T end, T weight) {
  return std::abs(weight) < T(0.5) ? std::fma(weight, end - self, self) : std::fma(weight - T(1), end - self, end);
}

} // namespace optjit
