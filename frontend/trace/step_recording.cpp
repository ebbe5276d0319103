#include "frontend/trace/step_recording.h"

#include "ir/printer.h"

#include "runtime/error.h"
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

namespace optjit {

// The recorded ops: the leaves, the foreach vocabulary's element and per-tensor ops, its reductions, and the stores.
// clang-format off
enum class StepRecording::Code : uint8_t {
  tensors, scalar_state, hyper, constant, extent,                      // leaves
  add, sub, mul, div, maximum, minimum, pow, lt, gt, eq,               // binary
  neg, sqrt, abs, sign, exp, log,                                      // unary
  add_scaled, lerp, addcmul, addcdiv, select,                          // torch's foreach forms
  round_bf16, widen, transpose, mm, addmm,                             // dtypes and matrix products
  sum, max, row_sum, col_sum, list_sum, list_max, store, store_scalar, // reductions and effects
};
// clang-format on

namespace {

using Code = StepRecording::Code;
using Value = StepRecording::Value;

// clang-format off
constexpr const char* kCodeNames[] = {
    "tensors", "scalar_state", "hyper", "constant", "extent",
    "add", "sub", "mul", "div", "maximum", "minimum", "pow", "lt", "gt", "eq",
    "neg", "sqrt", "abs", "sign", "exp", "log",
    "add_scaled", "lerp", "addcmul", "addcdiv", "select",
    "round_bf16", "widen", "transpose", "mm", "addmm",
    "sum", "max", "row_sum", "col_sum", "list_sum", "list_max", "store", "store_scalar"};
// clang-format on
static_assert(std::size(kCodeNames) == static_cast<std::size_t>(Code::store_scalar) + 1);

const char* code_name(Code code) { return kCodeNames[static_cast<std::size_t>(code)]; }

// The ops of the recording that torch's ops of the same name (and where, as select) record as they are.
const std::map<std::string, Code>& direct_ops() {
  // clang-format off
  static const std::map<std::string, Code> ops = {
      {"add", Code::add}, {"sub", Code::sub}, {"mul", Code::mul}, {"div", Code::div}, {"maximum", Code::maximum},
      {"minimum", Code::minimum}, {"pow", Code::pow}, {"lt", Code::lt}, {"gt", Code::gt}, {"eq", Code::eq},
      {"neg", Code::neg}, {"sqrt", Code::sqrt}, {"abs", Code::abs}, {"sign", Code::sign}, {"exp", Code::exp},
      {"log", Code::log}, {"add_scaled", Code::add_scaled}, {"lerp", Code::lerp}, {"addcmul", Code::addcmul},
      {"addcdiv", Code::addcdiv}, {"where", Code::select}};
  // clang-format on
  return ops;
}

std::size_t arity(Code code) {
  switch (code) {
  case Code::neg:
  case Code::sqrt:
  case Code::abs:
  case Code::sign:
  case Code::exp:
  case Code::log:
    return 1;
  case Code::add_scaled:
  case Code::lerp:
  case Code::select:
    return 3;
  case Code::addcmul:
  case Code::addcdiv:
    return 4;
  default:
    return 2;
  }
}

// A value's Holds in messages ("one per row"), and in instructions() (the short names of the Python recorder's past).
const char* holds_text(Holds holds) {
  constexpr const char* kText[] = {"element", "row", "column", "matrix", "tensor"};
  return kText[static_cast<std::size_t>(holds)];
}

const char* holds_code(Holds holds) {
  constexpr const char* kCodes[] = {"el", "rows", "cols", "mat", "pt"};
  return kCodes[static_cast<std::size_t>(holds)];
}

// What an elementwise op on operands holding `kinds` holds, as torch broadcasts their shapes.
Holds broadcast(const std::vector<Holds>& kinds) {
  const auto has = [&](Holds h) { return std::find(kinds.begin(), kinds.end(), h) != kinds.end(); };
  if (has(Holds::Element) || (has(Holds::Rows) && has(Holds::Cols)))
    return Holds::Element;
  for (Holds h : {Holds::Rows, Holds::Cols, Holds::Matrix})
    if (has(h))
      return h;
  return Holds::Tensor;
}

// What a sum along dim -1 (row_sum) or -2 (col_sum) holds; nullopt where the value has one number along it (it is its
// own sum).
std::optional<Holds> axis_sum(Code code, Holds of) {
  if (code == Code::row_sum)
    return of == Holds::Element ? std::optional(Holds::Rows)
           : of == Holds::Cols  ? std::optional(Holds::Matrix)
                                : std::nullopt;
  return of == Holds::Element ? std::optional(Holds::Cols)
         : of == Holds::Rows  ? std::optional(Holds::Matrix)
                              : std::nullopt;
}

// Whether a tensor holding `shape` can take a value holding `value` in place.
bool fits(Holds shape, Holds value) {
  switch (shape) {
  case Holds::Element:
    return true;
  case Holds::Rows:
    return value == Holds::Rows || value == Holds::Matrix || value == Holds::Tensor;
  case Holds::Cols:
    return value == Holds::Cols || value == Holds::Matrix || value == Holds::Tensor;
  case Holds::Matrix:
    return value == Holds::Matrix || value == Holds::Tensor;
  case Holds::Tensor:
    return value == Holds::Tensor;
  }
  return false;
}

bool per_tensor(Code code) {
  switch (code) {
  case Code::sum:
  case Code::max:
  case Code::list_sum:
  case Code::list_max:
  case Code::constant:
  case Code::hyper:
  case Code::scalar_state:
  case Code::extent:
    return true;
  default:
    return false;
  }
}

bool is_comparison(const std::string& name) {
  return name == "lt" || name == "gt" || name == "le" || name == "ge" || name == "eq" || name == "ne";
}

// "(m, n)": a matrix shape as messages name it.
std::string shape_text(MatrixShape shape) {
  const auto [rows, cols] = matrix_dims(shape);
  return std::string{'(', rows, ',', ' ', cols, ')'};
}

MatrixShape shape_of(std::pair<char, char> dims) {
  return dims == std::pair{'m', 'n'}   ? MatrixShape::MN
         : dims == std::pair{'m', 'm'} ? MatrixShape::MM
         : dims == std::pair{'n', 'n'} ? MatrixShape::NN
                                       : MatrixShape::NM;
}

// Codes that take element values of any shape: the products, and a transpose (of a product's operand).
bool takes_any_shape(Code code) { return code == Code::mm || code == Code::addmm || code == Code::transpose; }

void check_order(double order, const std::string& what) {
  if (order != 2.0 && order != std::numeric_limits<double>::infinity())
    throw Error(what + " of order " + format_number(order) + ": optjit records the 2-norm and the inf-norm");
}

// The recordings open in this thread, innermost last: what a message about a kept value names as recording now. By
// serial number and name, not by pointer: a recording destroyed without closing (an interrupt between open() and the
// Python side's try) leaves nothing that points at it.
struct OpenRecording {
  uint64_t serial;
  std::string name;
};
thread_local std::vector<OpenRecording> open_recordings;
std::atomic<uint64_t> next_serial{1};

void leave_open_recordings(uint64_t serial) {
  std::erase_if(open_recordings, [&](const OpenRecording& r) { return r.serial == serial; });
}

} // namespace

StepRecording::StepRecording(std::string name, int length, int min_rank)
    : name_(std::move(name)), length_(length), min_rank_(min_rank) {}

StepRecording::~StepRecording() {
  if (serial_ != 0)
    leave_open_recordings(serial_);
}

void StepRecording::open() {
  serial_ = next_serial.fetch_add(1, std::memory_order_relaxed);
  open_recordings.push_back({serial_, name_});
}

void StepRecording::close() {
  closed_ = true;
  if (serial_ != 0)
    leave_open_recordings(std::exchange(serial_, 0));
}

void StepRecording::check_open() const {
  if (!closed_)
    return;
  const std::string current = open_recordings.empty() ? name_ : open_recordings.back().name;
  throw Error("step function " + current + " uses a value recorded by an earlier call of step function " + name_ +
              " (kept in a global, a closure, an attribute or a default argument): a recording's values stand for "
              "that call's tensors and hyperparameters only; compute the value again inside the function, or keep it "
              "in a state list");
}

const StepRecording::Instruction& StepRecording::at(Value value) const {
  check_open();
  if (value < 0 || static_cast<std::size_t>(value) >= program_.size()) // a value of another recording
    throw Error("step function " + name_ + " uses a value it did not record (value " + std::to_string(value) +
                "): a step function's values are its own recording's");
  return program_[static_cast<std::size_t>(value)];
}

Value StepRecording::emit(Code code, std::vector<Value> inputs, std::string name, double number,
                          std::optional<Holds> holds) {
  std::vector<Holds> kinds; // each input's, which also checks it was recorded here (the replay reads its value)
  bool weak = code == Code::hyper || code == Code::constant || code == Code::extent;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Instruction& input = at(inputs[k]);
    kinds.push_back(input.holds);
    weak = (k == 0 || weak) && input.weak;
    const bool product_operand = (code == Code::mm && k < 2) || (code == Code::addmm && (k == 1 || k == 2));
    if (input.code == Code::transpose && !product_operand)
      throw Error("a transposed element (x.T, x.mT) is used by torch." + std::string(code_name(code)) +
                  ": optjit reads transposes as operands of matrix products (torch.mm, @, torch.addmm) only");
    if (input.holds == Holds::Element && input.shape != MatrixShape::MN && !takes_any_shape(code))
      throw Error("torch." + std::string(code_name(code)) + " on a matrix product's value of shape " +
                  shape_text(input.shape) +
                  " for an (m, n) param: optjit computes pointwise ops, reductions and "
                  "stores on values of the param's shape; combine products with torch.addmm(input, a, b, beta=, "
                  "alpha=), or multiply them back to (m, n)");
  }
  check_open();
  const bool effect = code == Code::store || code == Code::store_scalar;
  // A number by its bits, so -0.0 is not 0.0; every NaN is one (its sign and payload say nothing torch keeps).
  const uint64_t bits = std::isnan(number) ? std::bit_cast<uint64_t>(std::numeric_limits<double>::quiet_NaN())
                                           : std::bit_cast<uint64_t>(number);
  auto key = std::make_tuple(code, inputs, name, bits);
  if (!effect)
    if (auto known = interned_.find(key); known != interned_.end())
      return known->second;
  if (!holds) {
    if (per_tensor(code))
      holds = Holds::Tensor;
    else if (code == Code::row_sum || code == Code::col_sum)
      holds = axis_sum(code, kinds.front()).value();
    else
      holds = broadcast(kinds);
  }
  program_.push_back(Instruction{code, std::move(inputs), std::move(name), number, *holds});
  program_.back().weak = weak;
  const auto value = static_cast<Value>(program_.size() - 1);
  if (!effect)
    interned_.emplace(std::move(key), value);
  return value;
}

