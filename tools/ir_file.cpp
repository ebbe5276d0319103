#include "tools/ir_file.h"
#include "compiler/backend.h"
#include "compiler/pipeline.h"
#include "compiler/target.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/error.h"
#include "tools/cli_text.h"
#include "tools/model.h"
#include "tools/text_file.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace optjit {
namespace {

// The shape of a rows or columns slot for a param of `shape` ([..., m, 1] or [..., 1, n]).
Shape axis_slot_shape(const Slot& slot, Shape shape) {
  if (shape.size() < 2)
    throw Error(fmt::format("slot '{}' holds the {} of params of shape [..., m, n]: give params of rank 2 or more "
                            "with --params (such as 4x3)",
                            slot.name, slot.kind == SlotKind::Rows ? "rows" : "columns"));
  shape[shape.size() - (slot.kind == SlotKind::Rows ? 1 : 2)] = 1;
  return shape;
}

// The tensors of every slot for `shapes`: params and grads random (from `seed`), state zero; each in its slot's
// dtype, a scalar slot one element per tensor, a rows or columns slot one per row or column.
ListArguments make_arguments(const Graph& graph, const std::vector<Shape>& shapes, const KeywordOptions& hypers,
                             uint64_t seed) {
  ListArguments args;
  // The hyperparameters first: a missing --set is refused before the tensors are made (they may be gigabytes).
  const std::vector<std::string> read = signature_of(graph).hypers;
  for (const auto& [name, values] : hypers)
    if (std::find(read.begin(), read.end(), name) == read.end())
      throw Error(fmt::format("--set {}: the graph reads no hyperparameter of that name (it reads: {})", name,
                              read.empty() ? std::string("none") : fmt::format("{}", fmt::join(read, ", "))));
  for (const std::string& name : read) {
    auto it = hypers.find(name);
    if (it == hypers.end() || it->second.size() != 1)
      throw Error(
          fmt::format("the graph reads hyperparameter '{}': give it one value with --set {}=VALUE", name, name));
    args.hyper_names.push_back(name);
    args.hyper.push_back(it->second[0]);
  }
  const std::vector<Tensor> random = random_params(shapes, Dtype::f64, seed);
  for (const Slot& slot : graph.slots) {
    std::vector<Tensor> tensors;
    for (const Tensor& r : random) {
      if (slot.kind == SlotKind::Scalar)
        tensors.push_back(Tensor::zeros({}, slot.dtype));
      else if (slot.role == SlotRole::Param)
        tensors.push_back(r.to(slot.dtype));
      else if (slot.role == SlotRole::Grad)
        tensors.push_back(r.grad().to(slot.dtype));
      else if (slot.kind == SlotKind::Rows || slot.kind == SlotKind::Cols)
        tensors.push_back(Tensor::zeros(axis_slot_shape(slot, r.shape()), slot.dtype));
      else
        tensors.push_back(Tensor::zeros(r.shape(), slot.dtype));
    }
    args.slot_names.push_back(slot.name);
    args.slot_tensors.push_back(std::move(tensors));
  }
  args.group_of.assign(shapes.size(), 0);
  args.shapes = shapes; // what kernels that walk rows and columns count them by
  return args;
}

// How close the compiled results must be to the interpreter's: LLVM may contract a * b + c into one rounding, which
// can move a stored value by one unit of its storage precision (bf16: 2^-8, f16: 2^-11).
double relative_tolerance(Dtype storage) { return storage == Dtype::bf16 ? 1e-2 : storage == Dtype::f16 ? 2e-3 : 1e-5; }
constexpr double kAtol = 1e-6;

// Deep copies of every slot's tensors.
ListArguments copy_of(const ListArguments& args) {
  ListArguments copy = args;
  for (std::vector<Tensor>& tensors : copy.slot_tensors)
    for (Tensor& t : tensors)
      t = t.clone();
  return copy;
}

} // namespace

Graph read_ir_file(const std::filesystem::path& file) {
  const std::string text = read_text_file(file, "IR file", kMaxIrFileBytes, "kMaxIrFileBytes");
  try {
    Graph graph = parse_graph(text);
    verify(graph);
    return graph;
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", file.string(), e.what()));
  }
}

