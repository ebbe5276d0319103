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
  // a @ b: the outer product of a column of rows and a row of columns, [..., m, 1] @ [..., 1, n], Adafactor's; an
  // operand that is not an element value is absent.
  Value outer(std::optional<Value> a, std::optional<Value> b);

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
  };

  Value emit(Code code, std::vector<Value> inputs, std::string name = "", double number = 0,
             std::optional<Holds> holds = std::nullopt);
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