Value StepRecording::list(const std::string& slot, Holds holds) {
  lists_[slot] = holds;
  return holds == Holds::Tensor ? emit(Code::scalar_state, {}, slot) : emit(Code::tensors, {}, slot, 0, holds);
}

Value StepRecording::hyper(const std::string& name) { return emit(Code::hyper, {}, name); }
Value StepRecording::constant(double value) { return emit(Code::constant, {}, "", value); }

Value StepRecording::op(const std::string& name, const std::vector<Value>& operands) {
  const Value result = lowered(name, operands);
  if (is_comparison(name)) // a bool tensor
    return result;
  std::vector<Value> typed = operands;
  if (name == "where" && !typed.empty()) // the condition is a bool tensor: the branches decide the dtype
    typed.erase(typed.begin());
  return in_torch_dtype(result, typed);
}

Value StepRecording::lowered(const std::string& name, const std::vector<Value>& operands) {
  const auto operand = [&](std::size_t k) {
    if (k >= operands.size())
      throw Error("torch." + name + " takes " + std::to_string(k + 1) + " operands, recorded with " +
                  std::to_string(operands.size()));
    return operands[k];
  };
  if (auto direct = direct_ops().find(name); direct != direct_ops().end()) {
    std::vector<Value> inputs;
    for (std::size_t k = 0; k < arity(direct->second); ++k)
      inputs.push_back(operand(k));
    return emit(direct->second, std::move(inputs));
  }
  // torch's comparisons as a 0/1 value: a >= b is a > b or a == b (0 for NaN), a != b is 1 - (a == b) (1 for NaN).
  if (name == "ge" || name == "le") {
    const Value strict = emit(name == "ge" ? Code::gt : Code::lt, {operand(0), operand(1)});
    return emit(Code::add, {strict, emit(Code::eq, {operand(0), operand(1)})});
  }
  if (name == "ne") {
    const Value equal = emit(Code::eq, {operand(0), operand(1)});
    return emit(Code::sub, {constant(1.0), equal});
  }
  if (name == "rsqrt") {
    const Value one = constant(1.0);
    return emit(Code::div, {one, emit(Code::sqrt, {operand(0)})});
  }
  if (name == "reciprocal")
    return emit(Code::div, {constant(1.0), operand(0)});
  if (name == "square")
    return emit(Code::mul, {operand(0), operand(0)});
  if (name == "sub_scaled") // self - alpha * other, torch's sub with alpha
    return emit(Code::add_scaled, {operand(0), operand(1), emit(Code::neg, {operand(2)})});
  throw Error("torch." + name + " is outside optjit's step-function vocabulary");
}