// A graph must store something to be a step: one that stores nothing has no code to run or show.
void check_stores_something(const Graph& graph, const std::filesystem::path& file) {
  if (graph.stores.empty())
    throw Error(fmt::format("{}: the graph stores nothing, so there is nothing to run (a step stores its params or "
                            "its state)",
                            file.string()));
}

std::string dump_ir_file(const std::filesystem::path& file, Stage stage, int gpu_sm, Device device) {
  const Graph graph = read_ir_file(file);
  check_stores_something(graph, file);
  const PipelineResult pipeline = run_pipeline(graph);
  switch (stage) {
  case Stage::Traced:
    return print_graph(pipeline.traced);
  case Stage::Optimized:
    return print_graph(pipeline.optimized);
  case Stage::Fused:
    return print_fused(pipeline);
  case Stage::LLVM:
  case Stage::PTX: {
    // As dump of an optimizer: GPU code needs no GPU; without one the code is lowered for sm_80 (or --sm).
    const bool gpu = device.kind == DeviceKind::cuda || stage == Stage::PTX;
    const bool on_gpu = device.kind == DeviceKind::cuda && cuda::available();
    const int sm = gpu_sm ? gpu_sm : (gpu && !on_gpu) ? 80 : 0;
    const Target target =
        code_target(Target::for_device(on_gpu ? device : Device::cpu(), Execution::Compiled), stage, sm);
    return backend_for(target).code(pipeline, target, stage);
  }
  }
  return {};
}

int run_ir_file(const RunIrOptions& o) {
  if (o.steps < 1)
    throw Error(fmt::format("--steps is {}: run at least one step", o.steps));
  const Graph graph = read_ir_file(o.file);
  check_stores_something(graph, o.file);
  const std::vector<Shape> shapes = parse_shape_list(o.params);
  const ListArguments interpreted = make_arguments(graph, shapes, parse_keyword_options(o.set), o.seed);
  const ListArguments compiled = copy_of(interpreted);

  const auto start = std::chrono::steady_clock::now();
  const PipelineResult pipeline = run_pipeline(graph);
  const Target cpu = Target::for_device(Device::cpu(), Execution::Compiled);
  bool cache_hit = false;
  std::unique_ptr<Executable> executable = backend_for(cpu).load(pipeline, cpu, CompileOptions{}, cache_hit);
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  executable->bind(compiled);
  for (int step = 0; step < o.steps; ++step) {
    CarriedValues carried; // what the graph's own carry stores hand on (a norm pass's), read by no one here
    interpret(graph, interpreted, &carried);
    executable->launch();
  }

  int64_t elements = 0;
  for (const Shape& shape : shapes)
    elements += shape_numel(shape);
  std::printf("@%s: %d kernel%s, compiled in %.1f ms; %d steps over %zu tensors (%lld elements)\n", graph.name.c_str(),
              pipeline.stats.kernels, pipeline.stats.kernels == 1 ? "" : "s", compile_ms, o.steps, shapes.size(),
              static_cast<long long>(elements));
  bool agree = true;
  for (std::size_t s = 0; s < graph.slots.size(); ++s) {
    double worst = 0;
    bool ok = true;
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const std::vector<double> a = compiled.slot_tensors[s][t].to_vector();
      const std::vector<double> b = interpreted.slot_tensors[s][t].to_vector();
      for (std::size_t k = 0; k < a.size(); ++k) {
        if (a[k] == b[k]) // the same infinity too, whose difference is NaN
          continue;
        if (std::isnan(a[k]) || std::isnan(b[k])) {
          ok = ok && std::isnan(a[k]) && std::isnan(b[k]);
          continue;
        }
        worst = std::max(worst, std::fabs(a[k] - b[k]));
        ok = ok && std::fabs(a[k] - b[k]) <= kAtol + relative_tolerance(graph.slots[s].dtype) * std::fabs(b[k]);
      }
    }
    agree = agree && ok;
    std::printf("  %-20s compiled vs interpreted: max |difference| %.3g %s\n", graph.slots[s].name.c_str(), worst,
                ok ? "OK" : "DIFFERENT");
  }
  return agree ? 0 : 1;
}

} // namespace optjit
