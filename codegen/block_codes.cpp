// Block-quantized slots in kernels (ir.h's SlotBlocks, runtime/block_quantization.h): a load dequantizes (the code's
// table value times its block's scale, in f32), and a store quantizes each block by its absolute maximum. A kernel
// that stores such a slot walks whole blocks (codegen/cpu_kernel.cpp's block walk): the block's values of each
// quantized store go to a block buffer while their maximum is found, then the block's scale and codes are written,
// each with torchao's own f32 operations in its order, so the codes equal runtime/block_quantization.cpp's bit for
// bit. KernelBody's members (codegen/kernel_body.h).
#include "codegen/kernel_body.h"
#include "runtime/block_quantization.h"

#include <limits>

namespace optjit::emission {

const SlotBlocks* KernelBody::slot_blocks(int slot) const {
  const Slot* s = graph_.slot(plan_.abi.tensor_slots[static_cast<std::size_t>(slot)]);
  return s && s->blocks ? &*s->blocks : nullptr;
}

// bases: the tensor slots' data, then each quantized slot's scales (quantized_slots order).
int KernelBody::scales_base(int slot) const {
  const std::vector<std::string> quantized = quantized_slots(plan_);
  return static_cast<int>(plan_.abi.tensor_slots.size()) +
         index_in(quantized, plan_.abi.tensor_slots[static_cast<std::size_t>(slot)]);
}

// The f32 values a format's codes stand for, before their scale: the dynamic map, or every e4m3 code's value (NaN for
// its two NaN codes). One constant per module and format.
Value* KernelBody::code_table(BlockFormat format) {
  const std::string name = "optjit.codes." + block_format_name(format);
  if (llvm::GlobalVariable* table = module_.getNamedGlobal(name))
    return table;
  std::vector<float> values;
  if (format == BlockFormat::Fp8)
    for (int code = 0; code < 256; ++code)
      values.push_back(from_e4m3fn(static_cast<uint8_t>(code)));
  else
    values.assign(quantization_map(format).begin(), quantization_map(format).end());
  llvm::Constant* table = llvm::ConstantDataArray::get(ctx_, llvm::ArrayRef<float>(values));
  return new llvm::GlobalVariable(module_, table->getType(), /*isConstant=*/true, llvm::GlobalValue::PrivateLinkage,
                                  table, name);
}

// table[index] for an i32 index or a vector of them (a gather).
Value* KernelBody::table_lookup(IRBuilder<>& b, Value* table, Value* index) {
  Value* address = b.CreateGEP(b.getFloatTy(), table, index);
  if (!index->getType()->isVectorTy())
    return b.CreateLoad(b.getFloatTy(), address);
  return b.CreateMaskedGather(with_lanes(b.getFloatTy(), index->getType()), address, llvm::Align(4));
}

// Each element's index (i64, `lanes` of them from j).
Value* KernelBody::lane_indexes(IRBuilder<>& b, Value* j, int lanes) {
  if (lanes == 1)
    return j;
  std::vector<llvm::Constant*> offsets;
  for (int lane = 0; lane < lanes; ++lane)
    offsets.push_back(b.getInt64(static_cast<uint64_t>(lane)));
  return b.CreateAdd(b.CreateVectorSplat(static_cast<unsigned>(lanes), j), llvm::ConstantVector::get(offsets));
}

// The codes of `lanes` elements from j, as i32: a byte each, or for 4 bits a nibble (the even element's the high
// one). A vector of 4-bit codes starts at an even element: items and blocks are cut at even blocks.
Value* KernelBody::load_codes(IRBuilder<>& b, Value* base, BlockFormat format, Value* j, int lanes) {
  llvm::Type* i8 = b.getInt8Ty();
  llvm::Type* i32 = with_lanes(b.getInt32Ty(), lane_type(lanes));
  if (block_format_bits(format) == 8)
    return b.CreateZExt(load_lanes(b, i8, b.CreateGEP(i8, base, j), lanes, false, llvm::Align(1)), i32);
  Value* byte_at = b.CreateGEP(i8, base, b.CreateLShr(j, 1));
  if (lanes == 1) {
    Value* byte = b.CreateZExt(b.CreateLoad(i8, byte_at), i32);
    Value* shift = b.CreateSelect(b.CreateICmpEQ(b.CreateAnd(j, 1), b.getInt64(0)), b.getInt32(4), b.getInt32(0));
    return b.CreateAnd(b.CreateLShr(byte, shift), b.getInt32(15));
  }
  Value* bytes = load_lanes(b, i8, byte_at, lanes / 2, false, llvm::Align(1));
  std::vector<int> twice;
  for (int lane = 0; lane < lanes; ++lane)
    twice.push_back(lane / 2);
  Value* wide = b.CreateZExt(b.CreateShuffleVector(bytes, twice), i32);
  std::vector<llvm::Constant*> amounts;
  for (int lane = 0; lane < lanes; ++lane)
    amounts.push_back(b.getInt32(lane % 2 == 0 ? 4 : 0));
  return b.CreateAnd(b.CreateLShr(wide, llvm::ConstantVector::get(amounts)),
                     b.CreateVectorSplat(static_cast<unsigned>(lanes), b.getInt32(15)));
}

// The scale of each of `lanes` elements from j: the walked block's one scale, or each element's block's.
Value* KernelBody::block_scales(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j, int lanes) {
  Value* scales = bases[static_cast<std::size_t>(scales_base(slot))];
  const int64_t block = slot_blocks(slot)->block;
  if (block_walk_ && block_walk_->block == block) {
    Value* scale = b.CreateLoad(b.getFloatTy(), b.CreateGEP(b.getFloatTy(), scales, block_walk_->index));
    return lanes == 1 ? scale : b.CreateVectorSplat(static_cast<unsigned>(lanes), scale);
  }
  Value* elements = lane_indexes(b, j, lanes);
  Value* index = b.CreateSDiv(elements, llvm::ConstantInt::get(elements->getType(), static_cast<uint64_t>(block)));
  Value* address = b.CreateGEP(b.getFloatTy(), scales, index);
  if (lanes == 1)
    return b.CreateLoad(b.getFloatTy(), address);
  return b.CreateMaskedGather(with_lanes(b.getFloatTy(), index->getType()), address, llvm::Align(4));
}

// `lanes` values of quantized slot `slot` from j: table[code] * scale in f32 (torchao's dequantize), then `type`.
Value* KernelBody::load_quantized(IRBuilder<>& b, const std::vector<Value*>& bases, int slot, Value* j, int lanes,
                                  llvm::Type* type) {
  const SlotBlocks& blocks = *slot_blocks(slot);
  Value* codes = load_codes(b, bases[static_cast<std::size_t>(slot)], blocks.format, j, lanes);
  Value* values =
      blocks.format == BlockFormat::Fp8 ? from_e4m3_bits(b, codes) : table_lookup(b, code_table(blocks.format), codes);
  return convert(b, b.CreateFMul(values, block_scales(b, bases, slot, j, lanes)), type);
}

// A store's `lanes` values from j into its block's buffer (as f32, what torchao quantizes), and their magnitudes into
// the block's running maximum (NaN-propagating, as torch's amax). The maximum is kept as the magnitudes' bits: their
// order as unsigned integers is the floats' with every NaN above +inf, so one integer maximum does what
// llvm.maximum's lowering takes six instructions for (quantize_block reads any NaN as the quiet one).
void KernelBody::buffer_quantized_store(IRBuilder<>& b, int slot, Value* j, Value* value) {
  OPTJIT_ASSERT(block_walk_, "kernel " + plan_.name + " stores quantized state outside a walk over blocks");
  BlockWalk::Buffer& buffer = block_walk_->buffers.at(slot);
  Value* f32 = convert(b, value, with_lanes(b.getFloatTy(), value->getType()));
  b.CreateAlignedStore(f32, b.CreateGEP(b.getFloatTy(), buffer.values, b.CreateSub(j, block_walk_->start)),
                       llvm::Align(4));
  llvm::AllocaInst* absmax = f32->getType()->isVectorTy() ? buffer.vector_absmax : buffer.scalar_absmax;
  Value* magnitude = b.CreateBitCast(b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, f32), absmax->getAllocatedType());
  b.CreateStore(
      b.CreateBinaryIntrinsic(llvm::Intrinsic::umax, b.CreateLoad(absmax->getAllocatedType(), absmax), magnitude),
      absmax);
}