Value StepRecording::pow_number(Value base, double exponent) {
  if (exponent == 0.5)
    return op("sqrt", {base});
  if (exponent == -0.5)
    return op("rsqrt", {base});
  if (exponent == -1)
    return op("reciprocal", {base});
  if (exponent == 2)
    return op("square", {base});
  if (exponent == 3)
    return emit(Code::mul, {op("square", {base}), base});
  if (exponent == -2)
    return op("reciprocal", {op("square", {base})});
  const Value e = constant(exponent);
  return in_torch_dtype(emit(Code::pow, {base, e}), {base});
}

Value StepRecording::clamp(Value x, std::optional<Value> min, std::optional<Value> max) {
  if (!min && !max)
    throw Error("torch.clamp: arguments optjit does not record: clamp needs min or max");
  Value value = x;
  if (min)
    value = emit(Code::maximum, {value, *min});
  if (max)
    value = emit(Code::minimum, {value, *max});
  std::vector<Value> operands = {x};
  for (const std::optional<Value>& bound : {min, max})
    if (bound)
      operands.push_back(*bound);
  return in_torch_dtype(value, operands);
}

Value StepRecording::reduce(Value x, const std::string& name, std::optional<double> order, std::optional<int> dim,
                            const std::string& dim_text, bool keepdim) {
  // torch's reductions of a bf16 tensor accumulate in f32 and give bf16.
  return in_torch_dtype(reduced(x, name, order, dim, dim_text, keepdim), {x});
}

