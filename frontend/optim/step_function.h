// compile_step: a plain step function over tensor lists, traced and compiled like an optimizer's step, the form of
// PyTorch's foreach_map and of functional optimizers. The function writes the update with the foreach vocabulary
// (frontend/trace/foreach.h) on the lists by name; optjit traces it once, compiles it to as few kernels as the data
// allows and returns a guarded callable: a changed dtype or device recompiles, a changed shape or a replaced buffer
// rebinds (kernels read shapes from their argument tables), and hyperparameters are arguments (set_hyper never
// recompiles).
//
//   auto step = optjit::compile_step("signum", [](optjit::Tracer& t) {
//         optjit::Sym m = t.tensors("momentum_buffer") * t.hyper("beta") + t.tensors("grad") * (1.0 - t.hyper("beta"));
//         t.store("momentum_buffer", m);
//         t.store("param", optjit::foreach_add(t.tensors("param"), optjit::sign(m), -t.hyper("lr")));
//       },
//       {.params = params, .state = {{"momentum_buffer", buffers}}, .hypers = {{"lr", 0.01}, {"beta", 0.9}}});
//   step();                       // in place on params and buffers
//   step.set_hyper("lr", 0.005);  // no recompile
//
// Rows and columns state (`rows`, `cols`) reads at each element as its row's or column's value and takes the
// per-row or per-column values row_sum and col_sum give (frontend/trace/foreach.h): Adafactor's factored moments.
// The lists are the caller's tensors, used in place and held by the step. The grads are the params' own (a grad
// that is None skips its param, as in an optimizer step), or `grads`, which become the params' grads.
#pragma once

#include "compiler/compiled_step.h"
#include "frontend/optim/optimizer.h"
#include "frontend/trace/foreach.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace optjit {

struct StepLists {
  std::vector<Tensor> params;                                       // slot "param", updated in place
  std::vector<Tensor> grads;                                        // slot "grad"; empty: the params' own grads
  std::vector<std::pair<std::string, std::vector<Tensor>>> state;   // per element: one tensor like each param
  std::vector<std::pair<std::string, std::vector<Tensor>>> scalars; // per tensor: one 1-element tensor per param
  std::vector<std::pair<std::string, std::vector<Tensor>>> rows;    // per row: [..., m, 1] for a param [..., m, n]
  std::vector<std::pair<std::string, std::vector<Tensor>>> cols;    // per column: [..., 1, n] for a param [..., m, n]
  std::map<std::string, double> hypers;                             // read at every step
};

using StepFunctionBody = std::function<void(Tracer&)>;

class StepFunction {
public:
  StepFunction(StepFunction&&) noexcept;
  StepFunction& operator=(StepFunction&&) noexcept;
  ~StepFunction();

  void operator()(); // one step over the lists (compiles on the first call, and again when a guard fails)
  // A hyperparameter the function reads (any number, inf and NaN too, as torch's ops take them); an unknown name is an
  // error.
  void set_hyper(const std::string& name, double value);
  int kernel_count();
  int library_call_count(); // matrix products per step in the matrix library (CompiledStep's)
  std::string dump(Stage stage, int gpu_sm = 0);
  const StepMetrics& metrics() const;

private:
  friend StepFunction compile_step(std::string name, StepFunctionBody body, StepLists lists, CompileOptions options);
  struct State;
  explicit StepFunction(std::unique_ptr<State> state);
  State& live() const; // throws when moved from
  std::unique_ptr<State> state_;
};

// Checks the lists (one tensor per param in every list, state shaped like its param, scalars of one element, rows
// and columns state of params of rank >= 2, no hyperparameter named as optjit's own, a name that is an identifier)
// and returns the step; it traces and compiles on its first call. Throws optjit::Error naming the list and the rule.
StepFunction compile_step(std::string name, StepFunctionBody body, StepLists lists, CompileOptions options = {});

// Throws optjit::Error naming two tensors of the lists that share an element (one tensor in two lists, or views that
// overlap): a compiled step reads them all before it writes any, where torch's ops would see each other's writes.
// compile_step checks its lists; a caller that gives the params new grads checks the lists with them again.
void check_distinct_memory(const std::string& name, const StepLists& lists);

} // namespace optjit