// float8_e4m3fn bits (i32 lanes) of f32 lanes, as c10's fp8e4m3fn_from_fp32_value: NaN (0x7f) from 480 up (and from
// above 464, which rounds there), subnormals by one f32 addition of 2^14 (whose ulp is e4m3's smallest step, so the
// addition rounds to nearest even), normals by integer rounding to nearest even.
Value* KernelBody::to_e4m3_bits(IRBuilder<>& b, Value* x) {
  llvm::Type* i32 = with_lanes(b.getInt32Ty(), x->getType());
  const auto constant = [&](uint32_t v) { return llvm::ConstantInt::get(i32, v); };
  Value* bits = b.CreateBitCast(x, i32);
  Value* sign = b.CreateAnd(bits, constant(0x80000000u));
  Value* magnitude = b.CreateXor(bits, sign);
  const uint32_t denorm_mask = 141u << 23;
  Value* subnormal_sum =
      b.CreateFAdd(b.CreateBitCast(magnitude, x->getType()), b.CreateBitCast(constant(denorm_mask), x->getType()));
  Value* subnormal = b.CreateSub(b.CreateBitCast(subnormal_sum, i32), constant(denorm_mask));
  Value* mantissa_odd = b.CreateAnd(b.CreateLShr(magnitude, constant(20)), constant(1));
  Value* normal = b.CreateLShr(
      b.CreateAdd(b.CreateAdd(magnitude, constant(static_cast<uint32_t>(7 - 127) << 23 | 0x7ffffu)), mantissa_odd),
      constant(20));
  Value* result = b.CreateSelect(b.CreateICmpULT(magnitude, constant(121u << 23)), subnormal, normal);
  result = b.CreateSelect(b.CreateICmpUGE(magnitude, constant(1087u << 20)), constant(0x7f), result);
  return b.CreateOr(result, b.CreateLShr(sign, constant(24)));
}