Value StepRecording::reduced(Value x, const std::string& name, std::optional<double> order, std::optional<int> dim,
                             const std::string& dim_text, bool keepdim) {
  if (order)
    check_order(*order, name);
  if (!dim_text.empty())
    return axis_reduction(x, name, order, dim.value_or(0), dim_text, keepdim);
  const Holds kind = at(x).holds;
  const bool inf_norm = order && std::isinf(*order);
  const bool takes_any_kind = name == "max" || name == "amax" || inf_norm; // a largest value is the same broadcast
  if (kind != Holds::Element && kind != Holds::Tensor && !takes_any_kind)
    throw Error(name + " over a whole tensor of one value per " + holds_text(kind) +
                ": optjit reduces whole element tensors (sum, mean, max, norm); reduce rows and columns along their "
                "other dimension first (dim=-1 or -2, keepdim=True)");
  if (inf_norm)
    return emit(Code::max, {emit(Code::abs, {x})});
  if (order) {
    const Value squares = emit(Code::sum, {emit(Code::mul, {x, x})});
    const Value norm = emit(Code::sqrt, {squares});
    norm_squares_[norm] = squares;
    return norm;
  }
  if (name == "mean") {
    const Value total = emit(Code::sum, {x});
    return emit(Code::div, {total, emit(Code::extent, {}, "numel")});
  }
  return emit(name == "sum" ? Code::sum : Code::max, {x});
}

