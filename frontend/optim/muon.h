// Muon (torch.optim.Muon, torch 2.15): momentum on each 2-D param, then the update orthogonalized by Newton-Schulz
// iterations in bf16, scaled by a learning rate adjusted to the matrix's shape, with decoupled weight decay:
//
//   buf = lerp(buf, g, 1 - momentum);  u = nesterov ? lerp(g, buf, momentum) : buf
//   X = bf16(u) / max(|bf16(u)|, eps), the wide way round (a tall matrix transposed)
//   ns_steps times: A = X X^T;  B = b A + c A A;  X = a X + B X   (bf16 products, f32 accumulation)
//   p = p (1 - lr weight_decay) - adjust(lr, shape) X
//
// The products run in oneDNN (runtime/gemm.h), never in loops of optjit's own. Options, defaults and messages are
// torch's; ns_coefficients is a group option triple (ns_a, ns_b, ns_c) and adjust_lr_fn a choice (None is
// "original"). optjit's own option f32_iterations runs the normalization and the iterations in f32 instead (f32
// operands, f32 results: about 3x the products' time on AMX, an orthogonalization ~2^16 times finer). State:
// momentum_buffer, made like the param.
//
// Its forloop step (foreach=false, the default: torch's Muon has no foreach path) runs torch's single-tensor
// algorithm; its traced step writes the iterations as IR matrix products (mm, addmm), which its eager step interprets
// and its compiled step runs as three kernels around the library's products, per bucket (tall and wide matrices
// apart).
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

#include <optional>
#include <string>
#include <vector>

namespace optjit {

// torch's adjust_lr_fn: how the learning rate scales with a matrix of A rows and B columns.
enum class MuonAdjustLr {
  original,           // lr sqrt(max(1, A / B)) (also None, the default)
  match_rms_adamw,    // lr 0.2 sqrt(max(A, B))
  spectral_unclamped, // lr sqrt(A / B)
};
// Its group option value (its index; None is kOptionNone), and its torch name.
void put_option(OptionMap& map, const std::string& name, const std::optional<MuonAdjustLr>& value);
void keyword_value(std::optional<MuonAdjustLr>& member, const std::string& cls, const std::string& key,
                   const std::vector<double>& values);

#define OPTJIT_MUON_OPTIONS(X)                                                                                         \
  X(double, lr, 1e-3)                                                                                                  \
  X(double, weight_decay, 0.1)                                                                                         \
  X(double, momentum, 0.95)                                                                                            \
  X(bool, nesterov, true)                                                                                              \
  X(OptionTriple, ns_coefficients, OptionTriple{3.4445, -4.7750, 2.0315})                                              \
  X(double, eps, 1e-7)                                                                                                 \
  X(double, ns_steps, 5)                                                                                               \
  X(std::optional<MuonAdjustLr>, adjust_lr_fn, std::nullopt)                                                           \
  X(bool, f32_iterations, false)
OPTJIT_DEFINE_OPTIONS(MuonOptions, OPTJIT_MUON_OPTIONS)

class Muon : public Optimizer {
public:
  OPTJIT_DECLARE_OPTIMIZER(Muon, MuonOptions)
  void check_grad(int64_t flat) const override;
  void check_step_options(const ParamGroup& group, std::size_t index) const override;
  void param_structure(const Tensor& param, Structure& s) const override;
  bool has_param_structure() const override { return true; }
  // Its products read whole matrices: a param that is not contiguous steps through contiguous copies.
  bool walks_rows_and_columns(int64_t) const override { return true; }
  std::string state_dtype_refusal(const ParamGroup&) const override {
    return "its momentum buffer feeds matrix products, which take plain tensors";
  }

private:
  void check_matrix(const Tensor& param) const; // torch's constructor check: every param is 2-D
};

} // namespace optjit