// The f32 value of float8_e4m3fn bits (i32 lanes), in integer and float operations instead of a table's gather: a
// normal's exponent rebiased (7 to 127) with its mantissa shifted into place, a subnormal's mantissa times 2^-9
// (exact), NaN for 0x7f and 0xff (e4m3fn has no infinity; c10's bits, 0x7ff00000), then the sign (0x80 is -0, as
// c10's).
Value* KernelBody::from_e4m3_bits(IRBuilder<>& b, Value* bits) {
  llvm::Type* i32 = bits->getType();
  llvm::Type* f32 = with_lanes(b.getFloatTy(), i32);
  const auto constant = [&](uint32_t v) { return llvm::ConstantInt::get(i32, v); };
  Value* magnitude = b.CreateAnd(bits, constant(0x7f));
  Value* normal = b.CreateBitCast(b.CreateAdd(b.CreateShl(magnitude, constant(20)), constant(120u << 23)), f32);
  Value* subnormal = b.CreateFMul(b.CreateUIToFP(magnitude, f32), llvm::ConstantFP::get(f32, 0x1p-9));
  Value* value = b.CreateSelect(b.CreateICmpULT(magnitude, constant(8)), subnormal, normal);
  value = b.CreateSelect(b.CreateICmpEQ(magnitude, constant(0x7f)), b.CreateBitCast(constant(0x7ff00000u), f32), value);
  Value* sign = b.CreateShl(b.CreateAnd(bits, constant(0x80)), constant(24));
  return b.CreateBitCast(b.CreateOr(b.CreateBitCast(value, i32), sign), f32);
}

// The search table of a map format (runtime/block_quantization.h's CodeSearch), a module constant.
Value* KernelBody::code_search_table(BlockFormat format) {
  const std::string name = "optjit.search." + block_format_name(format);
  if (llvm::GlobalVariable* table = module_.getNamedGlobal(name))
    return table;
  llvm::Constant* entries = llvm::ConstantDataArray::get(ctx_, llvm::ArrayRef<uint32_t>(code_search(format).buckets));
  return new llvm::GlobalVariable(module_, entries->getType(), /*isConstant=*/true, llvm::GlobalValue::PrivateLinkage,
                                  entries, name);
}