Value StepRecording::axis_reduction(Value x, const std::string& name, std::optional<double> order, int dim,
                                    const std::string& dim_text, bool keepdim) {
  const bool known = name == "sum" || name == "mean" || name == "norm" || name == "linalg_vector_norm";
  if (!known || (dim != -1 && dim != -2) || (order && std::isinf(*order)))
    throw Error(name + " along dim=" + dim_text +
                ": optjit records the sum, mean and 2-norm along dim -1 or -2 (each row or each column, as Adafactor "
                "takes them)");
  if (!keepdim)
    throw Error(
        name + " along dim " + std::to_string(dim) +
        " without keepdim=True: optjit records values that keep their tensor's dimensions (a row's sum is [..., "
        "m, 1]); pass keepdim=True");
  const bool squared = name == "norm" || name == "linalg_vector_norm";
  Value value = squared ? emit(Code::mul, {x, x}) : x;
  const Code code = dim == -1 ? Code::row_sum : Code::col_sum;
  if (axis_sum(code, at(value).holds)) { // else it has one number along dim: it is its own sum
    value = emit(code, {value});
    if (name == "mean")
      value = emit(Code::div, {value, size(x, dim, dim_text)});
  }
  return squared ? emit(Code::sqrt, {value}) : value;
}

Value StepRecording::reduce_stack(Value x, const std::string& name, double order) {
  if (name == "sum")
    return emit(Code::list_sum, {x});
  if (name == "max" || name == "amax")
    return emit(Code::list_max, {x});
  if (name == "mean") { // over the tensors of the lists: their number is the recording's
    const Value total = emit(Code::list_sum, {x});
    return emit(Code::div, {total, constant(static_cast<double>(length_))});
  }
  check_order(order, "a norm");
  if (std::isinf(order))
    return emit(Code::list_max, {emit(Code::abs, {x})});
  // The 2-norm of per-tensor 2-norms is the square root of every tensor's sum of squares, summed: taken from those
  // sums, it is combined in the pass that computes them (two kernels with the update, not three).
  const auto squares = norm_squares_.find(x);
  const Value summed = squares != norm_squares_.end() ? squares->second : emit(Code::mul, {x, x});
  return emit(Code::sqrt, {emit(Code::list_sum, {summed})});
}

Value StepRecording::norm_of_scalar(Value x, double order) {
  check_order(order, "a norm");
  return emit(Code::abs, {x});
}

Value StepRecording::size(Value x, std::optional<int> dim, const std::string& dim_text) {
  const Holds kind = at(x).holds;
  if (kind == Holds::Tensor)
    throw Error("the size of a 0-d element: it has no dimensions (torch's size(-1) raises)");
  const Value one = constant(1.0);
  if (!dim) {
    Value numel = emit(Code::extent, {}, "numel");
    if (kind == Holds::Rows || kind == Holds::Matrix)
      numel = emit(Code::div, {numel, emit(Code::extent, {}, "n")});
    if (kind == Holds::Cols || kind == Holds::Matrix)
      numel = emit(Code::div, {numel, emit(Code::extent, {}, "m")});
    return numel;
  }
  if (*dim != -1 && *dim != -2)
    throw Error("size(" + (dim_text.empty() ? std::to_string(*dim) : dim_text) +
                "): optjit records size(-1), size(-2) and numel() (a step is recorded for every rank)");
  if (min_rank_ < -*dim)
    throw Error("size(" + std::to_string(*dim) + ") of an element of a list with a param of rank " +
                std::to_string(min_rank_) + ": it has no such dimension (torch raises)");
  const bool collapsed =
      *dim == -1 ? (kind == Holds::Rows || kind == Holds::Matrix) : (kind == Holds::Cols || kind == Holds::Matrix);
  return collapsed ? one : emit(Code::extent, {}, *dim == -1 ? "n" : "m");
}

Value StepRecording::in_torch_dtype(Value result, const std::vector<Value>& operands) {
  // torch's promotion among bf16 and the list's dtype: dimensioned tensors decide; without them 0-d tensors do;
  // Python numbers never do.
  bool dimensioned = false, bf16 = true, any_tensor = false;
  for (Value v : operands)
    dimensioned = dimensioned || at(v).holds != Holds::Tensor;
  for (Value v : operands) {
    const Instruction& i = at(v);
    if (i.weak || (dimensioned && i.holds == Holds::Tensor))
      continue;
    any_tensor = true;
    bf16 = bf16 && i.bf16;
  }
  if (!any_tensor || !bf16 || at(result).bf16)
    return result;
  const Value rounded = emit(Code::round_bf16, {result});
  program_[static_cast<std::size_t>(rounded)].bf16 = true;
  return rounded;
}

