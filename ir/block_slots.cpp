#include "ir/block_slots.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <vector>

namespace optjit {

void check_block_slot_tensors(const Slot& slot, const Tensor& codes, const Tensor& scales, int64_t numel,
                              const std::string& owner) {
  OPTJIT_ASSERT(slot.blocks.has_value(), "slot " + slot.name + " is not block-quantized");
  const SlotBlocks& blocks = *slot.blocks;
  const std::string what =
      fmt::format("{} state '{}' of {}", blocks.block > 0 ? slot_storage_name(slot) : block_format_name(blocks.format),
                  slot.name, owner);
  if (blocks.block <= 0) // a held format derived from no scales at all
    throw Error(fmt::format("{}: its scales are {}, where one f32 scale per block is expected", what,
                            scales.defined() ? scales.describe() : "missing"));
  if (numel % blocks.block != 0)
    throw Error(fmt::format("{}: its param has {} elements, not a multiple of the block of {} (torchao keeps such "
                            "params' state unquantized)",
                            what, numel, blocks.block));
  const Dtype code_dtype = block_code_dtype(blocks.format);
  const int64_t code_count = code_bytes(blocks.format, numel);
  if (!codes.defined() || codes.dtype() != code_dtype || codes.numel() != code_count || !codes.is_contiguous())
    throw Error(fmt::format("{}: its codes are {}, where {} contiguous {} codes are expected", what,
                            codes.defined() ? codes.describe() : "missing", code_count, dtype_name(code_dtype)));
  const int64_t scale_count = numel / blocks.block;
  if (!scales.defined() || scales.dtype() != Dtype::f32 || scales.numel() != scale_count || !scales.is_contiguous())
    throw Error(fmt::format("{}: its scales are {}, where {} contiguous f32 scales (one per block) are expected", what,
                            scales.defined() ? scales.describe() : "missing", scale_count));
  if (scales.device() != codes.device())
    throw Error(fmt::format("{}: its codes are on {} and its scales on {}", what, codes.device().to_string(),
                            scales.device().to_string()));
}

Shape block_codes_shape(BlockFormat format, const Shape& values) {
  return block_format_bits(format) == 4 ? Shape{code_bytes(format, shape_numel(values))} : values;
}

BlockFormat held_block_format(Dtype codes, int64_t codes_numel, int64_t numel, bool signed_values) {
  if (codes != Dtype::u8)
    return BlockFormat::Fp8;
  if (codes_numel * 2 == numel && numel > 0)
    return signed_values ? BlockFormat::Signed4 : BlockFormat::Unsigned4;
  return signed_values ? BlockFormat::Signed8 : BlockFormat::Unsigned8;
}

Shape list_entry_shape(const Graph& graph, const ListArguments& args, std::size_t t) {
  if (!args.shapes.empty())
    return args.shapes[t];
  for (const Slot& s : graph.slots)
    if (s.kind == SlotKind::Tensor && !s.blocks) // a quantized slot's codes may be packed
      return args.slot(s.name)[t].shape();
  throw Error("graph @" + graph.name +
              " declares no tensor slot of its params' shape and its arguments give no shapes: its rows, columns and "
              "blocks have no shape");
}

void check_block_slot_arguments(const Graph& graph, const ListArguments& args) {
  for (const Slot& slot : graph.slots) {
    if (!slot.blocks || std::find(args.slot_names.begin(), args.slot_names.end(), slot.name) == args.slot_names.end())
      continue;
    const std::vector<Tensor>& codes = args.slot(slot.name);
    const std::vector<Tensor>& scales = args.slot(scales_slot_name(slot.name));
    for (std::size_t t = 0; t < codes.size(); ++t)
      check_block_slot_tensors(slot, codes[t], t < scales.size() ? scales[t] : Tensor(),
                               shape_numel(list_entry_shape(graph, args, t)), "list entry " + std::to_string(t));
  }
}

Tensor load_block_slot(const Slot& slot, const Tensor& codes, const Tensor& scales, const Shape& shape) {
  Tensor values = Tensor::empty(shape, Dtype::f32);
  check_block_slot_tensors(slot, codes, scales, values.numel(), "a list entry");
  dequantize_blocks(slot.blocks->format, static_cast<const uint8_t*>(codes.data()), scales.data_as<float>(),
                    values.numel(), slot.blocks->block, values.data_as<float>());
  return values;
}

void store_block_slot(const Slot& slot, const Tensor& values, const Tensor& codes, const Tensor& scales) {
  const Tensor f32 = values.to(Dtype::f32).clone(); // contiguous, in element order
  check_block_slot_tensors(slot, codes, scales, f32.numel(), "a list entry");
  quantize_blocks(slot.blocks->format,
                  std::span<const float>(f32.data_as<float>(), static_cast<std::size_t>(f32.numel())),
                  slot.blocks->block, static_cast<uint8_t*>(codes.data()), scales.data_as<float>());
}

} // namespace optjit