// The nearest code (i32 lanes) of f32 lanes `x` in `format`'s sorted map, as torchao's quantize_{8,4}bit_with_qmap
// finds it (a branchless binary search for the last entry <= x, then one up when x - down >= (up - down) * 0.5),
// found in one table read (runtime/block_quantization.h's CodeSearch): x's bucket's code, plus one when x's key
// reaches the bucket's next; NaN is code 0, as torchao's comparisons make it. FP8: c10's rounding.
Value* KernelBody::nearest_codes(IRBuilder<>& b, Value* x, BlockFormat format) {
  if (format == BlockFormat::Fp8)
    return to_e4m3_bits(b, x);
  llvm::Type* i32 = with_lanes(b.getInt32Ty(), x->getType());
  const CodeSearch& search = code_search(format);
  const auto constant = [&](uint32_t v) { return llvm::ConstantInt::get(i32, v); };
  // CodeSearch::bucket: the sign's exponents, the exponent clamped to [min_exponent, 127], the first mantissa bits.
  Value* bits = b.CreateBitCast(x, i32);
  Value* exponent = b.CreateAnd(b.CreateLShr(bits, constant(23)), constant(0xff));
  exponent = b.CreateBinaryIntrinsic(llvm::Intrinsic::umax, exponent, constant(search.min_exponent));
  exponent = b.CreateBinaryIntrinsic(llvm::Intrinsic::umin, exponent, constant(127));
  Value* row = b.CreateAdd(b.CreateMul(b.CreateLShr(bits, constant(31)), constant(search.exponents())),
                           b.CreateSub(exponent, constant(search.min_exponent)));
  Value* mantissa =
      b.CreateAnd(b.CreateLShr(bits, constant(CodeSearch::key_bits)), constant((1u << CodeSearch::mantissa_bits) - 1));
  Value* bucket = b.CreateOr(b.CreateShl(row, constant(CodeSearch::mantissa_bits)), mantissa);
  Value* at = b.CreateGEP(b.getInt32Ty(), code_search_table(format), bucket);
  Value* entry = x->getType()->isVectorTy() ? b.CreateMaskedGather(i32, at, llvm::Align(4))
                                            : static_cast<Value*>(b.CreateAlignedLoad(i32, at, llvm::Align(4)));
  // CodeSearch::key: the low mantissa bits, complemented for a negative x.
  Value* key =
      b.CreateAnd(b.CreateXor(bits, b.CreateAShr(bits, constant(31))), constant((1u << CodeSearch::key_bits) - 1));
  Value* up = b.CreateZExt(b.CreateICmpUGE(key, b.CreateLShr(entry, constant(8))), i32);
  Value* code = b.CreateAdd(b.CreateAnd(entry, constant(0xff)), up);
  return b.CreateSelect(b.CreateFCmpUNO(x, x), llvm::Constant::getNullValue(i32), code);
}

// The scale of a block with a normal reciprocal (finite, under 2^126; it is at least 1e-12) times 2^-e, e its
// exponent, so that the divisor is in [1, 2) and every remainder divide_by_scale takes is a normal number.
KernelBody::ScaleDivision KernelBody::prepare_scale_division(IRBuilder<>& b, Value* scale) {
  Value* biased_exponent = b.CreateAnd(b.CreateLShr(b.CreateBitCast(scale, b.getInt32Ty()), 23), 255);
  Value* factor = b.CreateBitCast(b.CreateShl(b.CreateSub(b.getInt32(254), biased_exponent), 23), b.getFloatTy());
  Value* divisor = b.CreateFMul(scale, factor);
  return {factor, divisor, b.CreateFDiv(llvm::ConstantFP::get(b.getFloatTy(), 1.0), divisor)};
}