std::pair<Value, bool> StepRecording::product_operand(Value x, const char* what) const {
  const Instruction& i = at(x);
  if (i.holds != Holds::Element)
    throw Error(std::string("a matrix product's ") + what + " holds one value per " + holds_text(i.holds) +
                ": optjit multiplies element values (the param's matrices, and products of them)");
  if (i.code == Code::transpose)
    return {i.inputs[0], true};
  return {x, false};
}

StepRecording::Product StepRecording::product(Value a, Value b) const {
  const auto [left, transpose_a] = product_operand(a, "first operand");
  const auto [right, transpose_b] = product_operand(b, "second operand");
  if (at(left).bf16 != at(right).bf16)
    throw Error("torch.mm of a bf16 value and one in the list's dtype: torch multiplies matrices of one dtype "
                "(expected both operands to have the same dtype); round both with .bfloat16(), or neither");
  auto rows = matrix_dims(at(left).shape), cols = matrix_dims(at(right).shape);
  if (transpose_a)
    std::swap(rows.first, rows.second);
  if (transpose_b)
    std::swap(cols.first, cols.second);
  if (rows.second != cols.first)
    throw Error(fmt::format("torch.mm of a ({0}, {1}) by a ({2}, {3}) matrix, for every (m, n) param: the inner sizes "
                            "{1} and {2} differ unless the param is square (optjit records one step for every shape; "
                            "transpose an operand, x.T)",
                            rows.first, rows.second, cols.first, cols.second));
  const bool bf16 = at(left).bf16;
  return {left, right, matrix_product_name({transpose_a, transpose_b, bf16 ? Dtype::bf16 : Dtype::f32}),
          shape_of({rows.first, cols.second}), bf16};
}

Value StepRecording::matmul(std::optional<Value> a, std::optional<Value> b) {
  if (a && b && at(*a).holds == Holds::Rows && at(*b).holds == Holds::Cols) // Adafactor's outer product
    return emit(Code::mul, {*a, *b});
  if (!a || !b || at(*a).holds != Holds::Element || at(*b).holds != Holds::Element)
    throw Error("the operator @ on elements: optjit records the product of two element values (a param's "
                "matrices, x @ x.T) and a column of rows times a row of columns ([..., m, 1] @ [..., 1, n], an outer "
                "product); other products are outside its step-function vocabulary");
  if (min_rank_ != 2)
    throw Error("the operator @ on elements of a list with a param of rank " + std::to_string(min_rank_) +
                ": optjit multiplies the matrices of 2-D params (torch.mm)");
  const Product p = product(*a, *b);
  const Value result = emit(Code::mm, {p.a, p.b}, p.form, 0, Holds::Element);
  program_[static_cast<std::size_t>(result)].shape = p.shape;
  program_[static_cast<std::size_t>(result)].bf16 = p.bf16;
  return result;
}

Value StepRecording::addmm(Value input, Value a, Value b, Value beta, Value alpha) {
  for (Value v : {a, b})
    if (at(v).holds != Holds::Element)
      throw Error("torch.addmm multiplies element values (a param's matrices, and products of them), not values of "
                  "one per " +
                  std::string(holds_text(at(v).holds)));
  if (min_rank_ != 2)
    throw Error("torch.addmm on elements of a list with a param of rank " + std::to_string(min_rank_) +
                ": optjit multiplies the matrices of 2-D params");
  const Product p = product(a, b);
  const Instruction& in = at(input);
  if (in.holds != Holds::Element || in.code == Code::transpose || in.shape != p.shape)
    throw Error("torch.addmm adds " +
                (in.holds != Holds::Element   ? std::string("a value of one per ") + holds_text(in.holds)
                 : in.code == Code::transpose ? std::string("a transposed element")
                                              : "a matrix of shape " + shape_text(in.shape)) +
                " to a product of shape " + shape_text(p.shape) +
                ": optjit adds a matrix of the product's own shape (torch would broadcast it)");
  if (in.bf16 != p.bf16)
    throw Error("torch.addmm of a bf16 product and an input in the list's dtype, or the other way round: torch adds "
                "matrices of the product's dtype; round both with .bfloat16(), or neither");
  for (Value scale : {beta, alpha})
    if (at(scale).holds != Holds::Tensor)
      throw Error("torch.addmm's beta and alpha are numbers, hyperparameters or per-tensor scalars, not tensors' "
                  "elements");
  const Value result = emit(Code::addmm, {input, p.a, p.b, beta, alpha}, p.form, 0, Holds::Element);
  program_[static_cast<std::size_t>(result)].shape = p.shape;
  program_[static_cast<std::size_t>(result)].bf16 = p.bf16;
  return result;
}

