#include "frontend/optim/state_dtype.h"
#include "frontend/optim/options.h"
#include "frontend/optim/validation.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

#include <cmath>

namespace optjit {
std::optional<StateDtype> state_dtype_of(double code) {
  for (StateDtype dtype : kStateDtypes)
    if (code == static_cast<double>(dtype))
      return dtype;
  return std::nullopt;
}

namespace {

// The option's value, Python's None being the default.
std::optional<StateDtype> option_value(double code) {
  return code == kOptionNone ? StateDtype::plain : state_dtype_of(code);
}

} // namespace

const char* state_dtype_name(StateDtype dtype) {
  switch (dtype) {
  case StateDtype::plain:
    return "plain";
  case StateDtype::int8:
    return "int8";
  case StateDtype::int4:
    return "int4";
  case StateDtype::fp8:
    return "fp8";
  }
  return "?";
}

StateDtype state_dtype_option(const ParamGroup& group, int64_t index) {
  if (!group.has("state_dtype"))
    return StateDtype::plain;
  const double code = group.get("state_dtype");
  if (const std::optional<StateDtype> dtype = option_value(code))
    return *dtype;
  throw Error(fmt::format("option state_dtype of param group {} is {}: it takes 'plain', 'int8', 'int4' or 'fp8'",
                          index, python_float(code)));
}

int64_t state_block_size_option(const ParamGroup& group, int64_t index, StateDtype dtype) {
  const double block = group.has("state_block_size") ? group.get("state_block_size") : 0.0;
  if (block == 0.0 || block == kOptionNone)
    return 0;
  if (!(block >= 1 && block <= static_cast<double>(kMaxQuantizationBlock) && block == std::floor(block)) ||
      (dtype == StateDtype::int4 && std::fmod(block, 2.0) != 0))
    throw Error(fmt::format("option state_block_size of param group {} is {}: quantized state keeps whole blocks of 1 "
                            "to {} values{}",
                            index, python_count(block), kMaxQuantizationBlock,
                            dtype == StateDtype::int4 ? ", an even number for int4 (two codes share a byte)" : ""));
  return static_cast<int64_t>(block);
}

void put_option(OptionMap& map, const std::string& name, StateDtype value) { map[name] = static_cast<double>(value); }

void keyword_value(StateDtype& member, const std::string& cls, const std::string& key,
                   const std::vector<double>& values) {
  if (values.size() != 1)
    throw Error(fmt::format("{} option '{}' takes one value, got {}", cls, key, values.size()));
  const std::optional<StateDtype> dtype = option_value(values[0]);
  if (!dtype)
    throw Error(fmt::format("{} option '{}' is {}: it takes 'plain', 'int8', 'int4' or 'fp8'", cls, key,
                            python_float(values[0])));
  member = *dtype;
}

std::optional<SlotBlocks> state_dtype_format(StateDtype dtype, const StateSpec& spec, int64_t block) {
  if (dtype == StateDtype::plain || spec.kind != StateKind::Tensor || spec.copies_param || spec.holds_param_index ||
      !spec.visible)
    return std::nullopt;
  BlockFormat format = BlockFormat::Fp8;
  if (dtype == StateDtype::int8)
    format = spec.signed_values ? BlockFormat::Signed8 : BlockFormat::Unsigned8;
  else if (dtype == StateDtype::int4)
    format = spec.signed_values ? BlockFormat::Signed4 : BlockFormat::Unsigned4;
  return SlotBlocks{format, block == 0 ? default_block_size(format) : block};
}

bool quantizes_param_of(int64_t numel, const SlotBlocks& format) {
  return numel >= kMinQuantizedValues && numel % format.block == 0;
}

} // namespace optjit
