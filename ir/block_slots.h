// The tensors behind a block-quantized slot (ir.h's SlotBlocks): for each list entry, its codes (the slot's own
// tensor) and its scales (the tensor of scales_slot_name(slot)), laid out as torchao lays them: codes of the param's
// numel (u8, or e4m3 for FP8; u8 of numel / 2 for 4 bits), contiguous, and numel / block f32 scales. What every
// mode checks before it reads them, and how the interpreter loads and stores them (the meaning compiled kernels
// follow bit for bit).
#pragma once

#include "ir/arguments.h"
#include "ir/ir.h"
#include "runtime/tensor.h"

namespace optjit {

// Throws optjit::Error naming the slot, its owner ("list entry 2", "param 5") and the rule when `codes` or `scales`
// do not hold `numel` values in `slot`'s format: numel a multiple of the block, the codes' dtype and count, the
// scales' dtype and count, both contiguous, on one device.
void check_block_slot_tensors(const Slot& slot, const Tensor& codes, const Tensor& scales, int64_t numel,
                              const std::string& owner);

// The shape of the codes of `values` in `format`, as torchao lays them out: the values' own shape, or for 4 bits one
// byte per two values, flat.
Shape block_codes_shape(BlockFormat format, const Shape& values);

// The format of held codes as torchao reads it: e4m3 codes are FP8; u8 codes of half the param's `numel` values are 4
// bits, other u8 codes 8 bits; `signed_values` (the entry holds values of both signs) picks the signed or unsigned map.
BlockFormat held_block_format(Dtype codes, int64_t codes_numel, int64_t numel, bool signed_values);

// Checks every block-quantized slot of `graph` that `args` binds, for every list entry (check_block_slot_tensors),
// before a mode reads or writes any: a bad tensor is an optjit::Error that changes nothing.
void check_block_slot_arguments(const Graph& graph, const ListArguments& args);
// The shape of list entry t's param: the arguments', or that of the graph's first tensor slot that is not quantized
// (param, grad and plain tensor state share it).
Shape list_entry_shape(const Graph& graph, const ListArguments& args, std::size_t t);

// The values `codes` and `scales` stand for, as an f32 tensor of `shape` (host memory).
Tensor load_block_slot(const Slot& slot, const Tensor& codes, const Tensor& scales, const Shape& shape);
// `values` (any real dtype; rounded to f32 first, as torchao quantizes f32 values) quantized into `codes` and `scales`.
void store_block_slot(const Slot& slot, const Tensor& values, const Tensor& codes, const Tensor& scales);

} // namespace optjit