Value StepRecording::transpose(Value x) {
  const Instruction& i = at(x);
  if (i.holds != Holds::Element)
    throw Error(std::string("x.T of a value of one per ") + holds_text(i.holds) +
                ": optjit transposes element values, as operands of matrix products");
  if (i.code == Code::transpose) // (x.T).T
    return i.inputs[0];
  const auto [rows, cols] = matrix_dims(i.shape);
  const MatrixShape shape = shape_of({cols, rows});
  const bool bf16 = i.bf16;
  const Value transposed = emit(Code::transpose, {x}, "", 0, Holds::Element);
  program_[static_cast<std::size_t>(transposed)].shape = shape;
  program_[static_cast<std::size_t>(transposed)].bf16 = bf16;
  return transposed;
}

Value StepRecording::to_bf16(Value x) {
  if (at(x).bf16)
    return x;
  const Value rounded = emit(Code::round_bf16, {x});
  program_[static_cast<std::size_t>(rounded)].bf16 = true;
  return rounded;
}

Value StepRecording::to_list_dtype(Value x) { return at(x).bf16 ? emit(Code::widen, {x}) : x; }

bool StepRecording::is_bf16(Value value) const { return at(value).bf16; }

Value StepRecording::written(Value value, Value like, Holds shape) {
  if (at(like).bf16 && !at(value).bf16) // an in-place op on a bf16 tensor keeps it bf16
    value = to_bf16(value);
  const Holds kind = at(value).holds;
  if (!fits(shape, kind))
    throw Error(std::string("a step function writes a value of one per ") + holds_text(kind) +
                " into a tensor of one per " + holds_text(shape) +
                ": its shape does not fit, as torch's in-place ops refuse");
  return kind == shape ? value : emit(Code::select, {like, value, value});
}

void StepRecording::store(const std::string& slot, Value value) {
  const auto list = lists_.find(slot);
  if (list == lists_.end())
    throw Error("step function " + name_ + " stores to list '" + slot + "', which is not one of its lists");
  emit(list->second == Holds::Tensor ? Code::store_scalar : Code::store, {value}, slot);
}

Holds StepRecording::holds(Value value) const { return at(value).holds; }

std::optional<Holds> StepRecording::list_holds(const std::string& slot) const {
  const auto list = lists_.find(slot);
  return list == lists_.end() ? std::nullopt : std::optional(list->second);
}

std::string StepRecording::describe(Value value) const {
  std::vector<std::string> names;
  std::set<Value> seen;
  std::vector<Value> todo = {value};
  while (!todo.empty()) {
    const Value v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second)
      continue;
    const Instruction& instruction = at(v);
    if (instruction.code == Code::hyper)
      names.push_back(instruction.name);
    todo.insert(todo.end(), instruction.inputs.begin(), instruction.inputs.end());
  }
  if (at(value).code == Code::hyper)
    return "the value of the hyperparameter " + names.front();
  if (names.empty())
    return "a per-tensor scalar's value";
  std::sort(names.begin(), names.end());
  std::string text = names.size() > 1 ? "a value computed from the hyperparameters "
                                      : "a value computed from the "
                                        "hyperparameter ";
  for (std::size_t k = 0; k < names.size(); ++k)
    text += (k ? ", " : "") + names[k];
  return text;
}

bool StepRecording::reduces() const {
  return std::any_of(program_.begin(), program_.end(), [](const Instruction& i) {
    return i.code == Code::sum || i.code == Code::max || i.code == Code::row_sum || i.code == Code::col_sum ||
           i.code == Code::list_sum || i.code == Code::list_max;
  });
}

std::vector<std::string> StepRecording::stored_slots() const {
  std::vector<std::string> slots;
  for (const Instruction& i : program_)
    if ((i.code == Code::store || i.code == Code::store_scalar) &&
        std::find(slots.begin(), slots.end(), i.name) == slots.end())
      slots.push_back(i.name);
  return slots;
}

