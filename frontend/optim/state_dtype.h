// The group option state_dtype: optimizer state kept block-quantized, as torchao's low-bit optimizers and
// bitsandbytes' 8-bit ones keep it (runtime/block_quantization.h), for any built-in optimizer whose state is
// per-element moments. "int8" keeps each moment in 8-bit codes of torchao's dynamic maps (signed for first moments,
// unsigned for second moments, StateSpec::signed_values) with one f32 scale per 256 values; "int4" in 4-bit codes,
// two to a byte, one scale per 128; "fp8" in float8_e4m3fn values, one scale per 256. "plain" (the default, also
// None from Python) keeps state in the param's dtype.
//
// Which entries: per-element tensor state that is neither a master copy of the param nor bookkeeping, of a param of
// at least 4096 values in whole blocks (torchao's rule after bitsandbytes: a smaller param keeps plain state, as its
// state is a rounding error of the model's). The option applies to state made while it is set: held state keeps
// the format it was made or loaded with.
#pragma once

#include "frontend/optim/param_group.h"
#include "frontend/optim/state_spec.h"
#include "ir/ir.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace optjit {

enum class StateDtype { plain, int8, int4, fp8 };
inline constexpr StateDtype kStateDtypes[] = {StateDtype::plain, StateDtype::int8, StateDtype::int4, StateDtype::fp8};

// torch's words for the option's values: "plain", "int8", "int4", "fp8" (the group option holds their index).
const char* state_dtype_name(StateDtype dtype);
// The state dtype whose index `code` is; none for another number.
std::optional<StateDtype> state_dtype_of(double code);
// The value of param group `index`'s state_dtype option (plain where it has none, or holds None); throws
// optjit::Error naming the group for a number that is no state dtype.
StateDtype state_dtype_option(const ParamGroup& group, int64_t index);

// The block size of param group `index`'s quantized state: its state_block_size option, or 0 (the format's default)
// where it has none; throws for a value that is no block of `dtype` (1 to kMaxQuantizationBlock values, even for int4).
int64_t state_block_size_option(const ParamGroup& group, int64_t index, StateDtype dtype);

// The options struct's member as its group option value, and a keyword option as the member.
void put_option(OptionMap& map, const std::string& name, StateDtype value);
void keyword_value(StateDtype& member, const std::string& cls, const std::string& key,
                   const std::vector<double>& values);

// torchao's rule: only tensors of at least this many values, in whole blocks, are quantized.
inline constexpr int64_t kMinQuantizedValues = 4096;

// The format `dtype` keeps state entry `spec` in, with blocks of `block` values (0: the format's default), whatever
// the param's size: none for plain state, and for the entries that stay plain (scalars, master weights, bookkeeping).
std::optional<SlotBlocks> state_dtype_format(StateDtype dtype, const StateSpec& spec, int64_t block = 0);

// Whether a param of `numel` values is quantized in `format` under torchao's rule (at least kMinQuantizedValues, in
// whole blocks).
bool quantizes_param_of(int64_t numel, const SlotBlocks& format);

} // namespace optjit