// values / scale exactly as one f32 division rounds it (torchao divides), without a division per value: the dividend
// and divisor scaled by the same power of two (exact), q = x * (1 / d) rounded, then two of Markstein's corrections
// q += fma(-d, q, x) * (1 / d), whose remainders are exact by fma. With a correctly rounded reciprocal and a faithful q
// (the first correction gives one) the second gives the correctly rounded quotient (Markstein's theorem, Muller et
// al., Handbook of Floating-Point Arithmetic, section 4.7). A remainder that is not a normal number comes from a
// quotient under 2^-100, whose code is that of a zero of its sign in every format (runtime/block_quantization.h), so
// the sign is the dividend's; ±0 keep theirs. The vectors of a block walk: a vdivps costs several fma's.
Value* KernelBody::divide_by_scale(IRBuilder<>& b, Value* values, const ScaleDivision& d) {
  const auto splat = [&](Value* v) {
    return b.CreateVectorSplat(llvm::cast<llvm::FixedVectorType>(values->getType())->getNumElements(), v);
  };
  Value* x = b.CreateFMul(values, splat(d.factor));
  Value* divisor = splat(d.divisor);
  Value* reciprocal = splat(d.reciprocal);
  Value* negated = b.CreateFNeg(divisor);
  Value* q = b.CreateFMul(x, reciprocal);
  for (int correction = 0; correction < 2; ++correction) {
    Value* remainder = b.CreateIntrinsic(llvm::Intrinsic::fma, {x->getType()}, {negated, q, x});
    q = b.CreateIntrinsic(llvm::Intrinsic::fma, {x->getType()}, {remainder, reciprocal, q});
  }
  return b.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, q, values);
}

void KernelBody::prepare_block_walk(llvm::Function* fn, int64_t block) {
  IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin()); // static allocas: no dynamic stack on a GPU
  BlockWalk walk;
  walk.block = block;
  for (const Store& s : graph_.stores) {
    if (s.kind != StoreKind::Tensor)
      continue;
    const int slot = index_in(plan_.abi.tensor_slots, s.name);
    if (!slot_blocks(slot))
      continue;
    walk.buffers[slot] = BlockWalk::Buffer{
        entry.CreateAlloca(llvm::ArrayType::get(entry.getFloatTy(), static_cast<uint64_t>(block)), nullptr,
                           s.name + ".block"),
        entry.CreateAlloca(vector_type_of(entry.getInt32Ty(), lanes_)), entry.CreateAlloca(entry.getInt32Ty())};
  }
  block_walk_ = std::move(walk);
}

void KernelBody::reset_block_maxima(IRBuilder<>& b) {
  for (auto& [slot, buffer] : block_walk_->buffers) {
    b.CreateStore(llvm::Constant::getNullValue(buffer.vector_absmax->getAllocatedType()), buffer.vector_absmax);
    b.CreateStore(b.getInt32(0), buffer.scalar_absmax);
  }
}