std::vector<std::tuple<std::string, std::vector<int>, std::string, double, std::string>>
StepRecording::instructions() const {
  std::vector<std::tuple<std::string, std::vector<int>, std::string, double, std::string>> listing;
  for (const Instruction& i : program_)
    listing.emplace_back(code_name(i.code), i.inputs, i.name, i.number, holds_code(i.holds));
  return listing;
}

void StepRecording::replay(Tracer& t) const {
  std::vector<Sym> values;
  values.reserve(program_.size());
  for (const Instruction& i : program_) {
    const auto in = [&](std::size_t k) { return values[static_cast<std::size_t>(i.inputs[k])]; };
    // clang-format off
    switch (i.code) {
    case Code::tensors: values.push_back(t.tensors(i.name)); break;
    case Code::scalar_state: values.push_back(t.scalar_state(i.name)); break;
    case Code::hyper: values.push_back(t.hyper(i.name)); break;
    case Code::constant: values.push_back(t.constant(i.number)); break;
    case Code::extent: values.push_back(i.name == "numel" ? t.numel() : t.size(i.name == "n" ? -1 : -2)); break;
    case Code::add: values.push_back(in(0) + in(1)); break;
    case Code::sub: values.push_back(in(0) - in(1)); break;
    case Code::mul: values.push_back(in(0) * in(1)); break;
    case Code::div: values.push_back(in(0) / in(1)); break;
    case Code::maximum: values.push_back(maximum(in(0), in(1))); break;
    case Code::minimum: values.push_back(minimum(in(0), in(1))); break;
    case Code::pow: values.push_back(pow(in(0), in(1))); break;
    case Code::lt: values.push_back(less(in(0), in(1))); break;
    case Code::gt: values.push_back(greater(in(0), in(1))); break;
    case Code::eq: values.push_back(equal(in(0), in(1))); break;
    case Code::neg: values.push_back(-in(0)); break;
    case Code::sqrt: values.push_back(sqrt(in(0))); break;
    case Code::abs: values.push_back(abs(in(0))); break;
    case Code::sign: values.push_back(sign(in(0))); break;
    case Code::exp: values.push_back(exp(in(0))); break;
    case Code::log: values.push_back(log(in(0))); break;
    case Code::add_scaled: values.push_back(foreach_add(in(0), in(1), in(2))); break;
    case Code::lerp: values.push_back(foreach_lerp(in(0), in(1), in(2))); break;
    case Code::addcmul: values.push_back(foreach_addcmul(in(0), in(1), in(2), in(3))); break;
    case Code::addcdiv: values.push_back(foreach_addcdiv(in(0), in(1), in(2), in(3))); break;
    case Code::select: values.push_back(where(in(0), in(1), in(2))); break;
    case Code::round_bf16: values.push_back(round_bf16(in(0))); break;
    case Code::widen: case Code::transpose: values.push_back(in(0)); break; // read by what uses them
    case Code::mm: case Code::addmm: {
      const MatrixProductForm form = matrix_product_form(Node{Op::mm, Level::Element, Dtype::f32, {}, 0, i.name});
      values.push_back(i.code == Code::mm
          ? mm(in(0), in(1), form.transpose_a, form.transpose_b, form.dtype)
          : optjit::addmm(in(0), in(1), in(2), in(3), in(4), form.transpose_a, form.transpose_b, form.dtype));
      break;
    }
    case Code::sum: values.push_back(sum(in(0))); break;
    case Code::max: values.push_back(max_of(in(0))); break;
    case Code::row_sum: values.push_back(row_sum(in(0))); break;
    case Code::col_sum: values.push_back(col_sum(in(0))); break;
    case Code::list_sum: values.push_back(list_sum(in(0))); break;
    case Code::list_max: values.push_back(list_max(in(0))); break;
    // A store's value is its operand's: keeps one value per instruction.
    case Code::store: t.store(i.name, in(0)); values.push_back(in(0)); break;
    case Code::store_scalar: t.store_scalar(i.name, in(0)); values.push_back(in(0)); break;
    }
    // clang-format on
  }
}

} // namespace optjit
