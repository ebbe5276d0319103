// StepRecording: a step recorded once, op by op, as a program of list ops over the foreach vocabulary
// (frontend/trace/foreach.h), then replayed into the Tracer of each bucket the step compiles. It is what a Python step
// function (@optjit.step_function) becomes: its symbolic values take torch's calls and record them here, so the ops,
// their lowerings (torch's pow(x, 0.5) is a sqrt, a >= b is a > b or a == b, a 2-norm is sqrt(sum(x * x))), what each
// value holds per tensor and the messages for values that do not fit are the C++ front end's, not a second one's.
//
// A value is recorded once: the same op on the same operands is the same value, so a step written one tensor at a
// time (a loop over zip(params, grads)) records each op once for every entry. Each value holds, per tensor of shape
// [..., m, n], one number per element, row ([..., m, 1]), column ([..., 1, n]), matrix ([..., 1, 1]) or tensor (a 0-d
// tensor or a Python number); ops broadcast them as torch broadcasts those shapes.
//
// Matrix products (torch.mm, @, torch.addmm, on 2-D params) give element values of another shape: (m, m), (n, n) or
// (n, m) for an (m, n) param (ir/ir.h's MatrixShape). Those feed products only (pointwise ops, reductions and stores
// take the param's shape), and a transpose (x.T, x.mT) is a product's operand read transposed. A value rounded to bf16
// (x.bfloat16()) computes as torch's bf16 tensors do: an op whose tensor operands are all bf16 rounds its result to
// bf16 (Python numbers and 0-d tensors do not promote it), and a product of bf16 operands runs in bf16, as torch's
// bf16 mm does; x.float() is the value in its list's dtype again.
#pragma once

#include "frontend/trace/foreach.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace optjit {

// What a recorded value holds per tensor of the lists, by the shape torch gives it.
enum class Holds : uint8_t { Element, Rows, Cols, Matrix, Tensor };

class StepRecording {
public:
  using Value = int;

  // A recording of step `name` over lists of `length` tensors whose lowest rank is `min_rank` (size(-2) needs 2).
  StepRecording(std::string name, int length, int min_rank);
  StepRecording(const StepRecording&) = default;
  StepRecording& operator=(const StepRecording&) = default;
  ~StepRecording(); // leaves this thread's open recordings, if it never closed

  const std::string& name() const { return name_; }
  int length() const { return length_; }
  int min_rank() const { return min_rank_; }

  // Recording runs between open() and close(), in one thread; recordings nest (a step function called while another
  // records). A value of a closed recording stands for nothing any more: using it (kept in a global, a closure, a
  // default argument) is an optjit::Error naming both step functions.
  void open();
  void close();
  bool closed() const { return closed_; }
  void check_open() const;

  // The leaves: the tensors of list `slot` (per-tensor scalar state when `holds` is Tensor), a hyperparameter, a
  // number.
  Value list(const std::string& slot, Holds holds);
  Value hyper(const std::string& name);
  Value constant(double value);

  // torch's ops on elements and scalars, by name: add, sub, mul, div, maximum, minimum, pow, lt, gt, le, ge, eq, ne
  // (comparisons give 0 or 1), neg, sqrt, rsqrt, reciprocal, square, abs, sign, exp, log; add_scaled (self + alpha *
  // other, torch's add with alpha), sub_scaled (self - alpha * other), lerp, addcmul and addcdiv (torch's foreach
  // forms), where (condition, if_true, if_false). Another name is an optjit::Error.
  Value op(const std::string& name, const std::vector<Value>& operands);
  // torch.pow(x, exponent) for a number: 0.5, -0.5, -1, 2, 3 and -2 as torch computes them (sqrt, rsqrt, reciprocal,
  // products), so sqrt(-0.0) is -0.0 and sqrt(-inf) NaN, where pow would give 0 and inf.
  Value pow_number(Value base, double exponent);
  Value clamp(Value x, std::optional<Value> min, std::optional<Value> max);