// The end of a walked block: for each quantized store, the block's scale (its absolute maximum, floored at 1e-12 with
// NaN kept, over 448 for FP8) and its codes (each buffered value divided by the scale, then its nearest code). Every
// store's scale comes first and one loop writes every store's codes, so that the stores' scalar chains (a reduction,
// a reciprocal) and their codes overlap.
void KernelBody::quantize_block(IRBuilder<>& b, const std::vector<Value*>& bases) {
  OPTJIT_ASSERT(block_walk_, "quantize_block outside a walk over blocks");
  const int64_t block = block_walk_->block;
  const int64_t vector_part = lanes_ > 1 ? block - block % lanes_ : 0;
  struct Quantized {
    BlockFormat format;
    const BlockWalk::Buffer* buffer;
    Value* scale;
    Value* codes;
    ScaleDivision by_reciprocal{};
  };
  std::vector<Quantized> stores;
  Value* normal_reciprocals = b.getTrue();
  for (auto& [slot, buffer] : block_walk_->buffers) {
    const BlockFormat format = slot_blocks(slot)->format;
    Value* absmax_bits = b.CreateLoad(b.getInt32Ty(), buffer.scalar_absmax);
    if (lanes_ > 1)
      absmax_bits = b.CreateBinaryIntrinsic(
          llvm::Intrinsic::umax, absmax_bits,
          b.CreateUnaryIntrinsic(llvm::Intrinsic::vector_reduce_umax,
                                 b.CreateLoad(buffer.vector_absmax->getAllocatedType(), buffer.vector_absmax)));
    Value* absmax = b.CreateBitCast(absmax_bits, b.getFloatTy());
    absmax = b.CreateSelect(b.CreateFCmpUNO(absmax, absmax), llvm::ConstantFP::getQNaN(b.getFloatTy()),
                            absmax); // torch's NaN, whichever came
    Value* scale =
        b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, absmax, llvm::ConstantFP::get(b.getFloatTy(), 1e-12f));
    if (format == BlockFormat::Fp8)
      scale = b.CreateFDiv(scale, llvm::ConstantFP::get(b.getFloatTy(), 448.0f));
    Value* scales = bases[static_cast<std::size_t>(scales_base(slot))];
    b.CreateStore(scale, b.CreateGEP(b.getFloatTy(), scales, block_walk_->index));
    Quantized store{format, &buffer, scale, bases[static_cast<std::size_t>(slot)]};
    if (vector_part > 0) {
      store.by_reciprocal = prepare_scale_division(b, scale);
      normal_reciprocals =
          b.CreateAnd(normal_reciprocals, b.CreateFCmpOLT(scale, llvm::ConstantFP::get(b.getFloatTy(), 0x1p126)));
    }
    stores.push_back(store);
  }
  // `lanes` buffered values of `store` from offset k, divided by its scale (by its reciprocal when `by_reciprocal`),
  // as codes.
  const auto codes_at = [&](const Quantized& store, Value* k, int lanes, bool by_reciprocal) {
    llvm::Type* type = lanes == 1 ? b.getFloatTy() : vector_type_of(b.getFloatTy(), lanes);
    Value* values = b.CreateAlignedLoad(type, b.CreateGEP(b.getFloatTy(), store.buffer->values, k), llvm::Align(4));
    if (by_reciprocal && lanes > 1)
      return nearest_codes(b, divide_by_scale(b, values, store.by_reciprocal), store.format);
    Value* divisor = lanes == 1 ? store.scale : b.CreateVectorSplat(static_cast<unsigned>(lanes), store.scale);
    return nearest_codes(b, b.CreateFDiv(values, divisor), store.format);
  };
  const auto store_codes = [&](const Quantized& store, Value* k, int lanes, bool by_reciprocal) {
    Value* element = b.CreateAdd(block_walk_->start, k);
    if (block_format_bits(store.format) == 8) {
      b.CreateAlignedStore(
          b.CreateTrunc(codes_at(store, k, lanes, by_reciprocal), with_lanes(b.getInt8Ty(), lane_type(lanes))),
          b.CreateGEP(b.getInt8Ty(), store.codes, element), llvm::Align(1));
      return;
    }
    // Two codes to a byte, the even element's in the high nibble: pairs of lanes (a tail is two scalars).
    Value *even, *odd;
    if (lanes == 1) {
      even = codes_at(store, k, 1, false);
      odd = codes_at(store, b.CreateAdd(k, b.getInt64(1)), 1, false);
    } else {
      Value* all = codes_at(store, k, lanes, by_reciprocal);
      std::vector<int> evens, odds;
      for (int lane = 0; lane < lanes; lane += 2) {
        evens.push_back(lane);
        odds.push_back(lane + 1);
      }
      even = b.CreateShuffleVector(all, evens);
      odd = b.CreateShuffleVector(all, odds);
    }
    Value* byte = b.CreateOr(b.CreateShl(even, llvm::ConstantInt::get(even->getType(), 4)), odd);
    b.CreateAlignedStore(b.CreateTrunc(byte, with_lanes(b.getInt8Ty(), byte->getType())),
                         b.CreateGEP(b.getInt8Ty(), store.codes, b.CreateLShr(element, 1)), llvm::Align(1));
  };
  if (vector_part > 0) {
    // Vectors divide by the reciprocals of scales that have normal ones; a block with another (an inf or NaN
    // maximum, rare) divides.
    const auto vector_loop = [&](const char* name, bool by_reciprocal) {
      emit_loop(b, b.getInt64(0), b.getInt64(vector_part), b.getInt64(lanes_), name, [&](Value* k) {
        for (const Quantized& store : stores)
          store_codes(store, k, lanes_, by_reciprocal);
      });
    };
    emit_if(b, normal_reciprocals, "quantize.by_reciprocal", [&] { vector_loop("quantize.vec", true); });
    emit_if(b, b.CreateNot(normal_reciprocals), "quantize.by_division",
            [&] { vector_loop("quantize.vec_divide", false); });
  }
  for (const Quantized& store : stores)
    emit_loop(b, b.getInt64(vector_part), b.getInt64(block), b.getInt64(block_format_bits(store.format) == 4 ? 2 : 1),
              "quantize.tail", [&](Value* k) { store_codes(store, k, 1, false); });
}

} // namespace optjit::emission
