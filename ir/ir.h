// The IR: a flat SSA graph of plain nodes in topological order, plus an effect list of stores that run after
// every value is computed (so every load sees the values from before the step), over the slots the graph
// declares (each with a role and a storage dtype). The graph owns its nodes; passes return new graphs.
#pragma once

#include "runtime/block_quantization.h"
#include "runtime/dtype.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace optjit {

enum class Op : uint8_t {
#define OPTJIT_OP(name, arity, traits) name,
#include "ir/ops.def"
#undef OPTJIT_OP
};

enum OpTraits : unsigned {
  kNone = 0,
  kInput = 1,
  kCommutative = 2,
  kReduction = 4,
  kAxis = 8,
  kListReduction = 16,
  kMatrix = 32
};

std::string_view op_name(Op op);
int op_arity(Op op);
bool op_has_trait(Op op, OpTraits trait);
// Looks an op up by its printed name; false when there is none.
bool op_from_name(std::string_view name, Op& op);

// Per-tensor values run once per tensor (f64 scalar math, as torch does on the host); element values run once
// per element in the graph's dtype.
enum class Level : uint8_t { PerTensor, Element };

using ValueId = int32_t;

struct Node {
  Op op = Op::constant;
  Level level = Level::PerTensor;
  Dtype dtype = Dtype::f64;
  std::vector<ValueId> inputs;
  double number = 0; // constant
  std::string name;  // hyper, scalar_state, tensor
  bool operator==(const Node&) const = default;
};

enum class StoreKind : uint8_t { Tensor, Scalar, Carry };

// Writes value `value` into slot `name`: a tensor slot (element value), a scalar-state slot (per-tensor value,
// rounded to the graph's dtype), or a carried value (per-tensor, any dtype) that later kernels of a plan read with
// `carried "name"`.
struct Store {
  StoreKind kind = StoreKind::Tensor;
  std::string name;
  ValueId value = -1;
  bool operator==(const Store&) const = default;
};

// What a slot holds for the algorithm. Drivers find a step's grads by role, never by name; an optimizer may read
// or write any slot it declares.
// Scratch: a plan's temporary (a matrix product's operand or result), made by the executable, never a source's.
enum class SlotRole : uint8_t { Param, Grad, State, Scratch };
// Element data with the param's shape, one per-tensor scalar (a 1-element tensor: `step`), or one value per row
// (shape [..., m, 1] of a param [..., m, n]) or per column ([..., 1, n]) of a param of rank >= 2: a load reads the
// element's row or column, a store writes each row or column once (from its last element).
enum class SlotKind : uint8_t { Tensor, Scalar, Rows, Cols };
// Whether element values read and write slots of this kind (every kind but Scalar).
inline bool is_element_slot(SlotKind kind) { return kind != SlotKind::Scalar; }

// Block-quantized storage (runtime/block_quantization.h, torchao's layout): a slot's values kept as codes (its
// tensors: u8 map indexes, two to a byte for 4 bits, or e4m3 values) and one f32 scale per block of `block`
// consecutive elements (its scales: the tensors of slot scales_slot_name(name)). A load dequantizes (the code's value
// times its block's scale, in f32); a store quantizes each block by its absolute maximum, so a kernel that stores one
// computes a whole block's values before it writes any of its codes.
struct SlotBlocks {
  BlockFormat format = BlockFormat::Signed8;
  int64_t block = 256;
  bool operator==(const SlotBlocks&) const = default;
};
// The largest block a kernel quantizes (its values are held on the stack while the block's maximum is found).
constexpr int64_t kMaxQuantizationBlock = 16384;

// A slot of the graph: its name, role, kind and storage dtype (what its tensors hold; loads convert to the
// compute dtype of the ops that read them, stores round to it). A block-quantized slot (`blocks`: state tensors
// only) holds f32 values (`dtype`) stored as codes and scales.
struct Slot {
  std::string name;
  SlotRole role = SlotRole::State;
  SlotKind kind = SlotKind::Tensor;
  Dtype dtype = Dtype::f32;
  std::optional<SlotBlocks> blocks;
  bool operator==(const Slot&) const = default;
};
// The name under which a block-quantized slot's scales are bound: "exp_avg" -> "exp_avg.scale".
std::string scales_slot_name(const std::string& name);
// What a slot is stored as, as the IR prints it: its dtype ("f32"), or its format and block ("signed8/256").
std::string slot_storage_name(const Slot& slot);

std::string_view slot_role_name(SlotRole role); // "param", "grad", "state"
std::string_view slot_kind_name(SlotKind kind); // "tensor", "scalar"

struct Graph {
  std::string name;
  Dtype dtype = Dtype::f32; // the compute dtype of element values
  std::vector<Slot> slots;  // every slot a node or store may name, in declaration order
  std::vector<Node> nodes;
  std::vector<Store> stores;

  // The declared slot `name`; nullptr when the graph does not declare it.
  const Slot* slot(const std::string& name) const {
    for (const Slot& s : slots)
      if (s.name == name)
        return &s;
    return nullptr;
  }
  const Node& node(ValueId id) const { return nodes[static_cast<std::size_t>(id)]; }
  int size() const { return static_cast<int>(nodes.size()); }
  bool operator==(const Graph&) const = default;
};

// What a matrix product node (mm, addmm) says in its name, "nt bf16": whether A and B are read transposed, and the
// dtype its products run in (bf16 or f32).
struct MatrixProductForm {
  bool transpose_a = false, transpose_b = false;
  Dtype dtype = Dtype::f32;
};
// The form of `node`; throws optjit::Error naming the rule when its name is not "<n|t><n|t> <bf16|f32>".
MatrixProductForm matrix_product_form(const Node& node);
std::string matrix_product_name(const MatrixProductForm& form);

// An element value's shape as a matrix of its list entry's (m, n) param: the param's own, or a product's.
enum class MatrixShape : uint8_t { MN, MM, NN, NM };
std::pair<char, char> matrix_dims(MatrixShape shape); // ('m', 'n'), ...
// Per node, its shape (MN for every value that is not a product's or made from one); throws optjit::Error naming
// the node where a product's inner sizes differ, an addmm adds another shape, or a pointwise op, a reduction or a
// store reads a shape other than the param's.
std::vector<MatrixShape> matrix_shapes(const Graph& graph);

// Per node, how many reductions lie on its longest path from the inputs: the pass over the data after which its
// value can exist (a reduction's phase is one more than its operand's; a list reduction's too, unless its operand
// is an element reduction, whose pass it ends with). Values of phase 0 need no reduction. A matrix product's phase
// is one more than its operands' (they are written out by the kernel of their phase), or its operand product's.
std::vector<int> reduction_phases(const Graph& graph);

// The slots a graph touches, in order of first appearance.
struct GraphSignature {
  std::vector<std::string> tensor_slots; // loaded or stored element slots
  std::vector<std::string> scalar_slots; // loaded or stored per-tensor state slots
  std::vector<std::string> hypers;
  std::vector<std::string> carried_in;  // carried values read
  std::vector<std::string> carried_out; // carried values written
  bool operator==(const GraphSignature&) const = default;
};
GraphSignature signature_of(const Graph& graph);

} // namespace optjit