  // A reduction of an element value (torch's x.sum(), mean(), max(), amax(), norm(), linalg.vector_norm): over its
  // whole tensor a per-tensor value; along dim -1 or -2 with keepdim, a row's or column's sum, mean or 2-norm. `order`
  // is a norm's (2 or inf), `dim_text` the dim as the caller wrote it, for messages.
  Value reduce(Value x, const std::string& name, std::optional<double> order, std::optional<int> dim,
               const std::string& dim_text, bool keepdim);
  // A reduction of a torch.stack of per-tensor values over every tensor of the lists: sum, max (amax), mean, and
  // the norm of `order` (a 2-norm of per-tensor 2-norms from their sums of squares, combined in the pass that takes
  // them).
  Value reduce_stack(Value x, const std::string& name, double order);
  // The norm of one per-tensor value (its absolute value), of order 2 or inf.
  Value norm_of_scalar(Value x, double order);
  // x.size(dim) for dim -1 or -2, or x.numel() with no dim: a number per tensor. `dim_text`: the dim as the caller
  // wrote it, for messages (empty: `dim`).
  Value size(Value x, std::optional<int> dim, const std::string& dim_text = "");
  // a @ b (torch.matmul, torch.mm): the outer product of a column of rows and a row of columns, [..., m, 1] @ [...,
  // 1, n], Adafactor's; or the matrix product of two element values whose inner sizes are the same for every (m, n)
  // param (x @ x.T), of one dtype. An operand that is not a list value is absent.
  Value matmul(std::optional<Value> a, std::optional<Value> b);
  // torch.addmm(input, a, b, beta=beta, alpha=alpha): beta input + alpha (a @ b), input of the product's shape.
  Value addmm(Value input, Value a, Value b, Value beta, Value alpha);
  // x.T / x.mT of an element value: an operand of products, read transposed.
  Value transpose(Value x);
  // x.bfloat16(): x rounded to bf16, and the ops on it in bf16; x.float(): x in its list's dtype again.
  Value to_bf16(Value x);
  Value to_list_dtype(Value x);
  bool is_bf16(Value value) const;

  // `value` written in place into a tensor holding `shape` whose value is `like`: a narrower value (zero_(), a row's
  // value copied into a matrix) takes the tensor's shape (a select whose branches are both the value), so that what
  // reads the tensor later sees its shape. A value the shape cannot hold is refused, as torch's in-place ops refuse.
  Value written(Value value, Value like, Holds shape);
  // The step stores `value` into list `slot` (a state scalar when the list is per-tensor scalars).
  void store(const std::string& slot, Value value);

  Holds holds(Value value) const;
  // What list `slot` holds: nullopt for a list the recording has not read.
  std::optional<Holds> list_holds(const std::string& slot) const;
  // What a per-tensor value is, for a message: "the value of the hyperparameter lr", "a value computed from the
  // hyperparameters beta1, lr", or "a per-tensor scalar's value".
  std::string describe(Value value) const;
  // Whether the step reduces over tensors or lists (its lists, over shards, need a reducer).
  bool reduces() const;
  std::vector<std::string> stored_slots() const;
  // Each instruction as (op, inputs, name, number, what it holds): for tests and debugging.
  std::vector<std::tuple<std::string, std::vector<int>, std::string, double, std::string>> instructions() const;

  // Records the program into `tracer`, a bucket's.
  void replay(Tracer& tracer) const;

  enum class Code : uint8_t;

private:
  struct Instruction {
    Code code;
    std::vector<Value> inputs;
    std::string name;
    double number = 0;
    Holds holds = Holds::Tensor;
    MatrixShape shape = MatrixShape::MN; // an element value's, as a matrix of the param's (m, n)
    bool bf16 = false;                   // torch's tensor would be bf16 (ops on it round their results)
    bool weak = false;                   // a Python number in torch's run (hyperparameters, constants, sizes)
  };

  Value emit(Code code, std::vector<Value> inputs, std::string name = "", double number = 0,
             std::optional<Holds> holds = std::nullopt);
  // `result` of torch's op on `operands`, rounded to bf16 when torch's would compute it in bf16.
  Value in_torch_dtype(Value result, const std::vector<Value>& operands);
  // A product's operand: its value, and whether it is read transposed (x.T). Refuses what a product cannot take.
  std::pair<Value, bool> product_operand(Value x, const char* what) const;
  // a @ b: the values it reads, its form (ir/ir.h: "nt bf16"), shape and dtype. Refuses operands that do not fit.
  struct Product {
    Value a, b;
    std::string form;
    MatrixShape shape;
    bool bf16;
  };
  Product product(Value a, Value b) const;
  Value lowered(const std::string& name, const std::vector<Value>& operands); // op() before torch's dtype
  Value reduced(Value x, const std::string& name, std::optional<double> order, std::optional<int> dim,
                const std::string& dim_text, bool keepdim); // reduce() before torch's dtype
  Value axis_reduction(Value x, const std::string& name, std::optional<double> order, int dim,
                       const std::string& dim_text, bool keepdim);
  const Instruction& at(Value value) const;

  std::string name_;
  int length_, min_rank_;
  bool closed_ = false;
  uint64_t serial_ = 0; // while open: its entry among this thread's open recordings (0: never opened)
  std::vector<Instruction> program_;
  std::map<std::tuple<Code, std::vector<Value>, std::string, uint64_t>, Value> interned_;
  std::map<std::string, Holds> lists_;  // the holds of each list, by slot
  std::map<Value, Value> norm_squares_; // a 2-norm's sum of squares, by the norm's value
};

} // namespace optjit
