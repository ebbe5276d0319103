// torchao 0.18's low-bit Adam and AdamW (torchao.optim.Adam8bit, AdamW8bit, Adam4bit, AdamW4bit, AdamFp8, AdamWFp8):
// Adam whose moments are kept block-quantized (ir.h's SlotBlocks; docs/torchao_lowbit.md), with torchao's own f32
// arithmetic in its order (glibc's powf for the bias corrections, its two-branch lerp without a fused multiply-add, the
// decay before the moments), so the compiled step equals torchao's compiled CPU step bit for bit
// (tests/frontend/optim/test_lowbit_adam.cpp, against tests/golden/lowbit/torchao_adam.json).
//
// State: step (f32), exp_avg (signed map), exp_avg_sq (unsigned map), max_exp_avg_sq with amsgrad (unsigned; torchao
// itself raises there, pytorch/ao issue 2497). A param of fewer than 4096 values, or of a count that is not a multiple
// of block_size, keeps plain state in its own dtype (torchao's rule, after bitsandbytes). Options: torchao's (lr,
// betas, eps, weight_decay, amsgrad) and block_size (torchao's constructor argument; 0: the format's default, 256
// for 8 bits and FP8, 128 for 4 bits), kept per param group.
#pragma once

#include "frontend/optim/optimizer.h"
#include "frontend/optim/options.h"

namespace optjit {

#define OPTJIT_LOWBIT_ADAM_OPTIONS(X)                                                                                  \
  X(double, lr, 1e-3)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.999})                                                                         \
  X(double, eps, 1e-8)                                                                                                 \
  X(double, weight_decay, 0)                                                                                           \
  X(bool, amsgrad, false)                                                                                              \
  X(double, block_size, 0)
OPTJIT_DEFINE_OPTIONS(LowBitAdamOptions, OPTJIT_LOWBIT_ADAM_OPTIONS)
#define OPTJIT_LOWBIT_ADAMW_OPTIONS(X)                                                                                 \
  X(double, lr, 1e-3)                                                                                                  \
  X(OptionPair, betas, OptionPair{0.9, 0.999})                                                                         \
  X(double, eps, 1e-8)                                                                                                 \
  X(double, weight_decay, 1e-2)                                                                                        \
  X(bool, amsgrad, false)                                                                                              \
  X(double, block_size, 0)
OPTJIT_DEFINE_OPTIONS(LowBitAdamWOptions, OPTJIT_LOWBIT_ADAMW_OPTIONS)

class LowBitAdam : public Optimizer {
public:
  // `decoupled`: AdamW's decay of the param (else Adam's, added to the grad).
  LowBitAdam(std::string name, StateDtype state, bool decoupled, std::vector<ParamGroupSpec> groups, OptionMap defaults,
             std::optional<bool> foreach, std::set<std::string> flags);

  Structure structure(const ParamGroup& group) const override;
  std::vector<StateSpec> state_specs(const Structure& structure) const override;
  std::vector<std::string> hyper_names() const override;
  void trace(Tracer& tracer, const Structure& structure) const override;
  void forloop_step(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) const override;
  bool has_forloop_reference() const override { return true; }
  void validate_options(const OptionMap& options) const override;
  std::optional<SlotBlocks> state_format(int64_t flat, const StateSpec& spec) const override;
  // torchao's single_param_adam computes in f32 for every param dtype (p.float(), then p.copy_): f64 params too.
  Dtype step_compute_dtype(Dtype) const override { return Dtype::f32; }
  std::string state_dtype_refusal(const ParamGroup&) const override {
    return "its class sets its state's format (block_size sets its blocks)";
  }

private:
  StateDtype state_; // int8, int4 or fp8
  bool decoupled_;
};

#define OPTJIT_DECLARE_LOWBIT_ADAM(Class, OptionsStruct, state, decoupled)                                             \
  class Class : public LowBitAdam {                                                                                    \
  public:                                                                                                              \
    using Options = OptionsStruct;                                                                                     \
    Class(std::vector<Tensor> params, const Options& o = {}) : Class(one_param_group(std::move(params)), o) {}         \
    Class(std::vector<ParamGroupSpec> groups, const Options& o = {})                                                   \
        : LowBitAdam(#Class, state, decoupled, std::move(groups), option_map(o), o.foreach, flag_names(o)) {}          \
  };
OPTJIT_DECLARE_LOWBIT_ADAM(Adam8bit, LowBitAdamOptions, StateDtype::int8, false)
OPTJIT_DECLARE_LOWBIT_ADAM(AdamW8bit, LowBitAdamWOptions, StateDtype::int8, true)
OPTJIT_DECLARE_LOWBIT_ADAM(Adam4bit, LowBitAdamOptions, StateDtype::int4, false)
OPTJIT_DECLARE_LOWBIT_ADAM(AdamW4bit, LowBitAdamWOptions, StateDtype::int4, true)
OPTJIT_DECLARE_LOWBIT_ADAM(AdamFp8, LowBitAdamOptions, StateDtype::fp8, false)
OPTJIT_DECLARE_LOWBIT_ADAM(AdamWFp8, LowBitAdamWOptions, StateDtype::fp8, true)
#undef OPTJIT_DECLARE_LOWBIT_ADAM

} // namespace optjit
